"""Naming what the client sent when the chat template fails on it (docs/tokens.md "Start-up").

The template fails at a Chat message (core/tokens/template.py finds which), but the client
never sent Chat messages: it sent `instructions` and Responses input items, and the
translation (core/dialects/chat_request.py) turns several items into one message (an
assistant's text and its tool calls) and puts the instructions first. So the message is
translated back: to the instructions, or to the item it was made of, by its index in the
request's `input` or in the conversation's history, with its type and id.
"""

from __future__ import annotations

from .. import wire
from ..dialects.chat_request import messages as chat_messages
from ..dialects.chat_settings import ChatOptions
from .template import TemplateFailed


def named(
    exc: TemplateFailed,
    items: list[bytes],
    instructions: str | None,
    new_items: int,
    opts: ChatOptions,
) -> TemplateFailed:
    """The template's failure, naming what the client sent: the message it failed at is
    translated back to the input item it was made of (its index in the request's `input` or
    in the conversation's history, its type and id), or to the `instructions`."""
    if exc.culprit is None:
        return exc
    origins: list[tuple[int, int] | None] = []
    chat_messages(items, opts, None, instructions, origins=origins)
    if not 0 <= exc.culprit < len(origins):
        return exc
    origin = origins[exc.culprit]
    if origin is None:
        at = "the instructions"
    else:
        first, last = origin
        at = _item_name(items, first, new_items)
        if last > first:  # an assistant turn made of several items (text, calls)
            more = last - first
            at += f", one assistant turn with the {more} item{'s' if more > 1 else ''} after it"
    return TemplateFailed(
        f"chat template {exc.template} {exc.what} the conversation at {at}: {exc.why}",
        template=exc.template,
        culprit=exc.culprit,
        what=exc.what,
        why=exc.why,
    )


def _item_name(items: list[bytes], at: int, new_items: int) -> str:
    """'input[2] (function_call_output, id fco_1)', or 'item 5 of the conversation's
    history (...)'."""
    history = len(items) - min(max(new_items, 0), len(items))
    where = (
        f"input[{at - history}]" if at >= history else f"item {at} of the conversation's history"
    )
    try:
        item = wire.loads(items[at])
    except wire.JSONDecodeError:
        return where
    if not isinstance(item, dict):
        return where
    kind = item.get("type") or ("message" if "role" in item else None)
    shown = [str(kind)[:40]] if isinstance(kind, str) else []
    if kind == "message" and isinstance(item.get("role"), str):
        shown.append(f"role {str(item['role'])[:20]}")
    if isinstance(item.get("id"), str) and item["id"]:
        shown.append(f"id {item['id'][:80]}")
    return f"{where} ({', '.join(shown)})" if shown else where


__all__ = ["named"]

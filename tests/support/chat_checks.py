"""The ordering rule strict Chat Completions servers enforce on `messages`.

OpenAI's Chat API (and the chat templates of several open models) accept a `tool` message
only inside the group that follows an assistant message with `tool_calls`, answering one of
those calls, and want every call of that assistant message answered before any other
message comes. Tests run the Chat bodies wsmode builds through this check.
"""

from __future__ import annotations

from typing import Any


def tool_order_errors(messages: list[dict[str, Any]]) -> list[str]:
    """Every break of the rule above, as a readable line (empty: a strict server accepts it)."""
    errors: list[str] = []
    open_calls: set[str] = set()  # calls of the latest assistant message not yet answered
    in_group = False  # the previous message was that assistant message or one of its tools
    for i, msg in enumerate(messages):
        role = msg.get("role")
        if role == "tool":
            call_id = msg.get("tool_call_id")
            if not in_group:
                errors.append(f"messages[{i}]: a tool message not after assistant tool_calls")
            elif call_id not in open_calls:
                errors.append(f"messages[{i}]: tool_call_id {call_id!r} answers no open call")
            open_calls.discard(str(call_id))
            continue
        if open_calls:
            errors.append(f"messages[{i}]: {role} before the calls {sorted(open_calls)} answered")
        calls = (msg.get("tool_calls") or []) if role == "assistant" else []
        open_calls = {str(c.get("id")) for c in calls}
        in_group = bool(open_calls)
    if open_calls:
        errors.append(f"the calls {sorted(open_calls)} are never answered")
    return errors

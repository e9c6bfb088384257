"""The simulated model's Responses event stream, spec-complete (docs/protocol.md "Stream events",
docs/clients.md "What every client needs").

`response_events()` yields every event of one response in order, each with its
`sequence_number`, `output_index` and `content_index`, ending with a `response.completed`
whose response object carries every finished output item and the usage. A text answer
longer than the request's `max_output_tokens` is cut there and ends `response.incomplete`
(reason `max_output_tokens`), as the API does.

`echo="partial"` writes the response objects some stateless servers write instead: the
request's `tools` and `reasoning` echoed as sent, usage without its details, and nothing
else of the settings.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator
from typing import Any

from ..core.api_objects import response_object, usage_of
from ..core.ids import new_id
from .model import Plan


def partial_response(resp: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    """`resp` as a server that echoes little would write it."""
    keep = ("id", "object", "created_at", "status", "model", "output", "error")
    out = {k: resp[k] for k in keep}
    out.update(tools=body.get("tools", []), reasoning=body.get("reasoning"))
    usage = resp.get("usage")
    if isinstance(usage, dict):
        out["usage"] = {k: usage[k] for k in ("input_tokens", "output_tokens", "total_tokens")}
    if resp.get("incomplete_details") is not None:
        out["incomplete_details"] = resp["incomplete_details"]
    return out


def response_events(
    body: dict[str, Any], plan: Plan, *, echo: str = "full", cached: int = 0
) -> Iterator[dict[str, Any]]:
    """`cached`: the prompt tokens the prefix cache held, reported in the usage."""
    for ev in _events(body, plan, cached):
        if echo == "partial" and isinstance(ev.get("response"), dict):
            ev["response"] = partial_response(ev["response"], body)
        yield ev


def _events(body: dict[str, Any], plan: Plan, cached: int) -> Iterator[dict[str, Any]]:
    seq = 0

    def ev(kind: str, **fields: Any) -> dict[str, Any]:
        nonlocal seq
        out = {"type": kind, "sequence_number": seq, **fields}
        seq += 1
        return out

    rid = new_id("resp")
    now = int(time.time())
    resp = response_object(response_id=rid, request=body, status="in_progress", created_at=now)
    yield ev("response.created", response=resp)
    yield ev("response.in_progress", response=resp)
    call = plan.tool_call
    cut = False  # the text reached max_output_tokens
    if call is not None:
        item_id = new_id("fc")
        item: dict[str, Any] = {
            "id": item_id,
            "type": "function_call",
            "status": "in_progress",
            "call_id": call.call_id,
            "name": call.name,
            "arguments": "",
        }
        yield ev("response.output_item.added", output_index=0, item=dict(item))
        for piece in call.pieces:
            yield ev(
                "response.function_call_arguments.delta",
                item_id=item_id,
                output_index=0,
                delta=piece,
            )
        yield ev(
            "response.function_call_arguments.done",
            item_id=item_id,
            output_index=0,
            name=call.name,
            arguments=call.arguments,
        )
        item.update(status="completed", arguments=call.arguments)
        output_tokens = len(call.pieces)
        yield ev("response.output_item.done", output_index=0, item=item)
        output = [item]
    else:
        # the text, split evenly over `plan.items` assistant messages (one by default)
        all_tokens = plan.tokens
        limit = body.get("max_output_tokens")
        if isinstance(limit, int) and 0 < limit < len(all_tokens):
            all_tokens, cut = all_tokens[:limit], True
        n = max(1, min(plan.items, len(all_tokens)))
        size = -(-len(all_tokens) // n)
        output = []
        for index in range(n):
            tokens = all_tokens[index * size : (index + 1) * size]
            item = yield from _message(ev, index, tokens, "incomplete" if cut else "completed")
            output.append(item)
        output_tokens = len(all_tokens)
    final = {
        **resp,
        "status": "incomplete" if cut else "completed",
        "completed_at": None if cut else int(time.time()),
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "output": output,
        "usage": usage_of(plan.input_tokens, output_tokens, cached=cached),
    }
    yield ev("response.incomplete" if cut else "response.completed", response=final)


def _message(
    ev: Callable[..., dict[str, Any]], index: int, tokens: list[str], status: str
) -> Generator[dict[str, Any], None, dict[str, Any]]:
    """The events of one assistant message at `output_index` `index`; returns the item."""
    item_id = new_id("msg")
    item: dict[str, Any] = {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "status": "in_progress",
        "content": [],
    }
    at = {"item_id": item_id, "output_index": index, "content_index": 0}
    yield ev("response.output_item.added", output_index=index, item=dict(item))
    part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    yield ev("response.content_part.added", **at, part=part)
    for token in tokens:
        yield ev("response.output_text.delta", **at, delta=token, logprobs=[])
    text = "".join(tokens)
    yield ev("response.output_text.done", **at, text=text, logprobs=[])
    done_part = {**part, "text": text}
    yield ev("response.content_part.done", **at, part=done_part)
    item.update(status=status, content=[done_part])
    yield ev("response.output_item.done", output_index=index, item=item)
    return item

"""The simulated model's Responses event stream, spec-complete (PROTOCOL 3.1, CLIENTS 0.4).

`response_events()` yields every event of one response in order, each with its
`sequence_number`, `output_index` and `content_index`, ending with a `response.completed`
whose response object carries every finished output item and the usage.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from proxy.core.events import response_object
from proxy.core.ids import new_id
from proxy.sim.model import Plan


def response_events(body: dict[str, Any], plan: Plan) -> Iterator[dict[str, Any]]:
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
    else:
        item_id = new_id("msg")
        item = {
            "id": item_id,
            "type": "message",
            "role": "assistant",
            "status": "in_progress",
            "content": [],
        }
        yield ev("response.output_item.added", output_index=0, item=dict(item))
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        yield ev(
            "response.content_part.added",
            item_id=item_id,
            output_index=0,
            content_index=0,
            part=part,
        )
        for token in plan.tokens:
            yield ev(
                "response.output_text.delta",
                item_id=item_id,
                output_index=0,
                content_index=0,
                delta=token,
                logprobs=[],
            )
        text = "".join(plan.tokens)
        yield ev(
            "response.output_text.done",
            item_id=item_id,
            output_index=0,
            content_index=0,
            text=text,
            logprobs=[],
        )
        done_part = {**part, "text": text}
        yield ev(
            "response.content_part.done",
            item_id=item_id,
            output_index=0,
            content_index=0,
            part=done_part,
        )
        item.update(status="completed", content=[done_part])
        output_tokens = len(plan.tokens)
    yield ev("response.output_item.done", output_index=0, item=item)
    usage = {
        "input_tokens": plan.input_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": plan.input_tokens + output_tokens,
    }
    final = {
        **resp,
        "status": "completed",
        "completed_at": int(time.time()),
        "output": [item],
        "usage": usage,
    }
    yield ev("response.completed", response=final)

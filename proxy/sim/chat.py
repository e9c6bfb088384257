"""The simulated model's Chat Completions endpoint: `POST /v1/chat/completions`.

The same model as `/v1/responses` (sim/model.py): the messages are read back into the items
they stand for, so the answer is decided the same way and the tool arguments' `n` counts
those items (a message with text and two tool calls is three items, as in Responses), which
lets a test prove the proxy sent the whole conversation.

The stream is what OpenAI-compatible servers send (docs/protocol.md "Chat Completions upstreams"):
data-only SSE chunks, a first chunk with the role, reasoning deltas in `reasoning_content` when the
request sets `reasoning_effort`, one chunk per text token, tool calls opened by a fragment with id,
type and name and continued by argument fragments, a finish chunk, a usage chunk (`choices: []`)
when `stream_options.include_usage` is set, then `data: [DONE]`. `max_tokens` cuts the text
with `finish_reason: "length"`.

Directives and faults come from the sim's queue (`POST /sim/faults`), one per request:
`status:N`, `cut:N`, `stall:N`, `error:N` (an error chunk), `eof:N` (the body ends, no finish,
no [DONE]) after N chunks; and `finish:REASON` (force a finish_reason), `nousage`, `nodone`,
`parallel:N` (N tool calls whose fragments interleave).

With the prefix cache on (sim/app.py), the messages' items are what the cache sees, and the
usage reports the tokens it held in `prompt_tokens_details.cached_tokens`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from aiohttp import web

from ..core import wire
from ..core.ids import new_id
from .http import error, inject_fault, read_request
from .model import Plan, ToolCall, count_tokens, plan

if TYPE_CHECKING:
    from .state import SimState

_REASONING = ["Let", " me", " think", "."]


def items_from_messages(messages: Any) -> list[dict[str, Any]]:
    """The Responses items a Chat message list stands for."""
    items: list[dict[str, Any]] = []
    for m in messages if isinstance(messages, list) else []:
        if not isinstance(m, dict):
            continue
        role = m.get("role")
        if role == "tool":
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": m.get("tool_call_id"),
                    "output": m.get("content"),
                }
            )
        elif role == "assistant":
            if m.get("content"):
                items.append({"type": "message", "role": "assistant", "content": m["content"]})
            for tc in m.get("tool_calls") or []:
                fn = tc.get("function") or {}
                items.append(
                    {
                        "type": "function_call",
                        "call_id": tc.get("id"),
                        "name": fn.get("name"),
                        "arguments": fn.get("arguments"),
                    }
                )
        else:
            items.append({"type": "message", "role": role, "content": m.get("content")})
    return items


def responses_view(body: dict[str, Any]) -> dict[str, Any]:
    """The Chat request seen as a Responses request, for `plan()`."""
    tools = []
    for t in body.get("tools") or []:
        fn = t.get("function") if isinstance(t, dict) else None
        if isinstance(fn, dict) and fn.get("name"):
            tools.append({"type": "function", "name": fn["name"]})
    choice = body.get("tool_choice", "auto")
    if isinstance(choice, dict):
        choice = {"type": "function", "name": (choice.get("function") or {}).get("name")}
    return {
        "input": items_from_messages(body.get("messages")),
        "tools": tools,
        "tool_choice": choice,
    }


def _chunk(cid: str, model: str, delta: dict[str, Any], finish: str | None = None) -> bytes:
    doc = {
        "id": cid,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }
    return b"data: " + wire.dumps(doc) + b"\n\n"


def _calls(p: Plan, parallel: int) -> list[ToolCall]:
    call = p.tool_call
    if call is None:
        return []
    return [
        ToolCall(
            call.name, f"{call.call_id}_{i}" if i else call.call_id, call.arguments, call.pieces
        )
        for i in range(max(1, parallel))
    ]


def _limited(body: dict[str, Any], p: Plan, calls: list[ToolCall]) -> tuple[list[str], str]:
    """The text tokens sent and the finish reason (`max_tokens` cuts the text)."""
    tokens = list(p.tokens)
    limit = body.get("max_tokens")
    if isinstance(limit, int) and not calls and len(tokens) > limit:
        return tokens[:limit], "length"
    return tokens, "tool_calls" if calls else "stop"


def answer_items(body: dict[str, Any], p: Plan, parallel: int = 1) -> list[dict[str, Any]]:
    """The answer as the items the next turn's messages will stand for."""
    calls = _calls(p, parallel)
    tokens, _ = _limited(body, p, calls)
    message: dict[str, Any] = {"role": "assistant", "content": "".join(tokens)}
    message["tool_calls"] = [
        {"id": c.call_id, "function": {"name": c.name, "arguments": c.arguments}} for c in calls
    ]
    return items_from_messages([message])


def chunks(
    body: dict[str, Any], p: Plan, directives: dict[str, str], cached: int = 0
) -> Iterator[tuple[bytes, bool]]:
    """(SSE bytes, whether it is a token) for the whole stream; `cached`: the prompt tokens
    the prefix cache held."""
    cid = "chatcmpl-" + new_id("sim")[4:]
    model = str(body.get("model") or "sim")
    yield _chunk(cid, model, {"role": "assistant", "content": ""}), False
    effort = body.get("reasoning_effort")
    if isinstance(effort, str) and effort not in ("none", "minimal"):
        for thought in _REASONING:
            yield _chunk(cid, model, {"reasoning_content": thought}), True
    calls = _calls(p, int(directives.get("parallel", "1") or 1))
    tokens, finish = _limited(body, p, calls)
    for token in tokens:
        yield _chunk(cid, model, {"content": token}), True
    for i, call in enumerate(calls):
        opening = {"index": i, "id": call.call_id, "type": "function"}
        opening["function"] = {"name": call.name, "arguments": ""}
        yield _chunk(cid, model, {"tool_calls": [opening]}), False
    half = [len(c.arguments) // 2 for c in calls]
    for piece in range(2):  # fragments of every call, interleaved
        for i, call in enumerate(calls):
            args = call.arguments[: half[i]] if piece == 0 else call.arguments[half[i] :]
            frag = {"index": i, "function": {"arguments": args}}
            yield _chunk(cid, model, {"tool_calls": [frag]}), True
    yield _chunk(cid, model, {}, directives.get("finish") or finish), False
    options = body.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage") and "nousage" not in directives:
        out = len(tokens) + sum(max(1, len(c.arguments) // 4) for c in calls)
        usage = {
            "prompt_tokens": p.input_tokens,
            "completion_tokens": out,
            "total_tokens": p.input_tokens + out,
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        doc = {"id": cid, "object": "chat.completion.chunk", "created": int(time.time())}
        doc.update(model=model, choices=[], usage=usage)
        yield b"data: " + wire.dumps(doc) + b"\n\n", False
    if "nodone" not in directives:
        yield b"data: [DONE]\n\n", False


def completion(body: dict[str, Any], p: Plan, cached: int | None = None) -> dict[str, Any]:
    """The non-streaming answer; `cached` (with the prefix cache on) goes in its usage."""
    message: dict[str, Any] = {"role": "assistant", "content": "".join(p.tokens) or None}
    if p.tool_call is not None:
        fn = {"name": p.tool_call.name, "arguments": p.tool_call.arguments}
        message["tool_calls"] = [{"id": p.tool_call.call_id, "type": "function", "function": fn}]
    out = len(p.tokens) or 1
    usage: dict[str, Any] = {
        "prompt_tokens": p.input_tokens,
        "completion_tokens": out,
        "total_tokens": p.input_tokens + out,
    }
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return {
        "id": "chatcmpl-" + new_id("sim")[4:],
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model"),
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if p.tool_call else "stop",
            }
        ],
        "usage": usage,
    }


_ERROR_CHUNK = (
    b"data: "
    + wire.dumps({"error": {"message": "simulated mid-stream error", "type": "server_error"}})
    + b"\n\n"
)


async def chat_completions(request: web.Request, state: SimState) -> web.StreamResponse:
    cfg = state.settings
    body = await read_request(request, state)
    if isinstance(body, web.Response):
        return body
    if not isinstance(body.get("model"), str) or not isinstance(body.get("messages"), list):
        return error(400, "'model' and 'messages' are required.", "missing_required_parameter")
    fault = state.faults.popleft() if state.faults else ""
    kind, _, arg = fault.partition(":")
    if kind == "status":
        code = int(arg or 500)
        return error(code, f"simulated upstream failure {code}", "server_error")
    directives = {kind: arg} if kind else {}
    after = int(arg) if arg.isdigit() else 3
    view = responses_view(body)
    if cfg.tokenize_us_per_token > 0:  # a real server tokenises the whole rendered history
        state.tokenizing(count_tokens(view))
    p = plan(
        view,
        seed=cfg.seed,
        output_tokens=cfg.output_tokens,
        tool_calls_per_turn=cfg.tool_calls_per_turn,
    )
    prefilled = await state.prefill(None, view["input"])
    cached = prefilled.cached if state.prefix_cache is not None else None
    parallel = int(directives.get("parallel", "1") or 1)
    if body.get("stream") is not True:
        state.answered(prefilled, answer_items(body, p))
        state.completed += 1
        answer = completion(body, p, cached)
        return web.json_response(answer, dumps=lambda o: wire.dumps(o).decode())
    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    with state.streaming():
        await resp.prepare(request)
        t0 = time.monotonic()
        token = 0
        for i, (data, is_token) in enumerate(chunks(body, p, directives, prefilled.cached)):
            if kind in ("cut", "stall", "error", "eof") and i == after:
                return await inject_fault(kind, request, resp, data, _ERROR_CHUNK)
            if is_token:
                due = t0 + cfg.ttft_ms / 1000
                due += token / cfg.tokens_per_second if cfg.tokens_per_second else 0
                token += 1
                delay = due - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
            await resp.write(data)
        state.answered(prefilled, answer_items(body, p, parallel))
        state.completed += 1
        return resp

"""The simulated model server: stateless `POST /v1/responses` and `/v1/chat/completions`.

Like the model servers wsmode fronts, it keeps no state: a `previous_response_id` gets the
400 `previous_response_not_found` a stateless server gives, so any test that chains through
the proxy proves the proxy rebuilt the history. Timing (time to first token, tokens per
second) and output length are configurable; output is deterministic for a seed.

Faults, for fault tests and the soak script, come from `metadata.sim_fault` on a request or
from a queue filled with `POST /sim/faults {"faults": [...]}` (one per following request):
`status:503` (HTTP error before the stream), `cut:N` (after N events, half an event, then
the connection drops), `stall:N` (after N events, silence until the client leaves),
`error:N` (an SSE `error` event after N events), `eof:N` (the stream ends after N events
with no terminal event) and `failed:CODE` (after 3 events, a `response.failed` terminal whose
`error.code` is CODE: the upstream's own failure, with no `error` event).

`context_window` (tokens, 0 = unlimited) makes it refuse, like a real server, a request
whose input does not fit: 400 `context_length_exceeded`. `POST /tokenize` answers like
llama.cpp's (`{"content": ...}` -> `{"tokens": [...]}`) with the same tokenizer. The token
endpoints of llama.cpp, vLLM and SGLang (`/completion`, `/inference/v1/generate`,
`/generate` and their tokenize and info routes) are in sim/tokens.py and sim/token_apis.py.
Writes: with `tokens_per_second` above 0 every event is its own write, paced as configured;
at 0 the events are joined into writes of up to 64 KiB. For latency benchmarks,
`metadata.sim_stamp: "true"` adds `sim_sent_ns` (CLOCK_MONOTONIC, ns) to every event, taken just
before it is serialised and written, `metadata.sim_output_tokens: "N"` overrides
`output_tokens` for that request, and `metadata.sim_tokens_per_second: "N"` its pacing (0: as
fast as possible), so that one process serves paced and unpaced benchmark streams.
`metadata.sim_echo: "partial"` makes the response objects those of a server that echoes
little (`events.partial_response`).
`metadata.sim_cached_tokens: "N"` makes the terminal usage report N of the input tokens (at
most all of them) as served from a prompt cache (`input_tokens_details.cached_tokens`).
With `tokenize_us_per_token` above 0 a request pays that CPU per token of its whole input
before it answers, as a server that renders and tokenises the whole history every turn does
(the Chat endpoint and the token endpoints pay the same per token, sim/tokens.py), unless
its `metadata.sim_untimed` is "true": a turn a benchmark sends before its clock, which is
also answered at once (no time to first token, no pacing).

Prefix cache (sim/prefix_cache.py, off by default): with `prefix_cache_tokens` above 0 each
process keeps an LRU of prompt blocks and reports the tokens found there as cached in the
usage; with `prefill_tokens_per_second` above 0 a request waits, before anything is written,
for its uncached tokens to be prefilled at that speed, one request at a time per process (a
replica's prefill is one shared resource). `GET /sim/stats` adds the cache's totals.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from ..core import wire
from .chat import chat_completions
from .events import response_events
from .http import error, inject_fault, read_request
from .model import count_tokens, input_items, plan
from .prefix_cache import PrefixCache
from .settings import SimSettings

# The state lives in sim/state.py, which the endpoints' helpers import without this module;
# it stays importable from here, where the tests and the fuzz harness take it.
from .state import SIM_STATE as SIM_STATE
from .state import SimState as SimState
from .token_apis import add_vllm_sglang_routes, model_card
from .tokens import add_llamacpp_routes

_DELTAS = frozenset({"response.output_text.delta", "response.function_call_arguments.delta"})
# With tokens_per_second = 0 the stream is written as fast as possible: events are joined into
# writes of about this size, as a fast server's socket buffer would carry them.
_BATCH_BYTES = 64 * 1024


def _sse(ev: dict[str, Any]) -> bytes:
    kind: str = ev["type"]
    return b"event: " + kind.encode() + b"\ndata: " + wire.dumps(ev) + b"\n\n"


async def _responses(request: web.Request) -> web.StreamResponse:
    state = request.app[SIM_STATE]
    cfg = state.settings
    body = await read_request(request, state)
    if isinstance(body, web.Response):
        return body
    if body.get("previous_response_id"):
        rid = body["previous_response_id"]
        return error(
            400,
            f"Previous response with id '{rid}' not found.",
            "previous_response_not_found",
            "previous_response_id",
        )
    if not isinstance(body.get("model"), str):
        return error(
            400, "Missing required parameter: 'model'.", "missing_required_parameter", "model"
        )
    if cfg.context_window:
        needed = count_tokens(body)
        if needed > cfg.context_window:
            return error(
                400,
                f"This model's maximum context length is {cfg.context_window} tokens; the "
                f"input has {needed} tokens.",
                "context_length_exceeded",
                "input",
            )
    meta = body.get("metadata")
    if not isinstance(meta, dict):
        meta = {}
    # a real server tokenises the whole rendered history; a turn a benchmark does not time
    # (`sim_untimed`) is not charged for it, nor for a time to first token or pacing, so
    # that setting up a conversation is quick
    untimed = str(meta.get("sim_untimed")).lower() == "true"
    if cfg.tokenize_us_per_token > 0 and not untimed:
        state.tokenizing(count_tokens(body))
    fault = str(meta.get("sim_fault") or (state.faults.popleft() if state.faults else ""))
    kind, _, arg = fault.partition(":")
    if kind == "status":
        code = int(arg or 500)
        return error(code, f"simulated upstream failure {code}", "server_error")
    after = int(arg) if arg.isdigit() else 3

    prefilled = await state.prefill(body.get("instructions"), input_items(body))
    tokens = str(meta.get("sim_output_tokens") or "")  # metadata values are strings in the API
    p = plan(
        body,
        seed=cfg.seed,
        output_tokens=int(tokens) if tokens.isdigit() and int(tokens) > 0 else cfg.output_tokens,
        tool_calls_per_turn=cfg.tool_calls_per_turn,
        output_items=cfg.output_items,
    )
    if body.get("stream") is not True:
        # non-streaming: the terminal response object, as the HTTP API returns it
        final = list(response_events(body, p, cached=prefilled.cached))[-1]["response"]
        state.answered(prefilled, final.get("output"))
        state.completed += 1
        return web.Response(body=wire.dumps(final), content_type="application/json")
    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    stamp = str(meta.get("sim_stamp")).lower() == "true"
    tps = _number(meta.get("sim_tokens_per_second"), cfg.tokens_per_second)
    paced = tps > 0 and not untimed
    with state.streaming():
        await resp.prepare(request)
        t0 = time.monotonic()
        token = 0
        pending: list[bytes] = []  # unpaced: events written together, up to _BATCH_BYTES
        size = 0
        current: dict[str, Any] = {}  # the response object of the latest lifecycle event
        echo = str(meta.get("sim_echo") or "full")  # "partial": a server that echoes little
        cached = str(meta.get("sim_cached_tokens") or "")
        events = response_events(body, p, echo=echo, cached=prefilled.cached)
        for i, ev in enumerate(events):
            if kind == "failed" and i == after:
                pending += (_sse(_failed_event(ev, current, arg)), b"data: [DONE]\n\n")
                await resp.write(b"".join(pending))
                return resp
            if kind and i == after:
                if pending:
                    await resp.write(b"".join(pending))
                return await inject_fault(kind, request, resp, _sse(ev), _error_event(ev))
            if ev["type"] in _DELTAS and not untimed:
                due = t0 + cfg.ttft_ms / 1000 + (token / tps if paced else 0)
                token += 1
                delay = due - time.monotonic()
                if delay > 0:
                    if pending:
                        await resp.write(b"".join(pending))
                        pending, size = [], 0
                    await asyncio.sleep(delay)
            if isinstance(ev.get("response"), dict):
                current = ev["response"]
                if cached.isdigit() and isinstance(current.get("usage"), dict):
                    _report_cached(current["usage"], int(cached))
            if stamp:
                ev["sim_sent_ns"] = time.monotonic_ns()
            data = _sse(ev)
            if paced:
                await resp.write(data)  # token-paced: one event per write, as a model server
                continue
            pending.append(data)
            size += len(data)
            if size >= _BATCH_BYTES:
                await resp.write(b"".join(pending))
                pending, size = [], 0
        pending.append(b"data: [DONE]\n\n")
        await resp.write(b"".join(pending))
        state.answered(prefilled, current.get("output"))
        state.completed += 1
        return resp


def _number(value: Any, default: float) -> float:
    """A metadata value (a string, in the API) as a number of at least 0; else `default`."""
    try:
        number = float(value) if isinstance(value, str) else default
    except ValueError:
        return default
    return number if number >= 0 else default


def _report_cached(usage: dict[str, Any], cached: int) -> None:
    details = usage.setdefault("input_tokens_details", {})
    details["cached_tokens"] = min(cached, int(usage.get("input_tokens") or 0))


def _failed_event(ev: dict[str, Any], response: dict[str, Any], code: str) -> dict[str, Any]:
    """A `response.failed` terminal at `ev`'s place, its `error.code` `code`."""
    code = code or "server_error"
    error = {"code": code, "message": f"simulated response failure ({code})"}
    failed = {**response, "status": "failed", "error": error}
    return {"type": "response.failed", "sequence_number": ev["sequence_number"], "response": failed}


def _error_event(ev: dict[str, Any]) -> bytes:
    """The HTTP SSE `error` event (code and message at the top level) at `ev`'s place."""
    err = {
        "type": "error",
        "code": "server_error",
        "message": "simulated mid-stream error",
        "param": None,
        "sequence_number": ev["sequence_number"],
    }
    return _sse(err)


async def _moderations(request: web.Request) -> web.Response:
    """An OpenAI-compatible `POST /v1/moderations`: each input string is flagged (category
    `harassment`) when it contains `moderation_flag_word`. Bodies are kept for tests."""
    state = request.app[SIM_STATE]
    try:
        doc = wire.loads(await request.read())
    except wire.JSONDecodeError:
        return error(400, "We could not parse the JSON body of your request.", "invalid_json")
    given = doc.get("input") if isinstance(doc, dict) else None
    texts = [given] if isinstance(given, str) else given
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        return error(400, "Missing required parameter: 'input'.", "missing_required_parameter")
    state.moderations.append(doc)
    if state.settings.moderation_delay_ms > 0:
        await asyncio.sleep(state.settings.moderation_delay_ms / 1000)
    word = state.settings.moderation_flag_word.lower()
    results = []
    for text in texts:
        flagged = bool(word) and word in text.lower()
        results.append(
            {
                "flagged": flagged,
                "categories": {"harassment": flagged},
                "category_scores": {"harassment": 0.99 if flagged else 0.01},
            }
        )
    model = doc.get("model") or "omni-moderation-latest"
    return web.json_response({"id": "modr-sim", "model": model, "results": results})


async def _faults(request: web.Request) -> web.Response:
    doc = wire.loads(await request.read())
    faults = doc.get("faults", []) if isinstance(doc, dict) else []
    request.app[SIM_STATE].faults.extend(str(f) for f in faults)
    return web.json_response({"queued": len(request.app[SIM_STATE].faults)})


async def _stats(request: web.Request) -> web.Response:
    s = request.app[SIM_STATE]
    return web.json_response(
        {
            "started": s.started,
            "completed": s.completed,
            "cancelled": s.cancelled,
            "active": s.active,
            "requests": len(s.requests),
            "tokenize_calls": s.tokenize_calls,
            "tokenized_tokens": s.tokenized_tokens,
            "tokenize_ms": round(s.tokenize_ns / 1e6, 3),
            **_cache_stats(s.prefix_cache),
        }
    )


def _cache_stats(cache: PrefixCache | None) -> dict[str, Any]:
    if cache is None:
        return {}
    return {
        "prefix_cache": {
            "lookups": cache.lookups,
            "prompt_tokens": cache.prompt_tokens,
            "cached_tokens": cache.cached_tokens,
            "tokens": cache.tokens,
            "evictions": cache.evictions,
        }
    }


async def _models(request: web.Request) -> web.Response:
    cfg = request.app[SIM_STATE].settings
    return web.json_response({"object": "list", "data": [model_card(cfg)]})


@web.middleware
async def _record_headers(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.headers.get("User-Agent") != "wsmode-health-check":  # not the proxy's checks
        request.app[SIM_STATE].last_headers = dict(request.headers)
    return await handler(request)


async def _chat(request: web.Request) -> web.StreamResponse:
    return await chat_completions(request, request.app[SIM_STATE])


def create_sim_app(
    settings: SimSettings | None = None, *, responses: bool = True
) -> web.Application:
    """`responses=False` leaves out POST /v1/responses: a Chat-only server."""
    app = web.Application(client_max_size=1024**3, middlewares=[_record_headers])
    cfg = settings or SimSettings()
    app[SIM_STATE] = SimState(cfg)
    if responses:
        app.router.add_post("/v1/responses", _responses)
    app.router.add_post("/v1/chat/completions", _chat)
    app.router.add_get("/v1/models", _models)
    # the shared /tokenize and /detokenize, and each token server's routes (`token_server`)
    add_llamacpp_routes(app, llamacpp=cfg.token_server in ("all", "llamacpp"))
    add_vllm_sglang_routes(app, cfg)
    app.router.add_post("/v1/moderations", _moderations)
    app.router.add_post("/sim/faults", _faults)
    app.router.add_get("/sim/stats", _stats)
    app.router.add_get("/healthz", _stats)
    return app

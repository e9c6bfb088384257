"""The simulated model's vLLM and SGLang token endpoints, in the shapes their servers use
(proxy/core/tokens/vllm.py and sglang.py cite the sources). The generation, the vocabulary
and the slot cache are sim/tokens.py's; the tokenize endpoint is shared with llama.cpp's.

vLLM, `POST /inference/v1/generate`: `token_ids`, `sampling_params` (`max_tokens`, `stop`,
`logprobs`), `model` (must be "sim" when given), `stream`, `stream_options.include_usage`,
`output_mode` ("tokens" or "text", echoed on every answer; ignored, and not echoed, with
`vllm_output_mode` off, as a vLLM that predates it). Streamed: one chunk per token
with its id (and its text in "text" mode), the finish on the last one (a chunk with no ids
when nothing was generated), a usage chunk with no choices when asked for, then
`data: [DONE]`. The cached tokens are reported (`prompt_tokens_details.cached_tokens`, as
with `--enable-prompt-tokens-details`) in whole blocks of `prefix_cache_block_tokens`, the
way vLLM's block cache finds them. `GET /version` answers `{"version": ...}` as vLLM's
server does (wsmode's start-up probe asks it).

SGLang, `POST /generate`: `input_ids` (or `text`, tokenised with `<bos>` first),
`sampling_params` (`max_new_tokens`, default 128, `stop`), `return_logprob`, `stream`;
`session_id` and `rid` are accepted. Each streamed event is `{"text", "output_ids",
"meta_info"}`, everything so far unless `sglang_incremental_output` (SGLang's
`--incremental-streaming-output`) makes them deltas; the last carries `finish_reason`;
then `data: [DONE]`. `GET /get_model_info` and `GET /get_server_info` answer a few of the
real fields.

`token_server` makes the sim one of the three servers only, answering only the routes that
server has: vLLM (vllm/entrypoints/openai/api_server.py, serve/disagg/api_router.py) has
`/version`, `/tokenize`, `/detokenize` and, with `--enable-scale-out` (`vllm_scale_out`),
`/inference/v1/generate`, and no `/props` or `/get_model_info`; SGLang
(python/sglang/srt/entrypoints/http_server.py) has `/generate`, `/get_model_info`,
`/get_server_info`, `/tokenize`, `/detokenize`, and no `/props` or `/version`; llama.cpp
has its own (sim/tokens.py). Their OpenAI routes (`/v1/...`) stay.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from aiohttp import web

from ..core import wire
from . import vocab
from .http import read_request
from .settings import SimSettings
from .state import SIM_STATE
from .tokens import MODEL, Generation, encode, generate, pace, sse_response

# ------------------------------------------------------------------------------ vLLM


def _vllm_error(status: int, message: str, kind: str = "BadRequestError") -> web.Response:
    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return web.Response(status=status, body=wire.dumps(body), content_type="application/json")


def _stops(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    return [s for s in value if isinstance(s, str)] if isinstance(value, list) else []


def _vllm_logprobs(tokens: list[int], text: list[str] | None) -> dict[str, Any]:
    content = []
    for i, token in enumerate(tokens):
        name = text[i] if text is not None else f"token_id:{token}"
        entry = {"token": name, "logprob": -0.1, "bytes": None}
        content.append({**entry, "top_logprobs": [dict(entry)]})
    return {"content": content}


def _vllm_usage(prompt: int, gen: Generation, block: int) -> dict[str, Any]:
    n = len(gen.ids)
    usage: dict[str, Any] = {"prompt_tokens": prompt, "total_tokens": prompt + n}
    usage["completion_tokens"] = n
    cached = gen.cached // block * block
    if cached:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return usage


async def _vllm_generate(request: web.Request) -> web.StreamResponse:
    state = request.app[SIM_STATE]
    cfg = state.settings
    body = await read_request(request, state)
    if isinstance(body, web.Response):
        return body
    ids, params, model = body.get("token_ids"), body.get("sampling_params"), body.get("model")
    if not isinstance(ids, list) or not ids or not vocab.all_ints(ids) or min(ids) < 0:
        return _vllm_error(400, "token_ids must be a non-empty list of non-negative ids")
    if not isinstance(params, dict):
        return _vllm_error(400, "sampling_params is required")
    if model is not None and model != MODEL:
        return _vllm_error(404, f"The model `{model}` does not exist.", "NotFoundError")
    mode = body.get("output_mode") if cfg.vllm_output_mode else None  # older: ignored
    if mode not in (None, "tokens", "text"):
        return _vllm_error(400, f"unsupported output_mode {mode!r}")
    if (bad := vocab.out_of_range(ids)) is not None:
        return _vllm_error(400, f"Token id {bad} is out of vocabulary")
    limit = params.get("max_tokens")
    gen = generate(
        state, ids, limit=limit if wire.is_int(limit) else None, stop=_stops(params.get("stop"))
    )
    finish = "length" if gen.stop == "limit" else "stop"
    texts = gen.pieces if mode == "text" else None
    rid = f"generate-tokens-{body.get('request_id') or uuid.uuid4().hex}"
    echo = {"output_mode": mode} if mode is not None else {}
    usage = _vllm_usage(len(ids), gen, cfg.prefix_cache_block_tokens)
    with_probs = wire.is_int(params.get("logprobs"))
    if body.get("stream") is not True:
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish}
        choice["token_ids"] = gen.ids
        if texts is not None:
            choice["text"] = "".join(texts)
        if with_probs:
            choice["logprobs"] = _vllm_logprobs(gen.ids, texts)
        state.completed += 1
        doc = {"request_id": rid, "model": MODEL, "created": int(time.time()), **echo}
        doc.update(choices=[choice], usage=usage, prompt_logprobs=None, kv_transfer_params=None)
        return web.json_response(doc, dumps=lambda o: wire.dumps(o).decode())
    resp = sse_response()
    with state.streaming():
        await resp.prepare(request)
        t0 = time.monotonic()
        steps = [[t] for t in gen.ids] or [[]]  # nothing generated: the finish alone
        for i, step in enumerate(steps):
            await pace(cfg, t0, gen.steps[i] if i < len(gen.steps) else 0)
            last = i == len(steps) - 1
            choice = {"index": 0, "logprobs": None, "finish_reason": finish if last else None}
            choice["token_ids"] = step
            if texts is not None:
                choice["text"] = texts[i] if step else ""
            if with_probs:
                choice["logprobs"] = _vllm_logprobs(step, [texts[i]] if texts and step else None)
            chunk = {"request_id": rid, **echo, "choices": [choice], "usage": None}
            await resp.write(b"data: " + wire.dumps(chunk) + b"\n\n")
        options = body.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage") is True:
            chunk = {"request_id": rid, **echo, "choices": [], "usage": usage}
            await resp.write(b"data: " + wire.dumps(chunk) + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        state.completed += 1
        return resp


async def _vllm_version(request: web.Request) -> web.Response:
    """vLLM's `GET /version` (vllm/entrypoints/openai/api_server.py): the package version."""
    return web.json_response({"version": "0.0.0+wsmode-sim"})


# ------------------------------------------------------------------------------ SGLang


def _sglang_error(message: str) -> web.Response:
    body = {"error": {"message": message}}
    return web.Response(status=400, body=wire.dumps(body), content_type="application/json")


def _sglang_finish(gen: Generation, limit: int) -> dict[str, Any]:
    if gen.stop == "limit":
        return {"type": "length", "length": limit}
    return {"type": "stop", "matched": gen.word if gen.stop == "word" else vocab.EOS}


def _meta(rid: str, prompt: int, done: int, gen: Generation, finish: Any) -> dict[str, Any]:
    return {
        "id": rid,
        "finish_reason": finish,
        "prompt_tokens": prompt,
        "weight_version": "default",
        "num_retractions": 0,
        "reasoning_tokens": 0,
        "completion_tokens": done,
        "cached_tokens": gen.cached,
    }


async def _sglang_generate(request: web.Request) -> web.StreamResponse:
    state = request.app[SIM_STATE]
    cfg = state.settings
    body = await read_request(request, state)
    if isinstance(body, web.Response):
        return body
    ids, text = body.get("input_ids"), body.get("text")
    if isinstance(text, str) and ids is None:
        ids = encode(state, text, add_special=True, parse_special=True)
    if not isinstance(ids, list) or not vocab.all_ints(ids):
        return _sglang_error("Either text, input_ids or input_embeds should be provided.")
    if not ids:
        return _sglang_error("input_ids cannot be empty.")
    if (bad := vocab.out_of_range(ids)) is not None:
        return _sglang_error(f"The input_ids {bad} contains values out of vocabulary")
    params = body.get("sampling_params")
    params = params if isinstance(params, dict) else {}
    limit = params.get("max_new_tokens", 128)
    limit = limit if wire.is_int(limit) else 128
    gen = generate(state, ids, limit=limit, stop=_stops(params.get("stop")))
    rid = str(body.get("rid") or uuid.uuid4().hex)
    finish = _sglang_finish(gen, limit)
    probs = body.get("return_logprob") is True

    def event(upto: int, start: int) -> dict[str, Any]:
        """The answer after `upto` generated tokens, from token `start` on."""
        meta = _meta(rid, len(ids), upto, gen, finish if upto == len(gen.ids) else None)
        if probs:
            meta["output_token_logprobs"] = [[-0.1, t, None] for t in gen.ids[start:upto]]
        text = "".join(gen.pieces[start:upto])
        return {"text": text, "output_ids": gen.ids[start:upto], "meta_info": meta}

    if body.get("stream") is not True:
        state.completed += 1
        final = event(len(gen.ids), 0)
        final["meta_info"]["e2e_latency"] = 0.001
        return web.json_response(final, dumps=lambda o: wire.dumps(o).decode())
    resp = sse_response()
    with state.streaming():
        await resp.prepare(request)
        t0 = time.monotonic()
        for i in range(max(1, len(gen.ids))):
            await pace(cfg, t0, gen.steps[i] if i < len(gen.steps) else 0)
            upto = min(i + 1, len(gen.ids))
            doc = event(upto, i if cfg.sglang_incremental_output else 0)
            if upto == len(gen.ids):
                doc["meta_info"]["e2e_latency"] = time.monotonic() - t0
            await resp.write(b"data: " + wire.dumps(doc) + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        state.completed += 1
        return resp


async def _model_info(request: web.Request) -> web.Response:
    return web.json_response(
        {
            "model_path": MODEL,
            "tokenizer_path": MODEL,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
        }
    )


async def _server_info(request: web.Request) -> web.Response:
    cfg = request.app[SIM_STATE].settings
    return web.json_response(
        {
            "model_path": MODEL,
            "served_model_name": MODEL,
            "skip_tokenizer_init": False,
            "incremental_streaming_output": cfg.sglang_incremental_output,
            "context_length": cfg.context_window or None,
            "page_size": 1,
            "internal_states": [],
            "version": "wsmode-sim",
        }
    )


def add_vllm_sglang_routes(app: web.Application, cfg: SimSettings) -> None:
    """vLLM's routes (its generate endpoint only with `vllm_scale_out`) and SGLang's, as
    `token_server` says."""
    if cfg.token_server in ("all", "vllm"):
        if cfg.vllm_scale_out:
            app.router.add_post("/inference/v1/generate", _vllm_generate)
        app.router.add_get("/version", _vllm_version)
    if cfg.token_server in ("all", "sglang"):
        app.router.add_post("/generate", _sglang_generate)
        app.router.add_get("/get_model_info", _model_info)
        app.router.add_get("/get_server_info", _server_info)


def model_card(cfg: SimSettings) -> dict[str, Any]:
    """The model in `GET /v1/models`, as the server `token_server` names lists it: llama.cpp
    (and "all") with its vocabulary in `meta.n_vocab`; vLLM
    (`ModelCard` in vllm/entrypoints/openai/protocol.py) and SGLang (http_server.py
    `available_models`) with `root` and `max_model_len` and no vocabulary."""
    card: dict[str, Any] = {"id": MODEL, "object": "model", "created": 0}
    if cfg.token_server in ("all", "llamacpp"):
        return card | {"owned_by": "wsmode", "meta": {"n_vocab": vocab.VOCAB_SIZE}}
    card |= {"owned_by": cfg.token_server, "root": MODEL, "max_model_len": _context(cfg)}
    if cfg.token_server == "vllm":
        card |= {"parent": None, "permission": []}
    return card


def _context(cfg: SimSettings) -> int:
    return cfg.context_window or 32768

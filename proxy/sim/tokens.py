"""The simulated model's token endpoints: llama.cpp's here, vLLM's and SGLang's in
sim/token_apis.py, all on the vocabulary of sim/vocab.py.

llama.cpp (llama-server, `tools/server/README.md`), in the shapes a real one answers:
- `GET /props`: the chat template (sim/turns-with-tools.jinja), `bos_token`, `eos_token`,
  `default_generation_settings.n_ctx`, `total_slots`, `model_alias`, `build_info`. The
  vocabulary size is where llama.cpp reports it, in `GET /v1/models` `meta.n_vocab`.
- `POST /apply-template` `{"messages", "tools"?}` -> `{"prompt"}`: the template rendered with
  jinja2's sandbox (a small renderer of the sim's own; wsmode's token path has its own).
- `POST /tokenize` `{"content", "add_special", "parse_special"}` -> `{"tokens"}` and
  `POST /detokenize` `{"tokens"}` -> `{"content"}`. A body with neither `parse_special`
  nor vLLM's and SGLang's `prompt` keeps the sim's older answer (sim/model.py's counting
  tokenizer), which wsmode's token counter relies on.
- `POST /completion`: `prompt` as ids or a string, `n_predict`, `stop`, `id_slot`,
  `cache_prompt`, `return_tokens`, `n_probs`, `stream`. Streamed, one event per token
  (`content`, `tokens`, `stop: false`, `tokens_predicted`, `tokens_evaluated`), then a final
  event with `stop: true`, `stop_type` ("eos", "limit", "word"), `timings` and the rest; no
  `[DONE]`. An id outside the vocabulary is a 400, as a real server gives.

The generated text is the sim's usual (sim/model.py `plan`, from the decoded prompt),
tokenised with the vocabulary; a stop string cuts it ("word"), the token limit cuts the ids
("limit"). With `think_words` it opens with `<think>` and that many words `</think>`. When
the prompt lists tools in a `<tools>` block (one JSON object per line, as the sim's template
writes them) and fewer than `tool_calls_per_turn` tool responses (`<tool_response>` turns)
follow the last user turn, the answer is a Hermes call of the first tool,
`<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, its arguments the sim's usual
(`{"n": ..., "q": ...}`), streamed a token at a time like text.

A prompt cache per slot (`id_slot`, -1 is slot 0) remembers the last prompt and
the ids generated after it, but the last (sampled, never evaluated), as llama.cpp's slot
does: a prompt's cached tokens are its longest common prefix with them, never the whole
prompt (the last prompt token is always evaluated).

`tokenize_us_per_token` burns CPU per token wherever the sim tokenises text.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from aiohttp import web
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..core import wire
from . import vocab
from .http import read_request
from .model import plan, tokenize
from .settings import SimSettings
from .state import SIM_STATE, SimState

TEMPLATE_PATH = Path(__file__).with_name("turns-with-tools.jinja")
MODEL = "sim"
# ------------------------------------------------------------------------------ shared


@cache
def _template_source() -> str:
    return TEMPLATE_PATH.read_text()


def render(messages: list[Any], tools: list[Any] | None, *, add_generation_prompt: bool) -> str:
    """The chat template, rendered the way Hugging Face and llama.cpp do (blocks trimmed,
    `tojson` plain JSON)."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda v, indent=None: json.dumps(v, ensure_ascii=False, indent=indent)
    template = env.from_string(_template_source())
    return template.render(
        messages=messages,
        tools=tools,
        add_generation_prompt=add_generation_prompt,
        bos_token="<bos>",
        eos_token="<eos>",
    )


def encode(state: SimState, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
    """The vocabulary's ids, paying the configured tokenising cost (counted in the state)."""
    t0 = time.perf_counter_ns()
    ids = vocab.encode(text, add_special=add_special, parse_special=parse_special)
    vocab.burn(state.settings.tokenize_us_per_token, len(ids))
    state.tokenized(len(ids), time.perf_counter_ns() - t0)
    return ids


@dataclass(frozen=True, slots=True)
class Generation:
    ids: list[int]
    pieces: list[str]  # each id's text
    stop: str  # llama.cpp's stop_type: "eos", "limit" (the token limit) or "word"
    word: str  # the stop string that ended it ("word")
    cached: int  # prompt tokens found in the slot's cache


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def generate(
    state: SimState,
    prompt: list[int],
    *,
    limit: int | None,
    stop: list[str],
    slot: int = 0,
    use_cache: bool = True,
) -> Generation:
    """What the model says after `prompt` (ids inside the vocabulary), and the slot's cache
    updated with it."""
    cfg = state.settings
    decoded = vocab.decode(prompt)
    body: dict[str, Any] = {"input": decoded}
    tool = _tool_to_call(decoded, cfg.tool_calls_per_turn)
    if tool is not None:
        body["tools"] = [{"type": "function", "name": tool}]
        body["tool_choice"] = "required"
    p = plan(body, seed=cfg.seed, output_tokens=cfg.output_tokens, tool_calls_per_turn=0)
    if p.tool_call is not None:
        call = p.tool_call
        text = (
            f'<tool_call>\n{{"name": "{call.name}", "arguments": {call.arguments}}}\n</tool_call>'
        )
    else:
        text = "".join(p.tokens)
    if cfg.think_words > 0:
        thought = plan(
            {"input": decoded + "\nthink"},
            seed=cfg.seed,
            output_tokens=cfg.think_words,
            tool_calls_per_turn=0,
        )
        text = f"<think>{''.join(thought.tokens)}</think>{text}"
    reason, word = "eos", ""
    cuts = [(text.find(s), s) for s in stop if s and s in text]
    if cuts:
        at, word = min(cuts)
        text, reason = text[:at], "word"
    ids = vocab.encode(text, parse_special=False)
    if limit is not None and 0 <= limit < len(ids):
        ids, reason, word = ids[:limit], "limit", ""
    key = max(slot, 0)
    held = state.token_slots.get(key, [])
    cached = min(_common_prefix(prompt, held), len(prompt) - 1) if use_cache else 0
    state.token_slots[key] = prompt + ids[:-1]
    return Generation(ids, [vocab.piece(t) for t in ids], reason, word, max(0, cached))


_TOOLS = re.compile(r"<tools>\n(.*?)</tools>", re.S)
_TOOL_NAME = re.compile(r'"name": "([^"]+)"')
_USER_TURN = "<start_of_turn>user\n"


def _tool_to_call(prompt: str, per_turn: int) -> str | None:
    """The first tool the prompt lists, if the model should call it now: fewer than
    `per_turn` tool responses follow the last user turn."""
    listed = _TOOLS.search(prompt)
    names = _TOOL_NAME.findall(listed.group(1)) if listed else []
    if not names or per_turn <= 0:
        return None
    turns = prompt.split(_USER_TURN)[1:]
    responses = 0
    for turn in reversed(turns):
        if not turn.startswith("<tool_response>"):
            break
        responses += 1
    return str(names[0]) if responses < per_turn else None


async def pace(cfg: SimSettings, t0: float, token: int) -> None:
    """Wait for `token`'s turn: time to first token, then tokens per second."""
    due = t0 + cfg.ttft_ms / 1000
    due += token / cfg.tokens_per_second if cfg.tokens_per_second > 0 else 0
    delay = due - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)


def sse_response() -> web.StreamResponse:
    return web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )


# ------------------------------------------------------------------------------ llama.cpp


def _llama_error(status: int, message: str) -> web.Response:
    kind = "invalid_request_error" if status < 500 else "server_error"
    body = {"error": {"code": status, "message": message, "type": kind}}
    return web.Response(status=status, body=wire.dumps(body), content_type="application/json")


def _n_ctx(cfg: SimSettings) -> int:
    return cfg.context_window or 32768


async def _props(request: web.Request) -> web.Response:
    cfg = request.app[SIM_STATE].settings
    settings = {
        "id": 0,
        "id_task": -1,
        "n_ctx": _n_ctx(cfg),
        "speculative": False,
        "is_processing": False,
        "params": {"n_predict": -1, "seed": cfg.seed, "temperature": 0.8, "top_p": 0.95},
    }
    return web.json_response(
        {
            "default_generation_settings": settings,
            "total_slots": 1,
            "model_alias": MODEL,
            "model_path": MODEL,
            "modalities": {"vision": False, "audio": False},
            "chat_template": _template_source(),
            "chat_template_caps": {"supports_tools": True, "supports_system_role": True},
            "bos_token": "<bos>",
            "eos_token": "<eos>",
            "build_info": "wsmode-sim",
        }
    )


async def _apply_template(request: web.Request) -> web.Response:
    state = request.app[SIM_STATE]
    body = await read_request(request, state, record=False)
    if isinstance(body, web.Response):
        return body
    messages, tools = body.get("messages"), body.get("tools")
    if not isinstance(messages, list):
        return _llama_error(400, "'messages' is required")
    prompt = render(
        messages, tools if isinstance(tools, list) else None, add_generation_prompt=True
    )
    return web.json_response({"prompt": prompt})


async def _tokenize(request: web.Request) -> web.Response:
    """llama.cpp's `{"content"}`, or vLLM's and SGLang's `{"prompt"}` (same path)."""
    state = request.app[SIM_STATE]
    body = await read_request(request, state, record=False)
    if isinstance(body, web.Response):
        return body
    state.tokenize_calls += 1
    content, prompt = body.get("content"), body.get("prompt")
    if isinstance(prompt, str) and "content" not in body:
        ids = encode(
            state,
            prompt,
            add_special=body.get("add_special_tokens", True) is True,
            parse_special=True,
        )
        answer: dict[str, Any] = {"count": len(ids), "max_model_len": _n_ctx(state.settings)}
        answer["tokens"] = ids
        if body.get("return_token_strs") is True:
            answer["token_strs"] = [vocab.piece(t) for t in ids]
        return web.json_response(answer)
    if not isinstance(content, str):
        return _llama_error(400, "'content' is required")
    if "parse_special" not in body:  # the sim's older answer, the counting tokenizer's
        return web.json_response({"tokens": tokenize(content)})
    ids = encode(
        state,
        content,
        add_special=body.get("add_special") is True,
        parse_special=body.get("parse_special") is True,
    )
    return web.json_response({"tokens": ids})


async def _detokenize(request: web.Request) -> web.Response:
    """One answer for the three servers: llama.cpp reads `content`, vLLM `prompt`, SGLang
    `text`."""
    state = request.app[SIM_STATE]
    body = await read_request(request, state, record=False)
    if isinstance(body, web.Response):
        return body
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(wire.is_int(t) for t in tokens):
        return _llama_error(400, "'tokens' must be a list of token ids")
    if (bad := vocab.out_of_range(tokens)) is not None:
        return _llama_error(400, f"token id {bad} is out of the vocabulary")
    text = vocab.decode(tokens)
    return web.json_response({"content": text, "prompt": text, "text": text})


def _probs(token: int, text: str) -> list[dict[str, Any]]:
    entry = {"id": token, "token": text, "bytes": list(text.encode()), "logprob": -0.1}
    return [{**entry, "top_logprobs": [dict(entry)]}]


async def _completion(request: web.Request) -> web.StreamResponse:
    state = request.app[SIM_STATE]
    cfg = state.settings
    body = await read_request(request, state)
    if isinstance(body, web.Response):
        return body
    raw = body.get("prompt")
    if isinstance(raw, str):
        prompt = encode(state, raw, add_special=True, parse_special=True)
    elif isinstance(raw, list) and raw and all(wire.is_int(t) for t in raw):
        prompt = list(raw)
    else:
        return _llama_error(400, "'prompt' must be a string or a list of token ids")
    if (bad := vocab.out_of_range(prompt)) is not None:
        return _llama_error(400, f"Invalid input batch: token id {bad} is out of range")
    n_predict = body.get("n_predict")
    stop = body.get("stop")
    slot = body.get("id_slot")
    slot = slot if wire.is_int(slot) else -1
    gen = generate(
        state,
        prompt,
        limit=n_predict if wire.is_int(n_predict) else None,
        stop=[s for s in stop if isinstance(s, str)] if isinstance(stop, list) else [],
        slot=slot,
        use_cache=body.get("cache_prompt", True) is not False,
    )
    with_ids = body.get("return_tokens") is True
    n_probs = body.get("n_probs")
    with_probs = wire.is_int(n_probs) and n_probs > 0
    streamed = body.get("stream") is True
    final = _final(body, prompt, gen, max(slot, 0), whole=not streamed, with_ids=with_ids)
    if not streamed:
        if with_probs:
            final["completion_probabilities"] = [
                p for t, s in zip(gen.ids, gen.pieces, strict=True) for p in _probs(t, s)
            ]
        state.completed += 1
        return web.json_response(final, dumps=lambda o: wire.dumps(o).decode())
    resp = sse_response()
    with state.streaming():
        await resp.prepare(request)
        t0 = time.monotonic()
        for i, (token, text) in enumerate(zip(gen.ids, gen.pieces, strict=True)):
            await pace(cfg, t0, i)
            event: dict[str, Any] = {"index": 0, "content": text}
            event["tokens"] = [token] if with_ids else []
            event.update(stop=False, id_slot=-1, tokens_predicted=i + 1)
            event["tokens_evaluated"] = len(prompt)
            if with_probs:
                event["completion_probabilities"] = _probs(token, text)
            await resp.write(b"data: " + wire.dumps(event) + b"\n\n")
        await resp.write(b"data: " + wire.dumps(final) + b"\n\n")
        state.completed += 1
        return resp


def _final(
    body: dict[str, Any],
    prompt: list[int],
    gen: Generation,
    slot: int,
    *,
    whole: bool,
    with_ids: bool,
) -> dict[str, Any]:
    """The last event of a stream (`whole`: the non-streamed answer, with all the text and,
    `with_ids`, all the ids)."""
    n, m = len(gen.ids), len(prompt)
    text = "".join(gen.pieces) if whole else ""
    timings = {
        "cache_n": gen.cached,
        "prompt_n": m - gen.cached,
        "prompt_ms": 1.0,
        "prompt_per_token_ms": 1.0 / max(1, m - gen.cached),
        "prompt_per_second": 1000.0 * max(1, m - gen.cached),
        "predicted_n": n,
        "predicted_ms": 1.0,
        "predicted_per_token_ms": 1.0 / max(1, n),
        "predicted_per_second": 1000.0 * max(1, n),
    }
    return {
        "index": 0,
        "content": text,
        "tokens": list(gen.ids) if whole and with_ids else [],
        "id_slot": slot,
        "stop": True,
        "model": MODEL,
        "tokens_predicted": n,
        "tokens_evaluated": m,
        "generation_settings": {"n_predict": body.get("n_predict", -1), "seed": body.get("seed")},
        "prompt": vocab.decode(prompt),
        "has_new_line": "\n" in "".join(gen.pieces),
        "truncated": False,
        "stop_type": gen.stop,
        "stopping_word": gen.word,
        "tokens_cached": m + max(0, n - 1),
        "timings": timings,
    }


def add_llamacpp_routes(app: web.Application) -> None:
    """llama.cpp's endpoints; `/tokenize` and `/detokenize` also answer vLLM's and SGLang's
    shapes (their paths are the same)."""
    app.router.add_get("/props", _props)
    app.router.add_post("/apply-template", _apply_template)
    app.router.add_post("/tokenize", _tokenize)
    app.router.add_post("/detokenize", _detokenize)
    app.router.add_post("/completion", _completion)

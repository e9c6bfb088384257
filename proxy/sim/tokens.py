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
  `cache_prompt`, `return_tokens`, `n_probs`, `response_fields` (the final answer's fields
  to keep, as llama.cpp's: the per-token events keep theirs), `stream`. Streamed, one event
  per token (`content`, `tokens`, `stop: false`, `tokens_predicted`, `tokens_evaluated`),
  then a final event with `stop: true`, `stop_type` ("eos", "limit", "word"), `timings` and
  the rest; no `[DONE]`. An id outside the vocabulary is a 400, as a real server gives.

The generated text is the sim's usual (sim/model.py `plan`, from the decoded prompt),
tokenised with the vocabulary; a stop string cuts it ("word"), the token limit cuts the ids
("limit"). The answer is planned from the prompt's turns read back into items
(sim/rendered.py): when the prompt lists tools and fewer than `tool_calls_per_turn` tool
responses follow the last user turn, it is a Hermes call, written as the template renders
one. A prompt that ends inside an open `<think>` (a thinking template's generation prompt)
gets its first half as reasoning, then `</think>`, a blank line and the rest, as a thinking
model writes; with `think_words` an answer opens with `<think>` and that many words
`</think>`. A prompt cache per slot (`id_slot`, -1 is slot 0) remembers the last
prompt and the ids generated after it, but the last (sampled, never evaluated), as
llama.cpp's slot does: a prompt's cached tokens are its longest common prefix with them,
never the whole prompt (the last prompt token is always evaluated).

`tokenize_us_per_token` burns CPU per token wherever the sim tokenises text, counted in the
tokens of sim/model.py (4 bytes each) on every endpoint, so a byte costs the same on each.

The answer is planned from the prompt's turns (sim/rendered.py) with `tool_calls_per_turn`,
as on `/v1/responses`; a tool call is written as the template renders it
(`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`). The stream is paced per model
token of the plan (a word, or a piece of the tool call's arguments), whatever number of ids
the vocabulary makes of it, so an answer takes the same time on every endpoint.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from aiohttp import web
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..core import wire
from . import rendered, vocab
from .http import read_request
from .model import plan, token_count, tokenize
from .settings import SimSettings
from .state import SIM_STATE, SimState, Slot

TEMPLATE_PATH = Path(__file__).with_name("turns-with-tools.jinja")
MODEL = "sim"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
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
    """The vocabulary's ids, paying the configured tokenising cost (counted in the state) for
    the text's tokens in the unit every endpoint is charged in (sim/model.py `token_count`)."""
    t0 = time.perf_counter_ns()
    pairs = state.settings.tokenizer == "pairs"
    ids = vocab.encode(text, add_special=add_special, parse_special=parse_special, pairs=pairs)
    state.tokenizing(token_count(text), t0)
    return ids


@dataclass(frozen=True, slots=True)
class Generation:
    ids: list[int]
    pieces: list[str]  # each id's text
    stop: str  # llama.cpp's stop_type: "eos", "limit" (the token limit) or "word"
    word: str  # the stop string that ended it ("word")
    cached: int  # prompt tokens found in the slot's cache
    # per id, the model token (a word of the plan) it belongs to: the stream is paced per
    # model token, as on the other endpoints, however many ids the vocabulary makes of it
    steps: list[int] = field(default_factory=list)
    prompt_text: str = ""  # the prompt's ids decoded


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:  # the usual case, a continuation: compared at C speed
        return n
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _cached(held: Slot | None, prompt: list[int], known: int) -> int:
    """The prompt's ids in the slot's cache: its longest common prefix with the slot's last
    prompt and the ids generated after it (the first `known` are that prompt)."""
    if held is None:
        return 0
    if known:
        return known + _common_prefix(prompt[known:], held.generated)
    return _common_prefix(prompt, held.prompt + held.generated)


def held_prefix(state: SimState, slot: int, prompt: list[int]) -> int:
    """How many of `prompt`'s first ids are the slot's last prompt (0 unless all of it):
    those were checked, decoded and read when it came."""
    held = state.token_slots.get(max(slot, 0))
    n = len(held.prompt) if held is not None else 0
    if held is None or not n or len(prompt) < n:
        return 0
    return n if prompt[:n] == held.prompt else 0  # compared at C speed


def _read(
    held: Slot | None, prompt: list[int], known: int
) -> tuple[str, list[rendered.Turn], Slot]:
    """The prompt's text and template turns, and the slot that holds it next. A continuation
    of the slot's last prompt (its first `known` ids) decodes and reads only what follows."""
    if held is not None and known:
        text = held.text + vocab.decode(prompt[known:])
        read = rendered.turns_from(text, held.read_to)
        turns, final = held.turns + read.turns, len(held.turns) + read.final
    else:
        text = vocab.decode(prompt)
        read = rendered.turns_from(text)
        turns, final = read.turns, read.final
    return text, turns, Slot(prompt, [], text, turns[:final], read.end)


def _steps(units: list[str], ids: list[int]) -> list[int]:
    """Per id, the index of the unit its text starts in (the ids decode to the units,
    joined)."""
    ends, at = [], 0
    for unit in units:
        at += len(unit)
        ends.append(at)
    out, offset, k = [], 0, 0
    for token in ids:
        while k < len(ends) - 1 and offset >= ends[k]:
            k += 1
        out.append(k)
        offset += len(vocab.piece(token))
    return out


def generate(
    state: SimState,
    prompt: list[int],
    *,
    limit: int | None,
    stop: list[str],
    slot: int = 0,
    use_cache: bool = True,
    known: int | None = None,
) -> Generation:
    """What the model says after `prompt` (ids inside the vocabulary), and the slot's cache
    updated with it: planned from the prompt's turns (sim/rendered.py), a tool call written
    as the template renders one. `known`: how many of its first ids are the slot's last
    prompt (`held_prefix`), when the caller has compared them already."""
    cfg = state.settings
    key = max(slot, 0)
    held = state.token_slots.get(key)
    known = held_prefix(state, key, prompt) if known is None else known
    decoded, turns, slot_next = _read(held, prompt, known)
    p = plan(
        rendered.view_turns(turns, decoded),
        seed=cfg.seed,
        output_tokens=cfg.output_tokens,
        tool_calls_per_turn=cfg.tool_calls_per_turn,
    )
    units = p.tokens if p.tool_call is None else rendered.tool_call_text(p.tool_call)
    text, reason, word = "".join(units), "eos", ""
    if decoded.rfind(THINK_OPEN) > decoded.rfind(THINK_CLOSE):  # the prompt opened a think block
        words = text.split(" ")
        half = max(1, len(words) // 2)
        text = " ".join(words[:half]) + f"\n{THINK_CLOSE}\n\n" + " ".join(words[half:])
    if cfg.think_words > 0:
        thought = plan(
            {"input": decoded + "\nthink"},
            seed=cfg.seed,
            output_tokens=cfg.think_words,
            tool_calls_per_turn=0,
        )
        text = f"<think>{''.join(thought.tokens)}</think>{text}"
    if "".join(units) != text:  # reasoning was added: paced per word of the whole answer
        words = text.split(" ")
        units = [w if i == 0 else " " + w for i, w in enumerate(words)]
    cuts = [(text.find(s), s) for s in stop if s and s in text]
    if cuts:
        at, word = min(cuts)
        text, reason = text[:at], "word"
    ids = vocab.encode(text, parse_special=False, pairs=cfg.tokenizer == "pairs")
    if limit is not None and 0 <= limit < len(ids):
        ids, reason, word = ids[:limit], "limit", ""
    cached = min(_cached(held, prompt, known), len(prompt) - 1) if use_cache else 0
    slot_next.generated = ids[:-1]
    state.token_slots[key] = slot_next
    pieces = [vocab.piece(t) for t in ids]
    steps = _steps(units, ids)
    return Generation(ids, pieces, reason, word, max(0, cached), steps, decoded)


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


def _json(doc: dict[str, Any]) -> web.Response:
    """A JSON answer, serialised by orjson (a long prompt's ids are many)."""
    return web.Response(body=wire.dumps(doc), content_type="application/json")


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
        return _json(answer)
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
    return _json({"tokens": ids})


async def _detokenize(request: web.Request) -> web.Response:
    """One answer for the three servers: llama.cpp reads `content`, vLLM `prompt`, SGLang
    `text`."""
    state = request.app[SIM_STATE]
    body = await read_request(request, state, record=False)
    if isinstance(body, web.Response):
        return body
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not vocab.all_ints(tokens):
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
    elif isinstance(raw, list) and raw and vocab.all_ints(raw):
        prompt = raw
    else:
        return _llama_error(400, "'prompt' must be a string or a list of token ids")
    slot = body.get("id_slot")
    slot = slot if wire.is_int(slot) else -1
    known = held_prefix(state, slot, prompt)  # ids already checked, as the slot's last prompt
    if (bad := vocab.out_of_range(prompt[known:])) is not None:
        return _llama_error(400, f"Invalid input batch: token id {bad} is out of range")
    n_predict = body.get("n_predict")
    stop = body.get("stop")
    gen = generate(
        state,
        prompt,
        limit=n_predict if wire.is_int(n_predict) else None,
        stop=[s for s in stop if isinstance(s, str)] if isinstance(stop, list) else [],
        slot=slot,
        use_cache=body.get("cache_prompt", True) is not False,
        known=known,
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
        final = _only(final, body.get("response_fields"))
        state.completed += 1
        return web.json_response(final, dumps=lambda o: wire.dumps(o).decode())
    resp = sse_response()
    with state.streaming():
        await resp.prepare(request)
        t0 = time.monotonic()
        for i, (token, text) in enumerate(zip(gen.ids, gen.pieces, strict=True)):
            await pace(cfg, t0, gen.steps[i])
            event: dict[str, Any] = {"index": 0, "content": text}
            event["tokens"] = [token] if with_ids else []
            event.update(stop=False, id_slot=-1, tokens_predicted=i + 1)
            event["tokens_evaluated"] = len(prompt)
            if with_probs:
                event["completion_probabilities"] = _probs(token, text)
            await resp.write(b"data: " + wire.dumps(event) + b"\n\n")
        final = _only(final, body.get("response_fields"))  # the partial events keep theirs
        await resp.write(b"data: " + wire.dumps(final) + b"\n\n")
        state.completed += 1
        return resp


def _only(doc: dict[str, Any], paths: Any) -> dict[str, Any]:
    """llama.cpp's `response_fields` on the final answer: only the values at those paths
    ("a/b" reaches into an object), keyed by the path, in the order asked; none asked: all."""
    if not isinstance(paths, list) or not paths:
        return doc
    out: dict[str, Any] = {}
    for path in paths:
        if not isinstance(path, str):
            continue
        value: Any = doc
        for key in path.split("/"):
            if not isinstance(value, dict) or key not in value:
                break
            value = value[key]
        else:
            out[path] = value
    return out


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
        "prompt": gen.prompt_text,
        "has_new_line": "\n" in "".join(gen.pieces),
        "truncated": False,
        "stop_type": gen.stop,
        "stopping_word": gen.word,
        "tokens_cached": m + max(0, n - 1),
        "timings": timings,
    }


def add_llamacpp_routes(app: web.Application, *, llamacpp: bool = True) -> None:
    """`/tokenize` and `/detokenize`, which answer the shapes of all three servers (their
    paths are the same), and with `llamacpp` llama.cpp's own endpoints."""
    app.router.add_post("/tokenize", _tokenize)
    app.router.add_post("/detokenize", _detokenize)
    if llamacpp:
        app.router.add_get("/props", _props)
        app.router.add_post("/apply-template", _apply_template)
        app.router.add_post("/completion", _completion)

"""The simulated model's token endpoints, driven end to end over loopback HTTP by wsmode's
own engines: tokenise a text, generate from its ids, read the stream with the engine and
the SSE decoder, and continue with the generated ids to see the prompt cache."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import aiohttp
import orjson
import pytest
from wsmode.core.sse import SSEDecoder
from wsmode.core.tokens.engine import EngineUsage, LlamaCppEngine, Sampling, TokenEngine
from wsmode.core.tokens.sglang import SglangEngine
from wsmode.core.tokens.vllm import VllmEngine
from wsmode.sim import vocab
from wsmode.sim.app import SIM_STATE, SimState, create_sim_app
from wsmode.sim.tokens import render

from tests.support.helpers import FAST_SIM, Served, serve

PROMPT = "<start_of_turn>user\nSay hi, café<end_of_turn>\n<start_of_turn>model\n"


@pytest.fixture
async def sim() -> AsyncIterator[tuple[Served, SimState]]:
    app = create_sim_app(replace(FAST_SIM, output_tokens=6))
    served = await serve(app, handler_cancellation=True)
    yield served, app[SIM_STATE]
    await served.runner.cleanup()


async def _post(http: aiohttp.ClientSession, url: str, body: bytes) -> tuple[int, bytes]:
    headers = {"Content-Type": "application/json"}
    async with http.post(url, data=body, headers=headers) as r:
        return r.status, await r.read()


async def _run(
    http: aiohttp.ClientSession, base: str, engine: TokenEngine, ids: list[int], s: Sampling
) -> tuple[str, list[int], str | None, EngineUsage | None]:
    stream = engine.stream()
    decoder = SSEDecoder(1 << 20)
    text, out, finish, usage = "", [], None, None
    body = engine.generate_body(orjson.dumps(ids), s)
    async with http.post(base + engine.generate_path, data=body) as r:
        assert r.status == 200
        async for chunk in r.content.iter_any():
            for event in decoder.feed(chunk):
                g = stream.feed(event)
                text, out = text + g.text, out + g.ids
                finish, usage = g.finish or finish, g.usage or usage
    for event in decoder.close():
        g = stream.feed(event)
        finish, usage = g.finish or finish, g.usage or usage
    last = stream.eof()
    return text, out, last.finish or finish, last.usage or usage


ENGINES: list[tuple[str, TokenEngine]] = [
    ("llamacpp", LlamaCppEngine()),
    ("vllm", VllmEngine()),
    ("sglang", SglangEngine()),
]


@pytest.mark.parametrize(("name", "engine"), ENGINES, ids=[n for n, _ in ENGINES])
async def test_engine_end_to_end(
    sim: tuple[Served, SimState], name: str, engine: TokenEngine
) -> None:
    served, state = sim
    async with aiohttp.ClientSession() as http:
        status, answer = await _post(
            http, served.base + engine.tokenize_path, engine.tokenize_body(PROMPT)
        )
        assert status == 200
        ids = engine.tokenize_ids(answer)
        assert ids == vocab.encode(PROMPT) and ids[0] == vocab.SPECIALS["<start_of_turn>"]
        text, out, finish, usage = await _run(http, served.base, engine, ids, Sampling(model="sim"))
        assert out and text == vocab.decode(out) and finish == "stop"
        assert usage is not None and usage.prompt_tokens == len(ids)
        assert usage.completion_tokens == len(out) and usage.cached_tokens == 0
        # the next turn: the same prompt, the generated ids, then more
        more = ids + out + vocab.encode("<end_of_turn>\n<start_of_turn>user\nagain<end_of_turn>\n")
        _, _, _, usage2 = await _run(http, served.base, engine, more, Sampling(max_tokens=2))
        assert usage2 is not None and usage2.prompt_tokens == len(more)
        held = len(ids) + len(out) - 1  # the last generated id was never evaluated
        block = state.settings.prefix_cache_block_tokens
        assert usage2.cached_tokens == (held // block * block if name == "vllm" else held)
        assert usage2.completion_tokens == 2


async def test_sglang_incremental_output() -> None:
    app = create_sim_app(replace(FAST_SIM, sglang_incremental_output=True))
    served = await serve(app)
    try:
        async with aiohttp.ClientSession() as http:
            ids = vocab.encode(PROMPT)
            text, out, finish, _ = await _run(
                http, served.base, SglangEngine(incremental=True), ids, Sampling(max_tokens=3)
            )
        assert len(out) == 3 and text == vocab.decode(out) and finish == "length"
    finally:
        await served.runner.cleanup()


async def test_llamacpp_shapes(sim: tuple[Served, SimState]) -> None:
    served, _ = sim
    async with aiohttp.ClientSession() as http:
        async with http.get(served.base + "/props") as r:
            props = await r.json()
        assert {"chat_template", "bos_token", "eos_token", "build_info"} <= set(props)
        assert props["default_generation_settings"]["n_ctx"] > 0
        async with http.get(served.base + "/v1/models") as r:
            assert (await r.json())["data"][0]["meta"]["n_vocab"] == vocab.VOCAB_SIZE
        body = {"content": "<bos>hi", "add_special": True, "parse_special": True}
        _, raw = await _post(http, served.base + "/tokenize", orjson.dumps(body))
        assert orjson.loads(raw)["tokens"] == [vocab.BOS, vocab.BOS, *vocab.encode("hi")]
        body = {"content": "<bos>", "add_special": False, "parse_special": False}
        _, raw = await _post(http, served.base + "/tokenize", orjson.dumps(body))
        assert vocab.decode(orjson.loads(raw)["tokens"]) == "<bos>"
        assert len(orjson.loads(raw)["tokens"]) > 1  # ordinary text, not the special token
        _, raw = await _post(http, served.base + "/detokenize", b'{"tokens":[3,100]}')
        assert orjson.loads(raw)["content"] == "<start_of_turn>" + vocab.piece(100)
        messages = [{"role": "user", "content": "Say hi"}]
        _, raw = await _post(
            http, served.base + "/apply-template", orjson.dumps({"messages": messages})
        )
        prompt = orjson.loads(raw)["prompt"]
        assert prompt == render(messages, None, add_generation_prompt=True)
        assert prompt == "<start_of_turn>user\nSay hi<end_of_turn>\n<start_of_turn>model\n"
        bad = {"prompt": [1, vocab.VOCAB_SIZE], "n_predict": 1}
        status, _ = await _post(http, served.base + "/completion", orjson.dumps(bad))
        assert status == 400
        body2: dict[str, Any] = {"prompt": prompt, "n_predict": 2, "return_tokens": True}
        status, raw = await _post(http, served.base + "/completion", orjson.dumps(body2))
        done = orjson.loads(raw)
        assert status == 200 and done["stop"] is True and done["stop_type"] == "limit"
        assert done["content"] == vocab.decode(done["tokens"]) and len(done["tokens"]) == 2
        # a string prompt gets <bos> first, as llama.cpp's does
        assert done["tokens_evaluated"] == len(vocab.encode(prompt)) + 1


async def test_the_vocabulary_splits_at_special_tokens() -> None:
    for a, b in (("x<end_of_turn>", "yz<bos>q é"), ("abc", "<bos>d"), ("<eos>", "<pad>")):
        assert vocab.encode(a + b) == vocab.encode(a) + vocab.encode(b)
    for text in ("x<end_of_turn>y<pad>", "odd", "", "日本語 and ascii"):
        assert vocab.decode(vocab.encode(text)) == text
    assert vocab.encode("ab") != vocab.encode("a") + vocab.encode("b")


async def test_a_continuation_is_read_past_the_slots_prompt_only(
    sim: tuple[Served, SimState],
) -> None:
    """A prompt continuing the slot's last one is checked, decoded and read only past it:
    it must answer as the same prompt sent whole to an empty slot, and an id out of range
    after the slot's prompt is still refused."""
    served, _ = sim
    url = served.base + "/completion"
    first = vocab.encode(PROMPT, parse_special=True)

    async def complete(prompt: list[int], slot: int) -> tuple[int, dict[str, Any]]:
        body = {"prompt": prompt, "id_slot": slot, "return_tokens": True}
        async with aiohttp.ClientSession() as http:
            status, raw = await _post(http, url, orjson.dumps(body))
        return status, orjson.loads(raw)

    status, done = await complete(first, 0)
    assert status == 200
    after = vocab.encode(
        "<end_of_turn>\n<start_of_turn>user\nAgain<end_of_turn>\n<start_of_turn>model\n",
        parse_special=True,
    )
    prompt = first + done["tokens"] + after
    status, bad = await complete([*first, vocab.VOCAB_SIZE], 0)
    assert status == 400 and "out of range" in bad["error"]["message"]
    status, continued = await complete(prompt, 0)
    assert status == 200
    # the slot's prompt and all it generated but the last id were cached, as llama.cpp's
    assert continued["timings"]["cache_n"] == len(first) + len(done["tokens"]) - 1
    status, whole = await complete(prompt, 1)  # the same prompt, read whole in an empty slot
    assert status == 200 and whole["timings"]["cache_n"] == 0
    assert continued["tokens"] == whole["tokens"] and continued["prompt"] == whole["prompt"]


async def test_response_fields_trim_the_final_answer_only(sim: tuple[Served, SimState]) -> None:
    """llama.cpp's `response_fields`: the final answer (streamed or whole) keeps only those
    fields, a path with "/" reaching into an object; the per-token events keep theirs."""
    served, _ = sim
    url = served.base + "/completion"
    ids = vocab.encode(PROMPT, parse_special=True)
    fields = ["content", "stop", "timings/cache_n", "no_such_field"]
    async with aiohttp.ClientSession() as http:
        body = {"prompt": ids, "n_predict": 3, "stream": True, "response_fields": fields}
        status, raw = await _post(http, url, orjson.dumps(body))
        events = [orjson.loads(e.data) for e in SSEDecoder(1 << 20).feed(raw)]
        body = {"prompt": ids, "n_predict": 3, "response_fields": fields}
        _, whole = await _post(http, url, orjson.dumps(body))
        body = {"prompt": ids, "n_predict": 3}
        _, everything = await _post(http, url, orjson.dumps(body))
    assert status == 200 and len(events) == 4
    assert all(e["stop"] is False and "tokens_evaluated" in e for e in events[:-1])
    assert list(events[-1]) == ["content", "stop", "timings/cache_n"]
    assert events[-1]["stop"] is True and isinstance(events[-1]["timings/cache_n"], int)
    assert list(orjson.loads(whole)) == ["content", "stop", "timings/cache_n"]
    assert "prompt" in orjson.loads(everything) and "timings" in orjson.loads(everything)

"""The token path's start-up probe and what guards its ids (upstream/token_probe.py,
token_replicas.py, core/tokens/identity.py), end to end on the simulated model shaped as
each server really is (`sim.token_server`): which engine `token_engine = "auto"` finds, a
server that cannot serve the path (no template, vLLM without its generate route or predating
`output_mode`), ids outside the vocabulary from the server or from the store, replicas with
different tokenizers, a server restarted with another tokenizer, and a template whose
generation prompt opens a think block.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web
from websockets.asyncio.client import connect
from wsmode.sim import vocab
from wsmode.sim.app import SIM_STATE, create_sim_app

from tests.support.helpers import FAST_SIM, Proxy, Served, Sim, recv, until
from tests.support.redis_server import RedisServer
from tests.support.token_path import (
    TEMPLATE,
    FakeLlamaCpp,
    counts,
    delta,
    engine_settings,
    get_json,
    not_ready_because,
    output_text,
    serve_fake,
    trajectory,
    wait_ready,
    ws_turn,
)

SimFactory = Callable[..., Awaitable[Sim]]
ProxyFactory = Callable[..., Awaitable[Proxy]]
THINKING = str(Path(__file__).parents[1] / "fixtures/templates/qwen3-thinking-like.jinja")


def auto(**overrides: Any) -> dict[str, Any]:
    """The token path with `token_engine = "auto"` and the sim's template as a file."""
    return {"upstream__api": "tokens", "upstream__chat_template_file": TEMPLATE, **overrides}


async def health(proxy: Proxy) -> dict[str, Any]:
    _, doc = await get_json(f"{proxy.served.base}/healthz")
    assert isinstance(doc, dict)
    return doc


async def turn_fails(proxy: Proxy, status: int, code: str) -> dict[str, Any]:
    """A turn over WebSocket mode that gets only an `error` with this status and code."""
    async with connect(proxy.ws) as ws:
        events = await ws_turn(ws, input="hello")
    assert [e["type"] for e in events] == ["error"], events
    assert events[0]["status"] == status and events[0]["error"]["code"] == code, events[0]
    return dict(events[0]["error"])


# ------------------------------------------------------------------ which engine, and can it


@pytest.mark.parametrize("server", ["llamacpp", "vllm", "sglang"])
async def test_auto_finds_each_engine_by_the_routes_it_really_has(
    server: str, sim_factory: SimFactory, proxy_factory: ProxyFactory
) -> None:
    sim = await sim_factory(token_server=server)
    proxy = await proxy_factory(sim.url, **auto())
    await wait_ready(proxy)
    assert (await health(proxy))["token_engine"] == server
    async with connect(proxy.ws) as ws:
        first = (await ws_turn(ws, input="one"))[-1]
        second = (await ws_turn(ws, input="two", previous_response_id=first["response"]["id"]))[-1]
    assert second["type"] == "response.completed", second
    p0, g0 = await trajectory(proxy, first["response"]["id"])
    p1, _ = await trajectory(proxy, second["response"]["id"])
    assert p1[: len(p0) + len(g0)] == p0 + g0  # the engine found is the one that was used
    prompts = {"llamacpp": "prompt", "vllm": "token_ids", "sglang": "input_ids"}[server]
    assert sim.bodies()[-1][prompts] == p1  # sent to the engine's own generate endpoint


async def test_a_server_that_reports_no_chat_template_is_not_ready_saying_so(
    sim_factory: SimFactory, proxy_factory: ProxyFactory
) -> None:
    sim = await sim_factory(token_server="vllm")
    proxy = await proxy_factory(sim.url, upstream__api="tokens")
    [reason] = await not_ready_because(proxy, "reports no chat template")
    assert "vllm" in reason and "upstream.chat_template_file" in reason
    assert "no chat template" in (await turn_fails(proxy, 503, "upstream_not_ready"))["message"]


async def test_a_vllm_without_its_token_endpoint_is_not_ready_saying_why(
    sim_factory: SimFactory, proxy_factory: ProxyFactory
) -> None:
    sim = await sim_factory(token_server="vllm", vllm_scale_out=False)
    proxy = await proxy_factory(sim.url, **auto())
    [reason] = await not_ready_because(proxy, "--enable-scale-out")
    assert "/inference/v1/generate answered 404" in reason
    health_doc = await health(proxy)
    assert health_doc["token_engine"] is None and "--enable-scale-out" in str(health_doc)
    error = await turn_fails(proxy, 503, "upstream_not_ready")
    assert "--enable-scale-out" in error["message"]


async def test_a_vllm_that_predates_output_mode_is_not_ready_naming_the_field(
    sim_factory: SimFactory, proxy_factory: ProxyFactory
) -> None:
    sim = await sim_factory(token_server="vllm", vllm_output_mode=False)
    proxy = await proxy_factory(sim.url, **auto())
    [reason] = await not_ready_because(proxy, "`output_mode`")
    assert "/inference/v1/generate" in reason


async def test_a_vllm_stream_without_output_mode_fails_the_turn_naming_the_field(
    sim_factory: SimFactory, proxy_factory: ProxyFactory
) -> None:
    """A replica that turns into an older vLLM after start-up (the probe found a good one):
    its turn is a 502 naming `output_mode`, never a completed response with no text."""
    sim = await sim_factory(token_server="vllm")
    proxy = await proxy_factory(sim.url, **auto())
    await wait_ready(proxy)
    sim.state.settings = replace(sim.state.settings, vllm_output_mode=False)
    error = await turn_fails(proxy, 502, "upstream_protocol_error")
    assert "`output_mode`" in error["message"]
    sim.state.settings = replace(sim.state.settings, vllm_output_mode=True)
    async with connect(proxy.ws) as ws:
        done = (await ws_turn(ws, input="again"))[-1]
    assert done["type"] == "response.completed" and output_text(done["response"])


# ------------------------------------------------------------------ ids outside the vocabulary


@pytest.mark.parametrize("where", ["tokenize", "generate"])
async def test_ids_outside_the_vocabulary_from_the_server_are_a_protocol_error(
    where: str, proxy_factory: ProxyFactory
) -> None:
    """llama.cpp reports its vocabulary (`n_vocab`): an id past it in a tokenize answer or in
    the generated tokens is the server's fault, a 502 naming the id, and never kept."""
    fake = FakeLlamaCpp()
    served = await serve_fake(fake)
    try:
        proxy = await proxy_factory(f"{served.base}/v1", **engine_settings("auto"))
        await wait_ready(proxy)
        bad = vocab.VOCAB_SIZE + 7
        setattr(fake, f"{where}_extra" if where == "tokenize" else "generated_extra", [bad])
        sent = len(fake.completions)
        async with connect(proxy.ws) as ws:
            events = await ws_turn(ws, input="hello")
            if events[-1]["type"] == "response.failed":  # the stream had started: then an error
                events.append(await recv(ws))
            err = events[-1]
            assert err["type"] == "error" and err["status"] == 502, err
            assert err["error"]["code"] == "upstream_protocol_error"
            assert f"token id {bad}" in err["error"]["message"]
            assert "vocabulary" in err["error"]["message"]
            if where == "tokenize":
                assert [e["type"] for e in events] == ["error"]
                assert len(fake.completions) == sent  # nothing generated from a bad prompt
            else:
                failed = events[-2]
                assert failed["type"] == "response.failed", events
                assert failed["response"]["error"]["wsmode_code"] == "upstream_protocol_error"
            fake.tokenize_extra, fake.generated_extra = [], []
            done = (await ws_turn(ws, input="and now"))[-1]
        assert done["type"] == "response.completed", done
    finally:
        await served.runner.cleanup()


async def test_an_id_no_token_cache_holds_fails_the_probe_of_a_server_without_a_vocabulary(
    proxy_factory: ProxyFactory,
) -> None:
    """A server that reports no vocabulary size still bounds its ids by what the token
    cache can hold (a C int): a start-up probe answered with a larger one is not ready."""
    fake = FakeLlamaCpp(n_vocab=None, tokenize_extra=[1 << 31])
    served = await serve_fake(fake)
    try:
        proxy = await proxy_factory(f"{served.base}/v1", **engine_settings("auto"))
        reasons = await not_ready_because(proxy, "outside any vocabulary")
        assert any(f"token id {1 << 31}" in r for r in reasons), reasons
    finally:
        await served.runner.cleanup()


def _tamper(redis_server: RedisServer, rid: str, bad: int) -> None:
    """Put `bad` among the generated ids of the stored record of `rid`."""
    [key] = [k for k in redis_server.stored_keys() if k.endswith(rid.encode())]
    meta = orjson.loads(redis_server.client.hget(key, "m"))
    meta["tok"]["t"][-1]["gi"][0] = bad
    redis_server.client.hset(key, "m", orjson.dumps(meta))


async def test_stored_ids_outside_the_vocabulary_are_never_sent(
    sim_factory: SimFactory, proxy_factory: ProxyFactory, redis_server: RedisServer
) -> None:
    """A record in the shared store whose ids its fingerprint's vocabulary does not have is
    not trusted: the turn continuing it renders afresh (counted), the server never sees
    them, and the record's trajectory has no ids."""
    sim = await sim_factory()
    shared = {"store__backend": "redis", "store__redis_url": redis_server.url}
    first = await proxy_factory(sim.url, **engine_settings("auto"), **shared)
    second = await proxy_factory(sim.url, **engine_settings("auto"), **shared)
    await wait_ready(first)
    await wait_ready(second)
    async with connect(first.ws) as ws:
        parent = (await ws_turn(ws, input="remember this"))[-1]["response"]["id"]
    bad = vocab.VOCAB_SIZE + 3
    _tamper(redis_server, parent, bad)
    before = await counts(second)
    async with connect(second.ws) as ws:
        done = (await ws_turn(ws, input="go on", previous_response_id=parent))[-1]
    assert done["type"] == "response.completed", done
    used = delta(await counts(second), before)
    assert used["parent_without_ids"] == 1 and used["reused"] == 0
    assert bad not in sim.bodies()[-1]["prompt"]  # the generate request: the sim has no such id
    status, doc = await get_json(f"{second.http}/responses/{parent}/tokens")
    assert status == 404 and doc["error"]["code"] == "no_token_ids"


# ------------------------------------------------------------------ one tokenizer for every id


async def test_replicas_with_different_tokenizers_are_not_ready_naming_the_part(
    sim_factory: SimFactory, proxy_factory: ProxyFactory
) -> None:
    same = [await sim_factory(), await sim_factory()]
    proxy = await proxy_factory(
        "", **engine_settings("auto"), upstream__urls=tuple(s.url for s in same)
    )
    await wait_ready(proxy)  # two replicas of one model: ready
    pairs, chars = await sim_factory(), await sim_factory(tokenizer="chars")
    urls = (pairs.url, chars.url)
    proxy = await proxy_factory("", **engine_settings("auto"), upstream__urls=urls)
    [reason] = await not_ready_because(proxy, "do not serve the same model")
    assert "differ in tokenizer" in reason
    assert f"127.0.0.1:{pairs.served.port}" in reason and f"127.0.0.1:{chars.served.port}" in reason
    assert "vocabulary" not in reason.split("(")[0]  # the same vocabulary: only the tokenizer
    await turn_fails(proxy, 503, "upstream_not_ready")  # no id goes to either
    assert not [b for b in pairs.bodies() + chars.bodies() if "prompt" in b]


async def test_a_stored_chain_continued_after_the_tokenizer_changed_renders_afresh(
    sim_factory: SimFactory,
    proxy_factory: ProxyFactory,
    redis_server: RedisServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Ids kept in Redis outlive the server that made them: a wsmode in front of a server
    with another tokenizer (the same model name, the same vocabulary) does not reuse them,
    counts the divergence and says which part of the fingerprint changed."""
    shared = {"store__backend": "redis", "store__redis_url": redis_server.url}
    old_sim, new_sim = await sim_factory(), await sim_factory(tokenizer="chars")
    old = await proxy_factory(old_sim.url, **engine_settings("auto"), **shared)
    new = await proxy_factory(new_sim.url, **engine_settings("auto"), **shared)
    await wait_ready(old)
    await wait_ready(new)
    assert (await health(old))["tokenizer"] != (await health(new))["tokenizer"]
    async with connect(old.ws) as ws:
        first = (await ws_turn(ws, input="note one"))[-1]["response"]["id"]
        parent = (await ws_turn(ws, input="note two", previous_response_id=first))[-1]
    before = await counts(new)
    caplog.set_level(logging.INFO, logger="wsmode.tokens")
    async with connect(new.ws) as ws:
        done = (
            await ws_turn(ws, input="note three", previous_response_id=parent["response"]["id"])
        )[-1]
    assert done["type"] == "response.completed", done
    used = delta(await counts(new), before)
    assert used["fingerprint"] == 1 and used["reused"] == 0
    prompt, _ = await trajectory(new, done["response"]["id"])
    text = vocab.decode(prompt)
    assert "note one" in text and "note two" in text  # the whole history, tokenised afresh
    assert prompt == vocab.encode(text[len("<bos>") :], add_special=True, pairs=False)
    assert used["tokenized"] == len(prompt)
    said = [r.getMessage() for r in caplog.records if "fingerprint differs" in r.getMessage()]
    assert said and "tokenizer" in said[-1] and "vocabulary" not in said[-1], said


async def _serve_on(port: int, **settings: Any) -> Sim:
    """A sim on `port` (0: any free one; else a server restarted where the old one was)."""
    app = create_sim_app(replace(FAST_SIM, **settings))
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return Sim(Served(runner, runner.addresses[0][1]), app[SIM_STATE])


async def test_a_server_restarted_with_another_tokenizer_is_probed_again(
    proxy_factory: ProxyFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """The pool's health checks see the server go and come back; the token path probes it
    again, takes its new tokenizer, and the conversation's next turn renders afresh."""
    caplog.set_level(logging.INFO)
    first = await _serve_on(0)
    settings = {"upstream__health_interval": 0.05, "upstream__unhealthy_threshold": 1}
    proxy = await proxy_factory(first.url, **engine_settings("auto"), **settings)
    running = [first]
    try:
        await wait_ready(proxy)
        old = (await health(proxy))["tokenizer"]
        async with connect(proxy.ws) as ws:
            parent = (await ws_turn(ws, input="before the restart"))[-1]["response"]["id"]
        await running.pop().served.runner.cleanup()

        async def down() -> bool:
            _, doc = await get_json(f"{proxy.served.base}/readyz")
            return not doc["upstreams"][0]["healthy"]

        await until(down, message="the pool never saw the server go")
        running.append(await _serve_on(first.served.port, tokenizer="chars"))

        async def reprobed() -> bool:
            doc = await health(proxy)
            return doc["ready"] and doc["tokenizer"] not in (None, old)

        await until(reprobed, message="the restarted server was never probed again")
        assert any("now serves another model" in r.getMessage() for r in caplog.records)
        before = await counts(proxy)
        async with connect(proxy.ws) as ws:
            done = (await ws_turn(ws, input="after it", previous_response_id=parent))[-1]
        assert done["type"] == "response.completed", done
        used = delta(await counts(proxy), before)
        assert used["fingerprint"] == 1 and used["reused"] == 0
    finally:
        for sim in running:
            await sim.served.runner.cleanup()


# ------------------------------------------------------------------ thinking templates


async def test_a_generation_prompt_that_opens_think_gives_a_reasoning_item(
    sim_factory: SimFactory, proxy_factory: ProxyFactory
) -> None:
    """A Qwen3-Thinking-like template ends its generation prompt with `<think>\\n`: the model's
    output starts as reasoning, and the text after its `</think>` is the message."""
    sim = await sim_factory(output_tokens=8)
    proxy = await proxy_factory(sim.url, **auto(upstream__chat_template_file=THINKING))
    await wait_ready(proxy)
    async with connect(proxy.ws) as ws:
        events = await ws_turn(ws, input="think about it")
    done = events[-1]
    assert done["type"] == "response.completed", done
    output = done["response"]["output"]
    assert [item["type"] for item in output] == ["reasoning", "message"], output
    _, generated = await trajectory(proxy, done["response"]["id"])
    thought, said = vocab.decode(generated).split("\n</think>\n\n")
    reasoning = "".join(part["text"] for part in output[0]["content"])
    # the reasoning as the model wrote it before `</think>` (its line break too, as vLLM's
    # and SGLang's reasoning parsers keep it), the message as it wrote it after
    assert reasoning == thought + "\n" and output_text(done["response"]) == said
    assert "<think>" not in said and "</think>" not in said + reasoning
    assert vocab.decode(sim.bodies()[-1]["prompt"]).endswith("<|im_start|>assistant\n<think>\n")

"""The token path (`upstream.api = "tokens"`) when a turn is cut short or something is wrong:
cancel and steer mid-stream, a generate answer without ids, a tokenizer that fails, a chat
template that refuses, a server that is no token engine, the trajectory route's refusals,
and a chain continued on a second wsmode sharing Redis.

Each failure has its documented outcome (docs/errors.md) and leaves the conversation as it
was: the next turn from the same parent completes and still reuses the parent's ids. A
controllable llama.cpp (tests/support/token_path.py `FakeLlamaCpp`) holds a stream mid-way
or leaves the ids out; the rest runs on the simulated model.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from websockets.asyncio.client import ClientConnection, connect
from wsmode.sim import vocab

from tests.support.helpers import (
    Proxy,
    Served,
    Sim,
    create,
    post_responses,
    recv,
    send,
    serve,
    until,
    until_terminal,
)
from tests.support.redis_server import RedisServer
from tests.support.token_path import (
    FIXED_BYTES,
    MAX_BYTES_PER_ID,
    TEMPLATE,
    FakeLlamaCpp,
    counts,
    delta,
    detokenize,
    engine_settings,
    get_json,
    output_text,
    serve_fake,
    stored_tokens,
    token_record,
    trajectory,
    wait_ready,
    ws_turn,
)

ProxyFactory = Callable[..., Awaitable[Proxy]]
SimFactory = Callable[..., Awaitable[Sim]]
FakeFactory = Callable[..., Awaitable[tuple[FakeLlamaCpp, Proxy]]]
ASKED = "<end_of_turn>\n<start_of_turn>model\n"  # the end of every prompt: the model's turn


@pytest.fixture
async def fake_proxy(proxy_factory: ProxyFactory) -> AsyncIterator[FakeFactory]:
    """`make(**fake_fields)`: a FakeLlamaCpp and a ready token-path proxy in front of it."""
    started: list[tuple[FakeLlamaCpp, Served]] = []

    async def make(**fields: Any) -> tuple[FakeLlamaCpp, Proxy]:
        fake = FakeLlamaCpp(**fields)
        served = await serve_fake(fake)
        started.append((fake, served))
        proxy = await proxy_factory(f"{served.base}/v1", **engine_settings("auto"))
        await wait_ready(proxy)
        return fake, proxy

    yield make
    for fake, served in started:
        fake.release.set()  # a held stream ends, so the server can stop
        await served.runner.cleanup()


async def until_type(ws: ClientConnection, kind: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    while not events or events[-1]["type"] != kind:
        events.append(await recv(ws))
        assert events[-1]["type"] != "error", events[-1]
    return events


async def assert_parent_goes_on(ws: ClientConnection, proxy: Proxy, parent: str) -> None:
    """A turn from `parent` completes, its prompt the parent's ids and then the new text,
    and nothing diverged: the failure left the conversation as it was."""
    before = await counts(proxy)
    events = await ws_turn(ws, input="carry on", previous_response_id=parent)
    assert events[-1]["type"] == "response.completed", events[-1]
    pp, pg = await trajectory(proxy, parent)
    prompt, _ = await trajectory(proxy, events[-1]["response"]["id"])
    assert prompt[: len(pp) + len(pg)] == pp + pg
    assert vocab.decode(prompt[len(pp) + len(pg) :]).endswith("carry on" + ASKED)
    used = delta(await counts(proxy), before)
    assert used["reused"] == len(pp) + len(pg)
    assert used["history_changed"] == used["generation_rerendered"] == used["fingerprint"] == 0


# ------------------------------------------------------------------ cancel and steer


async def test_cancel_mid_stream_stops_the_engine_and_keeps_the_parent(
    fake_proxy: FakeFactory,
) -> None:
    fake, proxy = await fake_proxy()
    async with connect(proxy.ws) as ws:
        parent = (await ws_turn(ws, input="first"))[-1]["response"]["id"]
        fake.hold_after = 2
        await send(ws, create(input="a long answer", previous_response_id=parent))
        await asyncio.wait_for(fake.held.wait(), 10)
        await until_type(ws, "response.output_text.delta")
        await send(ws, {"type": "response.cancel"})
        events = await until_terminal(ws)
        end = events[-1]
        assert end["type"] == "response.incomplete", end
        assert end["response"]["status"] == "cancelled"
        assert end["response"]["incomplete_details"] is None
        await until(lambda: fake.disconnects == 1, message="the engine's stream was not closed")
        status, _ = await token_record(proxy, end["response"]["id"])
        assert status == 404  # a cancelled response is not kept
        fake.hold_after = None
        await assert_parent_goes_on(ws, proxy, parent)


async def test_a_steer_ends_the_response_after_its_reasoning_item(
    fake_proxy: FakeFactory,
) -> None:
    """docs/protocol.md "response.steer": when the running response finishes its current
    output item (here the think block), wsmode stops the stream, ends it `incomplete` with
    reason `steered`, and starts the successor with the steering input."""
    fake, proxy = await fake_proxy()
    fake.pieces = ["<think>", "let me ", "plan", "</think>", "The ", "answer ", "is ", "long."]
    fake.hold_after = 2  # inside the think block
    async with connect(proxy.ws) as ws:
        await send(ws, create(input="think first"))
        created = await recv(ws)
        rid = created["response"]["id"]
        await asyncio.wait_for(fake.held.wait(), 10)
        await send(ws, {"type": "response.steer", "previous_response_id": rid, "input": "stop"})
        await until_type(ws, "response.steer.accepted")
        before = await counts(proxy)
        fake.release.set()
        steered = (await until_terminal(ws))[-1]
        successor = await until_terminal(ws)
    assert steered["type"] == "response.incomplete", [
        steered["type"],
        steered["response"]["output"],
    ]
    assert steered["response"]["incomplete_details"] == {"reason": "steered"}
    assert [i["type"] for i in steered["response"]["output"]] == ["reasoning"]
    assert successor[0]["response"]["previous_response_id"] == rid
    assert successor[-1]["type"] == "response.completed", successor[-1]
    sp, _ = await trajectory(proxy, rid)
    prompt, _ = await trajectory(proxy, successor[-1]["response"]["id"])
    assert vocab.decode(prompt).endswith("stop" + ASKED)
    # the cut turn left only reasoning, which the history does not show: the template now
    # writes the steering input where the steered turn's generation prompt was. Its ids up to
    # that turn marker are reused, the rest is tokenised again, and the divergence is counted
    marker = vocab.encode("<start_of_turn>", parse_special=True)[0]
    last_turn = max(i for i, x in enumerate(sp) if x == marker)
    assert prompt[:last_turn] == sp[:last_turn]
    used = delta(await counts(proxy), before)
    assert used["reused"] == last_turn, used
    assert used["history_changed"] == 1
    assert used["generation_rerendered"] == used["fingerprint"] == 0


# ------------------------------------------------------------------ the engine misbehaves


@pytest.mark.parametrize("from_piece", [0, 2], ids=["first-event", "mid-stream"])
async def test_a_generate_answer_without_ids_is_an_upstream_protocol_error(
    from_piece: int, fake_proxy: FakeFactory
) -> None:
    fake, proxy = await fake_proxy()
    async with connect(proxy.ws) as ws:
        parent = (await ws_turn(ws, input="first"))[-1]["response"]["id"]
        fake.tokens_until = from_piece
        events = await ws_turn(ws, input="no ids now", previous_response_id=parent)
        if events[-1]["type"] == "response.failed":  # a stream that started: then an error
            events.append(await recv(ws))
        err = events[-1]
        assert err["type"] == "error" and err["status"] == 502, err
        assert err["error"]["code"] == "upstream_protocol_error"
        assert "`tokens`" in err["error"]["message"]  # it names the missing field
        kinds = [e["type"] for e in events]
        if "response.created" in kinds:  # the stream had started: failed, then the error
            failed = events[-2]
            assert failed["type"] == "response.failed"
            assert failed["response"]["error"]["wsmode_code"] == "upstream_protocol_error"
        else:
            assert kinds == ["error"]
        assert from_piece == 0 or "response.created" in kinds
        fake.tokens_until = None
        await assert_parent_goes_on(ws, proxy, parent)


async def test_a_prompt_past_the_servers_context_window_is_refused_before_it_is_sent(
    fake_proxy: FakeFactory,
) -> None:
    """llama.cpp's `n_ctx` from /props bounds the prompt: counted exactly, after the new
    text is tokenised, and refused with 400 `context_length_exceeded` without a generate
    request; the conversation is left as it was."""
    fake, proxy = await fake_proxy(n_ctx=120)
    async with connect(proxy.ws) as ws:
        parent = (await ws_turn(ws, input="first"))[-1]["response"]["id"]
        sent = len(fake.completions)
        events = await ws_turn(ws, input="x " * 200, previous_response_id=parent)
        assert [e["type"] for e in events] == ["error"], events
        assert events[0]["error"]["code"] == "context_length_exceeded"
        assert events[0]["status"] == 400 and "120" in events[0]["error"]["message"]
        assert len(fake.completions) == sent  # the server was not asked to generate
        await assert_parent_goes_on(ws, proxy, parent)


async def test_a_tokenizer_that_fails_is_a_clear_error(fake_proxy: FakeFactory) -> None:
    fake, proxy = await fake_proxy()
    async with connect(proxy.ws) as ws:
        parent = (await ws_turn(ws, input="first"))[-1]["response"]["id"]
        fake.tokenize_status = 500
        sent = len(fake.completions)
        events = await ws_turn(ws, input="tokenise me", previous_response_id=parent)
        assert [e["type"] for e in events] == ["error"], events
        assert events[0]["status"] == 500
        assert "tokenizer exploded" in events[0]["error"]["message"]  # the server's words
        assert len(fake.completions) == sent  # nothing was generated from a half prompt
        fake.tokenize_status = 200
        await assert_parent_goes_on(ws, proxy, parent)


async def refusing_proxy(
    tmp_path: Path, sim_factory: SimFactory, proxy_factory: ProxyFactory
) -> tuple[Path, Sim, Proxy]:
    """A token-path proxy whose chat template refuses any message containing "nope"."""
    refusing = tmp_path / "refusing.jinja"
    refusing.write_text(
        "{%- for m in messages -%}{%- if m.content is string and 'nope' in m.content -%}"
        "{{ raise_exception('nope is not allowed') }}{%- endif -%}{%- endfor -%}"
        + Path(TEMPLATE).read_text()
    )
    sim = await sim_factory()
    proxy = await proxy_factory(
        sim.url, upstream__api="tokens", upstream__chat_template_file=str(refusing)
    )
    await wait_ready(proxy)
    return refusing, sim, proxy


async def test_a_template_that_raises_names_itself(
    tmp_path: Path, sim_factory: SimFactory, proxy_factory: ProxyFactory
) -> None:
    refusing, sim, proxy = await refusing_proxy(tmp_path, sim_factory, proxy_factory)
    async with connect(proxy.ws) as ws:
        parent = (await ws_turn(ws, input="fine"))[-1]["response"]["id"]
        asked = len(sim.state.requests)
        events = await ws_turn(ws, input="nope", previous_response_id=parent)
        assert [e["type"] for e in events] == ["error"], events
        err = events[0]
        assert err["status"] == 400 and err["error"]["code"] == "chat_template_error"
        assert str(refusing) in err["error"]["message"]
        assert "nope is not allowed" in err["error"]["message"]
        assert len(sim.state.requests) == asked  # the model server was never asked
        await assert_parent_goes_on(ws, proxy, parent)


@pytest.mark.parametrize("stream", [False, True])
async def test_a_template_that_raises_is_a_400_over_http(
    stream: bool, tmp_path: Path, sim_factory: SimFactory, proxy_factory: ProxyFactory
) -> None:
    refusing, _, proxy = await refusing_proxy(tmp_path, sim_factory, proxy_factory)
    status, doc = await post_responses(proxy, {"model": "sim", "input": "nope", "stream": stream})
    assert status == 400, doc
    assert doc["error"]["code"] == "chat_template_error"
    assert str(refusing) in doc["error"]["message"]


# a template that refuses "kaboom" anywhere, and "boom" when there are tools
PICKY = (
    "{%- for m in messages -%}{%- if m.content is string -%}"
    "{%- if 'kaboom' in m.content -%}{{ raise_exception('no kaboom here') }}"
    "{%- elif 'boom' in m.content and tools -%}"
    "{{ raise_exception('boom does not go with tools') }}{%- endif -%}"
    "{%- endif -%}{%- endfor -%}"
)
# `instructions` are a first message and an assistant's text and two calls are one message,
# so the failing message (the fourth) is not the failing item (input[4])
SHIFTED: dict[str, Any] = {
    "instructions": "be brief",
    "input": [
        {"type": "message", "role": "user", "content": "hi", "id": "msg_hi"},
        {
            "type": "message",
            "role": "assistant",
            "id": "msg_look",
            "content": [{"type": "output_text", "text": "let me look"}],
        },
        {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call", "id": "fc_2", "call_id": "c2", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "id": "fco_1", "call_id": "c1", "output": "kaboom"},
        {"type": "function_call_output", "id": "fco_2", "call_id": "c2", "output": "fine"},
    ],
}
NAMED = "at input[4] (function_call_output, id fco_1): no kaboom here"


async def picky_proxy(
    tmp_path: Path, sim_factory: SimFactory, proxy_factory: ProxyFactory
) -> tuple[Path, Sim, Proxy]:
    picky = tmp_path / "picky.jinja"
    picky.write_text(PICKY + Path(TEMPLATE).read_text())
    sim = await sim_factory()
    proxy = await proxy_factory(
        sim.url, upstream__api="tokens", upstream__chat_template_file=str(picky)
    )
    await wait_ready(proxy)
    return picky, sim, proxy


async def test_a_template_failure_names_the_input_item_over_websocket(
    tmp_path: Path, sim_factory: SimFactory, proxy_factory: ProxyFactory
) -> None:
    picky, sim, proxy = await picky_proxy(tmp_path, sim_factory, proxy_factory)
    async with connect(proxy.ws) as ws:
        events = await ws_turn(ws, **SHIFTED)
        assert [e["type"] for e in events] == ["error"], events
        err = events[0]
        assert err["status"] == 400 and err["error"]["code"] == "chat_template_error"
        message = err["error"]["message"]
        assert str(picky) in message and NAMED in message, message
        assert "message 4" not in message  # the translated list is not what the client sent
        # an item of the history: it was fine without tools, and is not with them
        boom = {"type": "message", "role": "user", "content": "boom", "id": "msg_boom"}
        first = (await ws_turn(ws, input=[boom]))[-1]
        assert first["type"] == "response.completed", first
        asked = len(sim.state.requests)
        tools = [{"type": "function", "name": "f", "parameters": {"type": "object"}}]
        parent = first["response"]["id"]
        events = await ws_turn(ws, input="next", previous_response_id=parent, tools=tools)
        assert [e["type"] for e in events] == ["error"], events
        message = events[0]["error"]["message"]
        history = "at item 0 of the conversation's history (message, role user, id msg_boom)"
        assert history in message and "boom does not go with tools" in message, message
        assert len(sim.state.requests) == asked  # the model server was never asked


@pytest.mark.parametrize("stream", [False, True])
async def test_a_template_failure_names_the_input_item_over_http(
    stream: bool, tmp_path: Path, sim_factory: SimFactory, proxy_factory: ProxyFactory
) -> None:
    picky, _, proxy = await picky_proxy(tmp_path, sim_factory, proxy_factory)
    status, doc = await post_responses(proxy, {"model": "sim", "stream": stream, **SHIFTED})
    assert status == 400, doc
    assert doc["error"]["code"] == "chat_template_error"
    assert str(picky) in doc["error"]["message"] and NAMED in doc["error"]["message"]


async def test_a_server_that_is_no_token_engine_is_not_ready(proxy_factory: ProxyFactory) -> None:
    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    app = web.Application()
    app.router.add_get("/v1/models", models)
    served = await serve(app)
    try:
        proxy = await proxy_factory(f"{served.base}/v1", upstream__api="tokens")

        async def probed() -> dict[str, Any] | None:
            status, doc = await get_json(f"{proxy.served.base}/readyz")
            reasons = " ".join(doc.get("reasons", []))
            return doc if status == 503 and "none of the token engines" in reasons else None

        await until(probed, message="/readyz never named the missing engine")
        _, health = await get_json(f"{proxy.served.base}/healthz")
        assert health["dialect"] == "tokens" and health["token_engine"] is None
        assert "none of the token engines" in health["token_engine_problem"]
        async with connect(proxy.ws) as ws:
            events = await ws_turn(ws, input="hello")
        assert [e["type"] for e in events] == ["error"], events
        assert events[0]["status"] == 503
        assert events[0]["error"]["code"] == "upstream_not_ready"
        assert "none of the token engines" in events[0]["error"]["message"]
    finally:
        await served.runner.cleanup()


# ------------------------------------------------------------------ the trajectory route


async def test_the_tokens_route_answers_only_stored_token_responses_of_the_credential(
    sim_factory: SimFactory, proxy_factory: ProxyFactory
) -> None:
    sim = await sim_factory()
    tokens = await proxy_factory(sim.url, **engine_settings("auto"))
    chat = await proxy_factory(sim.url, upstream__api="chat")
    await wait_ready(tokens)
    mine = {"Authorization": "Bearer key-a"}
    theirs = {"Authorization": "Bearer key-b"}
    async with connect(tokens.ws, additional_headers=mine) as ws:
        kept = (await ws_turn(ws, input="kept"))[-1]["response"]["id"]
        unkept = (await ws_turn(ws, input="not kept", store=False))[-1]["response"]["id"]
    async with connect(chat.ws, additional_headers=mine) as ws:
        chatted = await ws_turn(ws, input="on the chat path")
    assert chatted[-1]["type"] == "response.completed", chatted[-1]

    status, doc = await token_record(tokens, kept, mine)
    assert status == 200 and doc["object"] == "response.tokens" and doc["prompt_token_ids"]
    status, doc = await token_record(tokens, unkept, mine)
    assert status == 404 and doc["error"]["code"] == "not_found"
    status, doc = await token_record(tokens, kept, theirs)
    assert status == 404 and doc["error"]["code"] == "not_found"
    status, doc = await token_record(chat, chatted[-1]["response"]["id"], mine)
    assert status == 404 and doc["error"]["code"] == "no_token_ids", doc


# ------------------------------------------------------------------ the Redis store


async def test_a_second_wsmode_on_shared_redis_reuses_the_ids(
    sim_factory: SimFactory, proxy_factory: ProxyFactory, redis_server: RedisServer
) -> None:
    sim = await sim_factory()
    shared = {"store__backend": "redis", "store__redis_url": redis_server.url}
    first = await proxy_factory(sim.url, **engine_settings("auto"), **shared)
    second = await proxy_factory(sim.url, **engine_settings("auto"), **shared)
    await wait_ready(first)
    await wait_ready(second)
    chain: list[str] = []
    async with connect(first.ws) as ws:
        for i in range(5):
            previous = chain[-1] if chain else None
            events = await ws_turn(ws, input=f"note number {i}", previous_response_id=previous)
            assert events[-1]["type"] == "response.completed", events[-1]
            chain.append(events[-1]["response"]["id"])
    before = await counts(second)
    async with connect(second.ws) as ws:
        events = await ws_turn(ws, input="from the other process", previous_response_id=chain[-1])
    assert events[-1]["type"] == "response.completed", events[-1]
    p4, g4 = await trajectory(second, chain[-1])  # the other process reads the ids too
    assert (p4, g4) == await trajectory(first, chain[-1])
    p5, g5 = await trajectory(second, events[-1]["response"]["id"])
    assert p5[: len(p4) + len(g4)] == p4 + g4
    assert output_text(events[-1]["response"]) == (await detokenize(sim.served.base, g5)).strip()
    used = delta(await counts(second), before)
    assert used["reused"] == len(p4) + len(g4)
    assert used["history_changed"] == used["generation_rerendered"] == used["fingerprint"] == 0

    # what one record holds: its own turn's ids, not the chain's, at a bounded size per id
    # (docs/store.md "What it costs")
    p0, g0 = await trajectory(first, chain[0])
    p3, g3 = await trajectory(first, chain[3])
    one, five = stored_tokens(redis_server, chain[0]), stored_tokens(redis_server, chain[4])
    assert one.ids == len(p0) + len(g0)
    assert five.ids == len(p4) + len(g4) - len(p3) - len(g3)
    assert len(p4) > 4 * len(p0)  # the chain's prompt has grown fivefold by turn 5
    for s in (one, five):
        assert s.field_bytes <= MAX_BYTES_PER_ID * s.ids + FIXED_BYTES, s
        assert s.id_bytes <= 7 * s.ids, s

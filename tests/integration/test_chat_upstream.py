"""A Chat-Completions-only upstream behind wsmode passes the same client tests as a Responses
upstream: the openai SDK over WebSocket mode and over HTTP (streaming and not), the
`websockets` library, faults. The upstream is the simulated model's /v1/chat/completions."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import orjson
import pytest
from openai import OpenAI
from websockets.asyncio.client import connect
from wsmode.sim.app import SIM_STATE, SimState, create_sim_app
from wsmode.sim.chat import chat_completions

from tests.support.event_checks import check_sequence
from tests.support.helpers import (
    FAST_SIM,
    Proxy,
    Sim,
    create,
    post_responses,
    recv,
    sdk_terminal,
    seconds,
    send,
    serve,
    until_terminal,
    user,
)

TOOLS = [
    {
        "type": "function",
        "name": "run_tests",
        "description": "Run the test suite",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
    }
]
TERMINAL = ("response.completed", "response.failed", "response.incomplete", "error")
ProxyFactory = Callable[..., Awaitable[Proxy]]


@pytest.fixture
async def chat_proxy(sim: Sim, proxy_factory: ProxyFactory) -> Proxy:
    return await proxy_factory(sim.url, upstream__api="chat")


def _types(events: list[dict[str, Any]]) -> list[str]:
    out: list[str] = []
    for ev in events:
        if not out or out[-1] != ev["type"] or not ev["type"].endswith(".delta"):
            out.append(ev["type"])
    return out


# ------------------------------------------------------------------ WebSocket mode


async def test_same_canonical_sequence_as_a_responses_upstream(
    sim: Sim, chat_proxy: Proxy, proxy: Proxy
) -> None:
    """The client cannot tell the dialects apart: same event types, same object fields."""
    seen = {}
    for name, px in (("chat", chat_proxy), ("responses", proxy)):
        async with connect(px.ws) as ws:
            await send(ws, create(input="hello", store=False))
            seen[name] = await until_terminal(ws)
    chat, resp = seen["chat"], seen["responses"]
    assert _types(chat) == _types(resp)
    assert [e["sequence_number"] for e in chat] == list(range(len(chat)))
    summary = check_sequence(chat)
    assert chat[-1]["response"].keys() == resp[-1]["response"].keys()
    assert summary.text == "".join(e["delta"] for e in chat if e["type"].endswith("text.delta"))
    assert summary.terminal["store"] is False and summary.terminal["usage"]["output_tokens"] == 8
    upstream = sim.bodies()[0]
    assert upstream["messages"] == [{"role": "user", "content": "hello"}]
    assert upstream["stream"] is True and upstream["stream_options"] == {"include_usage": True}
    assert not {"input", "store", "previous_response_id"} & upstream.keys()


async def test_sdk_warmup_then_chained_turn(
    chat_proxy: Proxy, sim: Sim, openai_client: Any
) -> None:
    client = openai_client(chat_proxy.http, api_key="sk-test")
    async with client.responses.connect() as conn:
        await conn.response.create(model="sim", input="Say hi", generate=False, store=False)
        warm = await sdk_terminal(conn)
        assert warm.type == "response.completed" and warm.response.output == []
        await conn.response.create(
            model="sim",
            input="more",
            previous_response_id=warm.response.id,
            store=False,
            instructions="Be brief.",
        )
        done = await sdk_terminal(conn)
    assert done.type == "response.completed"
    assert done.response.output_text and done.response.previous_response_id == warm.response.id
    assert sim.bodies()[0]["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Say hi"},
        {"role": "user", "content": "more"},
    ]


async def test_sdk_twenty_turn_tool_loop_store_false(
    chat_proxy: Proxy, sim: Sim, openai_client: Any
) -> None:
    """Each turn sends only a function_call_output plus previous_response_id; the Chat
    upstream must receive the whole conversation as messages every time."""
    client = openai_client(chat_proxy.http, api_key="sk-test")
    new_input: list[Any] = [user("Fix the failing build.")]
    messages: list[Any] = [{"role": "user", "content": "Fix the failing build."}]
    items = 1
    previous: str | None = None
    async with client.responses.connect() as conn:
        for turn in range(20):
            params: dict[str, Any] = {
                "model": "sim",
                "input": new_input,
                "tools": TOOLS,
                "tool_choice": "required",
                "store": False,
            }
            if previous:
                params["previous_response_id"] = previous
            await conn.response.create(**params)
            done = await sdk_terminal(conn)
            assert done.type == "response.completed", done
            sent = sim.bodies()[turn]
            assert sent["messages"] == messages, f"turn {turn}: upstream history is wrong"
            assert sent["tools"][0]["function"]["name"] == "run_tests"
            assert sent["tool_choice"] == "required"
            call = done.response.output[0]
            assert call.type == "function_call" and call.name == "run_tests"
            assert orjson.loads(call.arguments)["n"] == items  # the sim counted the history
            result = {"type": "function_call_output", "call_id": call.call_id, "output": "ok"}
            fn = {"name": call.name, "arguments": call.arguments}
            messages += [
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"id": call.call_id, "type": "function", "function": fn}],
                },
                {"role": "tool", "tool_call_id": call.call_id, "content": "ok"},
            ]
            items += 2
            new_input = [result]
            previous = done.response.id
    assert len(sim.bodies()) == 20


async def test_sync_sdk_client(chat_proxy: Proxy) -> None:
    def run() -> str:
        with (
            OpenAI(base_url=chat_proxy.http, api_key="sk-test") as client,
            client.responses.connect() as conn,
        ):
            conn.response.create(model="sim", input="hi", store=False)
            for ev in conn:
                if ev.type in TERMINAL:
                    assert ev.type == "response.completed"
                    return str(ev.response.output_text)
        raise AssertionError("no terminal event")

    assert await asyncio.wait_for(asyncio.to_thread(run), seconds(10))


async def test_reasoning_parallel_calls_and_their_history(
    sim: Sim, proxy_factory: ProxyFactory
) -> None:
    px = await proxy_factory(sim.url, upstream__api="chat", chat__reasoning="reasoning_content")
    sim.state.faults.append("parallel:3")
    async with connect(px.ws) as ws:
        await send(
            ws,
            create(
                input="go",
                tools=TOOLS,
                tool_choice="required",
                reasoning={"effort": "low"},
                store=False,
            ),
        )
        events = await until_terminal(ws)
        summary = check_sequence(events)
        assert [i["type"] for i in summary.items] == ["reasoning", *["function_call"] * 3]
        assert summary.reasoning == "Let me think."
        # the three calls' fragments interleave on the wire
        order = [e["output_index"] for e in events if e["type"].endswith("arguments.delta")]
        assert order == [1, 2, 3, 1, 2, 3]
        outputs = [
            {"type": "function_call_output", "call_id": c["call_id"], "output": str(i)}
            for i, c in enumerate(summary.calls)
        ]
        await send(
            ws,
            create(
                input=outputs,
                tools=TOOLS,
                tool_choice="none",
                store=False,
                previous_response_id=summary.terminal["id"],
            ),
        )
        second = check_sequence(await until_terminal(ws))
    assert second.text
    msgs = sim.bodies()[1]["messages"]
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "tool", "tool"]
    assert msgs[1]["reasoning_content"] == "Let me think."
    assert [tc["id"] for tc in msgs[1]["tool_calls"]] == [c["call_id"] for c in summary.calls]
    assert [m.get("tool_call_id") for m in msgs[2:]] == [c["call_id"] for c in summary.calls]


async def test_namespace_tools_round_trip(chat_proxy: Proxy, sim: Sim) -> None:
    tools = [
        {
            "type": "namespace",
            "name": "agents",
            "description": "sub-agents",
            "tools": [{"type": "function", "name": "spawn", "parameters": {"type": "object"}}],
        },
        {"type": "web_search", "external_web_access": False},
    ]
    async with connect(chat_proxy.ws) as ws:
        await send(ws, create(input="x", tools=tools, tool_choice="required", store=False))
        first = check_sequence(await until_terminal(ws))
        call = first.calls[0]
        assert (call["name"], call["namespace"]) == ("spawn", "agents")
        out = {"type": "function_call_output", "call_id": call["call_id"], "output": "ok"}
        await send(
            ws,
            create(
                input=[out],
                tools=tools,
                tool_choice="none",
                store=False,
                previous_response_id=first.terminal["id"],
            ),
        )
        assert (await until_terminal(ws))[-1]["type"] == "response.completed"
    sent = sim.bodies()
    assert [t["function"]["name"] for t in sent[0]["tools"]] == ["agents__spawn"]
    assert sent[1]["messages"][1]["tool_calls"][0]["function"]["name"] == "agents__spawn"


async def test_strict_tools_rejects_a_hosted_tool(sim: Sim, proxy_factory: ProxyFactory) -> None:
    px = await proxy_factory(sim.url, upstream__api="chat", chat__strict_tools=True)
    async with connect(px.ws) as ws:
        await send(ws, create(input="x", tools=[{"type": "web_search"}]))
        err = await recv(ws)
        assert err["type"] == "error" and err["status"] == 400
        assert err["error"]["code"] == "unsupported_value" and err["error"]["param"] == "tools"
        await send(ws, create(input="x", tools=TOOLS))  # the socket works on
        assert (await until_terminal(ws))[-1]["type"] == "response.completed"
    assert len(sim.bodies()) == 1


@pytest.mark.parametrize(
    ("fault", "kind", "reason"),
    [
        ("finish:length", "response.incomplete", "max_output_tokens"),
        ("finish:content_filter", "response.incomplete", "content_filter"),
        ("nousage", "response.completed", None),
        ("nodone", "response.completed", None),
    ],
)
async def test_finish_reasons_and_tolerated_endings(
    chat_proxy: Proxy, sim: Sim, fault: str, kind: str, reason: str | None
) -> None:
    sim.state.faults.append(fault)
    async with connect(chat_proxy.ws) as ws:
        await send(ws, create(input="x", store=False))
        events = await until_terminal(ws)
        check_sequence(events)
        assert events[-1]["type"] == kind
        final = events[-1]["response"]
        assert final["incomplete_details"] == ({"reason": reason} if reason else None)
        # usage the upstream did not send is the proxy's own estimate (README "Compaction and
        # context windows"): a client sees counts even from a server that reports none
        assert final["usage"]["output_tokens"] > 0 and final["usage"]["input_tokens"] > 0
        # an incomplete response is cached like a completed one: the chain goes on
        await send(ws, create(input="y", store=False, previous_response_id=final["id"]))
        assert (await until_terminal(ws))[-1]["type"] == "response.completed"


async def test_max_output_tokens_cuts_with_incomplete(chat_proxy: Proxy, sim: Sim) -> None:
    async with connect(chat_proxy.ws) as ws:
        await send(ws, create(input="x", max_output_tokens=3, store=False))
        events = await until_terminal(ws)
    assert events[-1]["type"] == "response.incomplete"
    assert sim.bodies()[0]["max_tokens"] == 3 == sim.bodies()[0]["max_completion_tokens"]
    assert events[-1]["response"]["output"][0]["status"] == "incomplete"


@pytest.mark.parametrize("fault", ["cut:4", "error:4", "eof:4"])
async def test_upstream_failure_mid_stream_then_next_turn_works(
    chat_proxy: Proxy, sim: Sim, fault: str
) -> None:
    async with connect(chat_proxy.ws) as ws:
        await send(ws, create(input=[user("one")], store=False))
        first = (await until_terminal(ws))[-1]["response"]
        sim.state.faults.append(fault)
        await send(ws, create(input=[user("two")], previous_response_id=first["id"], store=False))
        events = await until_terminal(ws)
        failed, err = events[-1], await recv(ws)
        assert failed["type"] == "response.failed" and err["type"] == "error"
        assert [e["sequence_number"] for e in [*events, err]] == list(range(len(events) + 1))
        if fault == "error:4":
            assert err["error"]["message"] == "simulated mid-stream error"
        else:
            assert err["status"] == 502
        # the failed continuation evicted its parent (docs/protocol.md "Continuing and eviction"); a
        # new chain works
        await send(ws, create(input=[user("x")], previous_response_id=first["id"]))
        assert (await recv(ws))["error"]["code"] == "previous_response_not_found"
        await send(ws, create(input=[user("three")], store=False))
        assert (await until_terminal(ws))[-1]["type"] == "response.completed"


async def test_upstream_http_error_before_stream(chat_proxy: Proxy, sim: Sim) -> None:
    sim.state.faults.append("status:503")
    async with connect(chat_proxy.ws) as ws:
        await send(ws, create(input="x"))
        err = await recv(ws)
    assert err["type"] == "error" and err["status"] == 503
    assert err["error"]["message"] == "simulated upstream failure 503"


async def test_stall_hits_read_timeout(sim: Sim, proxy_factory: ProxyFactory) -> None:
    px = await proxy_factory(sim.url, upstream__api="chat", upstream__read_timeout=0.5)
    sim.state.faults.append("stall:3")
    async with connect(px.ws) as ws:
        await send(ws, create(input="x"))
        events = await until_terminal(ws)
        err = await recv(ws)
    assert events[-1]["type"] == "response.failed" and err["error"]["code"] == "upstream_timeout"


# ------------------------------------------------------------------ HTTP front


async def _post(px: Proxy, body: dict[str, Any]) -> tuple[int, Any]:
    return await post_responses(px, body, {"Authorization": "Bearer k"})


async def test_http_streaming_and_not(chat_proxy: Proxy, sim: Sim) -> None:
    status, events = await _post(chat_proxy, {"model": "sim", "input": "hi", "stream": True})
    assert status == 200
    docs = [orjson.loads(e.data) for e in events]
    assert [e.event for e in events] == [d["type"] for d in docs]
    check_sequence(docs)
    status, doc = await _post(chat_proxy, {"model": "sim", "input": [user("a")]})
    assert status == 200 and doc["status"] == "completed" and doc["store"] is True
    status, second = await _post(
        chat_proxy, {"model": "sim", "input": [user("b")], "previous_response_id": doc["id"]}
    )
    assert status == 200 and second["previous_response_id"] == doc["id"]
    assert [m["role"] for m in sim.bodies()[-1]["messages"]] == ["user", "assistant", "user"]


async def test_openai_sdk_over_http(chat_proxy: Proxy, openai_client: Any) -> None:
    client = openai_client(chat_proxy.http, api_key="sk-a")
    first = await client.responses.create(model="sim", input="hi")
    assert first.output_text
    stream = await client.responses.create(
        model="sim", input="more", previous_response_id=first.id, stream=True
    )
    async with asyncio.timeout(seconds(10)):
        kinds = [ev.type async for ev in stream]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    async with (
        asyncio.timeout(seconds(10)),
        client.responses.stream(model="sim", input="helper") as s,
    ):
        final = await s.get_final_response()
    assert final.output_text and final.status == "completed"
    fetched = await client.responses.retrieve(first.id)
    assert fetched.id == first.id and fetched.output_text == first.output_text


async def test_http_errors_keep_their_shape(sim: Sim, proxy_factory: ProxyFactory) -> None:
    px = await proxy_factory(sim.url, upstream__api="chat", chat__strict_tools=True)
    status, err = await _post(px, {"model": "sim", "input": "x", "tools": [{"type": "web_search"}]})
    assert status == 400 and err["error"]["code"] == "unsupported_value"
    sim.state.faults.append("cut:4")
    status, events = await _post(px, {"model": "sim", "input": "x", "stream": True})
    assert [e.event for e in events[-2:]] == ["response.failed", "error"]


# ------------------------------------------------------------------ upstream.api = "auto"


async def _chat_only_sim() -> tuple[Any, SimState]:
    app = create_sim_app(FAST_SIM, responses=False)
    return await serve(app, handler_cancellation=True), app[SIM_STATE]


async def _health(px: Proxy) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http, http.get(f"{px.served.base}/healthz") as r:
        doc = await r.json()
        assert isinstance(doc, dict)
        return doc


async def test_auto_probe_picks_chat_for_a_chat_only_server(proxy_factory: ProxyFactory) -> None:
    served, state = await _chat_only_sim()
    try:
        px = await proxy_factory(f"{served.base}/v1", upstream__api="auto")
        assert (await _health(px))["dialect"] == "chat (auto)"
        async with connect(px.ws) as ws:
            await send(ws, create(input="hi"))
            assert (await until_terminal(ws))[-1]["type"] == "response.completed"
        assert "messages" in state.requests[-1]["body"]
    finally:
        await served.runner.cleanup()


async def test_auto_probe_picks_responses_when_it_exists(
    sim: Sim, proxy_factory: ProxyFactory
) -> None:
    px = await proxy_factory(sim.url, upstream__api="auto")
    assert (await _health(px))["dialect"] == "responses (auto)"


async def test_auto_decided_by_the_first_request(proxy_factory: ProxyFactory) -> None:
    """The probe is inconclusive (401 without a key); the first request's 404 decides, and
    that request is resent as Chat."""
    from aiohttp import web

    state = SimState(FAST_SIM)
    seen: list[str] = []

    async def responses(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization", ""))
        status = 404 if request.headers.get("Authorization") else 401
        return web.json_response({"error": {"message": "no"}}, status=status)

    async def chat(request: web.Request) -> web.StreamResponse:
        return await chat_completions(request, state)

    app = web.Application()
    app.router.add_post("/v1/responses", responses)
    app.router.add_post("/v1/chat/completions", chat)
    served = await serve(app, handler_cancellation=True)
    try:
        px = await proxy_factory(f"{served.base}/v1", upstream__api="auto")
        assert (await _health(px))["dialect"] == "auto (undecided)"
        async with connect(px.ws, additional_headers={"Authorization": "Bearer k"}) as ws:
            await send(ws, create(input="hi"))
            events = await until_terminal(ws)
            assert events[-1]["type"] == "response.completed", events[-1]
            check_sequence(events)
            await send(ws, create(input="again"))
            assert (await until_terminal(ws))[-1]["type"] == "response.completed"
        assert (await _health(px))["dialect"] == "chat (auto)"
        assert seen == ["", "Bearer k"]  # the probe, then one refused request, never again
        assert len(state.requests) == 2
    finally:
        await served.runner.cleanup()


def test_native_previous_response_id_needs_the_responses_api() -> None:
    from wsmode.config import ConfigError, load_settings

    with pytest.raises(ConfigError, match="native_previous_response_id"):
        load_settings(
            None, {}, {"upstream.api": "chat", "upstream.native_previous_response_id": True}
        )

"""WebSocket mode in front of a stateless Responses upstream, with the `websockets` library
as an independent client and the simulated model as the upstream."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from websockets.asyncio.client import connect

from tests.support.helpers import Proxy, Sim, create, recv, send, until, until_terminal, user

CANONICAL_TEXT = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
]


def _types(events: list[dict[str, Any]]) -> list[str]:
    out: list[str] = []
    for ev in events:
        if not out or out[-1] != ev["type"] or ev["type"] != "response.output_text.delta":
            out.append(ev["type"])
    return out


async def test_full_canonical_sequence_and_complete_response(proxy: Proxy, sim: Sim) -> None:
    async with connect(proxy.ws) as ws:
        await send(ws, create(input="hello", store=False))
        events = await until_terminal(ws)
    assert _types(events) == CANONICAL_TEXT
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert all("stream_id" not in e for e in events)
    done = events[-1]["response"]
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert done["output"][0]["content"][0]["text"] == text
    assert done["status"] == "completed" and done["usage"]["output_tokens"] == 8
    # the client asked store:false; the object says what the client asked, not what we sent
    assert done["store"] is False and done["previous_response_id"] is None
    assert sim.bodies()[0]["stream"] is True


async def test_chained_turns_send_full_history_upstream(proxy: Proxy, sim: Sim) -> None:
    async with connect(proxy.ws) as ws:
        await send(ws, create(input=[user("one")], instructions="first", store=False))
        first = (await until_terminal(ws))[-1]["response"]
        await send(
            ws,
            create(input=[user("two")], previous_response_id=first["id"], store=False),
        )
        second = (await until_terminal(ws))[-1]["response"]
    assert second["previous_response_id"] == first["id"]
    upstream = sim.bodies()[1]
    assert upstream["input"] == [user("one"), *first["output"], user("two")]
    assert "previous_response_id" not in upstream
    assert "instructions" not in upstream  # instructions are never inherited
    assert upstream["store"] is False


async def test_ws_only_and_client_only_fields_never_reach_upstream(proxy: Proxy, sim: Sim) -> None:
    async with connect(proxy.ws) as ws:
        await send(
            ws,
            create(
                input="hi",
                stream=True,
                client_metadata={"trace": "x"},
                generate=True,
                stream_id="lane-1",
                prompt_cache_key="k",
            ),
        )
        events = await until_terminal(ws)
    assert events[-1]["type"] == "response.completed"
    assert all(e["stream_id"] == "lane-1" for e in events)
    body = sim.bodies()[0]
    for key in ("stream_id", "generate", "client_metadata", "type", "background"):
        assert key not in body
    assert body["prompt_cache_key"] == "k"  # unknown-to-us fields are kept


async def test_warmup_never_calls_upstream_and_is_chainable(proxy: Proxy, sim: Sim) -> None:
    dev = {"type": "message", "role": "developer", "content": "You are a coding agent."}
    async with connect(proxy.ws) as ws:
        await send(ws, create(input=[dev], generate=False, store=False, tools=[]))
        events = await until_terminal(ws)
        assert [e["type"] for e in events] == ["response.created", "response.completed"]
        warm = events[-1]["response"]
        assert warm["status"] == "completed" and warm["output"] == []
        assert warm["usage"]["total_tokens"] == 0
        assert sim.bodies() == []
        await send(ws, create(input=[user("go")], previous_response_id=warm["id"], store=False))
        turn = await until_terminal(ws)
    assert turn[-1]["type"] == "response.completed"
    assert sim.bodies()[0]["input"] == [dev, user("go")]


async def test_creates_are_queued_in_order(proxy: Proxy, sim: Sim) -> None:
    async with connect(proxy.ws) as ws:
        for i in range(3):
            await send(ws, create(input=f"q{i}", metadata={"i": str(i)}))
        seen = [await until_terminal(ws) for _ in range(3)]
    for i, events in enumerate(seen):
        # one response at a time: each starts with created and ends with its own completed
        assert events[0]["type"] == "response.created"
        assert events[-1]["response"]["metadata"] == {"i": str(i)}
        ids = {e["response"]["id"] for e in events if "response" in e}
        assert len(ids) == 1
    assert [b["input"][0]["content"] for b in sim.bodies()] == ["q0", "q1", "q2"]


async def test_previous_response_not_found_keeps_socket_open(proxy: Proxy) -> None:
    async with connect(proxy.ws) as ws:
        await send(ws, create(input="x", previous_response_id="resp_missing"))
        err = await recv(ws)
        assert err == {
            "type": "error",
            "status": 400,
            "error": {
                "type": "invalid_request_error",
                "code": "previous_response_not_found",
                "message": "Previous response with id 'resp_missing' not found.",
                "param": "previous_response_id",
            },
        }
        await send(ws, create(input="still here"))
        assert (await until_terminal(ws))[-1]["type"] == "response.completed"


@pytest.mark.parametrize(
    ("frame", "code", "param"),
    [
        ("{not json", "invalid_json", None),
        ("[1, 2]", "invalid_json", None),
        ('"response.create"', "invalid_json", None),
        ('{"model": "sim"}', "unknown_event_type", "type"),
        ('{"type": "response.frobnicate"}', "unknown_event_type", "type"),
        ('{"type": "response.create", "input": "x"}', "missing_required_parameter", "model"),
        ('{"type": "response.create", "model": "sim"}', "missing_required_parameter", "input"),
        ('{"type": "response.create", "model": 5, "input": "x"}', "invalid_type", "model"),
        ('{"type": "response.create", "model": "sim", "input": 5}', "invalid_type", "input"),
        ('{"type": "response.create", "model": "sim", "input": [1]}', "invalid_type", "input[0]"),
        (
            '{"type": "response.create", "model": "sim", "input": "x", "temperature": true}',
            "invalid_type",
            "temperature",
        ),
        (
            '{"type": "response.create", "model": "sim", "input": "x", "tools": {}}',
            "invalid_type",
            "tools",
        ),
        (
            '{"type": "response.create", "model": "sim", "input": "x", "background": true}',
            "unsupported_parameter",
            "background",
        ),
        (
            '{"type": "response.create", "model": "sim", "input": "x", "stream_id": "bad id!"}',
            "invalid_stream_id",
            "stream_id",
        ),
    ],
)
async def test_bad_frames_get_a_clear_error_and_socket_stays_open(
    proxy: Proxy, sim: Sim, frame: str, code: str, param: str | None
) -> None:
    async with connect(proxy.ws) as ws:
        await ws.send(frame)
        err = await recv(ws)
        assert err["type"] == "error" and err["status"] == 400
        assert err["error"]["code"] == code and err["error"]["param"] == param
        assert err["error"]["type"] == "invalid_request_error" and err["error"]["message"]
        assert "stream_id" not in err  # an invalid stream_id is never echoed
        await send(ws, create(input="next"))
        assert (await until_terminal(ws))[-1]["type"] == "response.completed"
    assert len(sim.bodies()) == 1  # no bad frame reached the upstream


async def test_bad_create_leaves_the_conversation_intact(proxy: Proxy, sim: Sim) -> None:
    async with connect(proxy.ws) as ws:
        await send(ws, create(input=[user("a")], store=False))
        first = (await until_terminal(ws))[-1]["response"]
        await send(ws, create(input=5, previous_response_id=first["id"]))
        assert (await recv(ws))["error"]["code"] == "invalid_type"
        await send(ws, create(input=[user("b")], previous_response_id=first["id"]))
        assert (await until_terminal(ws))[-1]["type"] == "response.completed"
    assert sim.bodies()[1]["input"] == [user("a"), *first["output"], user("b")]


async def test_binary_frame_closes_1003(proxy: Proxy) -> None:
    async with connect(proxy.ws) as ws:
        await ws.send(b'{"type": "response.create"}')
        await ws.wait_closed()
    assert ws.close_code == 1003


async def test_oversize_message_closes_1009(sim: Sim, proxy_factory: Any) -> None:
    proxy = await proxy_factory(sim.url, server__max_message_bytes=1024)
    async with connect(proxy.ws, max_size=None) as ws:
        await send(ws, create(input="x" * 2048))
        await ws.wait_closed()
    assert ws.close_code == 1009


async def test_message_under_the_bound_is_accepted(sim: Sim, proxy_factory: Any) -> None:
    proxy = await proxy_factory(sim.url, server__max_message_bytes=4096)
    async with connect(proxy.ws) as ws:
        await send(ws, create(input="x" * 2048))
        assert (await until_terminal(ws))[-1]["type"] == "response.completed"


async def test_upstream_http_error_before_stream(proxy: Proxy, sim: Sim) -> None:
    async with connect(proxy.ws) as ws:
        await send(ws, create(input=[user("a")], store=False))
        first = (await until_terminal(ws))[-1]["response"]
        sim.state.faults.append("status:503")
        await send(ws, create(input=[user("b")], previous_response_id=first["id"]))
        err = await recv(ws)
        assert err["type"] == "error" and err["status"] == 503
        assert err["error"]["message"] == "simulated upstream failure 503"
        # a failed same-lane continuation evicts its parent (docs/protocol.md "Continuing and
        # eviction")
        await send(ws, create(input=[user("c")], previous_response_id=first["id"]))
        assert (await recv(ws))["error"]["code"] == "previous_response_not_found"
        await send(ws, create(input=[user("d")]))
        assert (await until_terminal(ws))[-1]["type"] == "response.completed"


async def test_upstream_dies_mid_stream(proxy: Proxy, sim: Sim) -> None:
    async with connect(proxy.ws) as ws:
        await send(ws, create(input=[user("a")], store=False))
        first = (await until_terminal(ws))[-1]["response"]
        sim.state.faults.append("cut:5")
        await send(ws, create(input=[user("b")], previous_response_id=first["id"]))
        events = await until_terminal(ws)
        assert events[-1]["type"] == "response.failed"
        failed = events[-1]["response"]
        assert failed["status"] == "failed" and failed["error"]["code"] == "server_error"
        assert failed["error"]["wsmode_code"] == "upstream_unavailable"
        err = await recv(ws)
        assert err["type"] == "error" and err["status"] == 502
        assert err["error"]["code"] == "upstream_unavailable"
        seqs = [e["sequence_number"] for e in [*events, err]]
        assert seqs == list(range(len(seqs)))
        # the next turn works
        await send(ws, create(input=[user("c")], store=False))
        assert (await until_terminal(ws))[-1]["type"] == "response.completed"


async def test_upstream_sse_error_event_is_rewrapped(proxy: Proxy, sim: Sim) -> None:
    async with connect(proxy.ws) as ws:
        sim.state.faults.append("error:4")
        await send(ws, create(input="a"))
        events = await until_terminal(ws)
        assert events[-1]["type"] == "response.failed"
        err = await recv(ws)
    assert err["status"] == 500
    assert err["error"] == {
        "type": "server_error",
        "code": "server_error",
        "message": "simulated mid-stream error",
        "param": None,
    }


async def test_upstream_stream_ending_without_terminal(proxy: Proxy, sim: Sim) -> None:
    async with connect(proxy.ws) as ws:
        sim.state.faults.append("eof:4")
        await send(ws, create(input="a"))
        events = await until_terminal(ws)
        assert events[-1]["type"] == "response.failed"
        assert (await recv(ws))["status"] == 502


async def test_upstream_unreachable(proxy_factory: Any) -> None:
    proxy = await proxy_factory("http://127.0.0.1:9/v1")
    async with connect(proxy.ws) as ws:
        await send(ws, create(input="a"))
        err = await recv(ws)
    assert err["status"] == 502 and err["error"]["code"] == "upstream_unavailable"


async def test_upstream_stall_hits_read_timeout(sim: Sim, proxy_factory: Any) -> None:
    proxy = await proxy_factory(sim.url, upstream__read_timeout=0.3)
    async with connect(proxy.ws) as ws:
        sim.state.faults.append("stall:3")
        await send(ws, create(input="a"))
        events = await until_terminal(ws)
        assert events[-1]["type"] == "response.failed"
        err = await recv(ws)
        assert err["status"] == 502 and err["error"]["code"] == "upstream_timeout"
        await send(ws, create(input="b"))
        assert (await until_terminal(ws))[-1]["type"] == "response.completed"


async def test_a_stream_slower_than_the_read_timeout_in_all_is_not_cut(
    sim_factory: Any, proxy_factory: Any
) -> None:
    # the bound is on each silence, not on the answer: 30 tokens at 20/s take 1.5 s, each
    # gap 50 ms, against a 0.4 s bound (one timer per answer that must keep re-arming)
    sim = await sim_factory(tokens_per_second=20, output_tokens=30)
    proxy = await proxy_factory(sim.url, upstream__read_timeout=0.4)
    async with connect(proxy.ws) as ws:
        await send(ws, create(input="a"))
        events = await until_terminal(ws)
    assert events[-1]["type"] == "response.completed"
    assert sum(e["type"] == "response.output_text.delta" for e in events) >= 30


async def test_a_stall_after_paced_events_hits_the_read_timeout(
    sim_factory: Any, proxy_factory: Any
) -> None:
    # the silence starts after many separate reads of the body (not with the headers' read)
    sim = await sim_factory(tokens_per_second=40, output_tokens=30)
    proxy = await proxy_factory(sim.url, upstream__read_timeout=0.4)
    async with connect(proxy.ws) as ws:
        await send(ws, create(input="a", metadata={"sim_fault": "stall:12"}))
        events = await until_terminal(ws, timeout=5)
        assert 0 < sum(e["type"] == "response.output_text.delta" for e in events) < 30
        assert events[-1]["type"] == "response.failed"
        err = await recv(ws)
        assert err["status"] == 502 and err["error"]["code"] == "upstream_timeout"


async def test_an_upstream_that_never_answers_hits_the_read_timeout(proxy_factory: Any) -> None:
    # a model server that reads the request and never sends its headers
    taken: list[bytes] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        taken.append(await reader.read(65536))
        await reader.read()  # until wsmode gives up and closes
        writer.close()

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        proxy = await proxy_factory(f"http://127.0.0.1:{port}/v1", upstream__read_timeout=0.3)
        async with connect(proxy.ws) as ws:
            await send(ws, create(input="a"))
            events = await until_terminal(ws)
        assert events[-1]["type"] == "error"
        assert events[-1]["status"] == 504
        assert events[-1]["error"]["code"] == "upstream_timeout"
        assert "did not answer within 0.3s" in events[-1]["error"]["message"]
        assert [t for t in taken if t.startswith(b"POST /v1/responses")]
    finally:
        server.close()
        await server.wait_closed()


async def test_client_vanishing_cancels_upstream(sim_factory: Any, proxy_factory: Any) -> None:
    sim = await sim_factory(tokens_per_second=20, output_tokens=1000)
    proxy = await proxy_factory(sim.url)
    ws = await connect(proxy.ws)
    await send(ws, create(input="long answer please"))
    while (await recv(ws))["type"] != "response.output_text.delta":
        pass
    assert sim.state.active == 1
    ws.transport.abort()  # no close frame: the peer just vanishes
    await until(lambda: sim.state.cancelled == 1 and sim.state.active == 0)
    assert sim.state.cancelled == 1 and sim.state.active == 0
    assert sim.state.completed == 0


async def test_response_completed_larger_than_128k(sim_factory: Any, proxy_factory: Any) -> None:
    sim = await sim_factory(output_tokens=40_000)
    proxy = await proxy_factory(sim.url)
    async with connect(proxy.ws, max_size=None) as ws:
        await send(ws, create(input="big"))
        events = await until_terminal(ws, timeout=30)
    done = events[-1]
    assert done["type"] == "response.completed"
    assert len(orjson.dumps(done)) > 128 * 1024
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert done["response"]["output"][0]["content"][0]["text"] == text


async def test_connection_cache_entry_bound_evicts_lru(sim: Sim, proxy_factory: Any) -> None:
    proxy = await proxy_factory(sim.url, cache__connection_max_entries=2)
    async with connect(proxy.ws) as ws:
        ids = []
        for i in range(3):
            await send(ws, create(input=f"t{i}", store=False))
            ids.append((await until_terminal(ws))[-1]["response"]["id"])
        await send(ws, create(input="x", previous_response_id=ids[0]))
        assert (await recv(ws))["error"]["code"] == "previous_response_not_found"
        await send(ws, create(input="x", previous_response_id=ids[2]))
        assert (await until_terminal(ws))[-1]["type"] == "response.completed"


async def test_cache_is_per_connection(proxy: Proxy) -> None:
    async with connect(proxy.ws) as ws:
        await send(ws, create(input="a", store=False))
        rid = (await until_terminal(ws))[-1]["response"]["id"]
    async with connect(proxy.ws) as ws:
        await send(ws, create(input="b", previous_response_id=rid, store=False))
        assert (await recv(ws))["error"]["code"] == "previous_response_not_found"
    assert proxy.state.cache_budget.entries == 0  # closed sockets leave nothing behind


async def test_native_previous_response_id_falls_back_to_rebuild(
    sim: Sim, proxy_factory: Any
) -> None:
    proxy = await proxy_factory(sim.url, upstream__native_previous_response_id=True)
    async with connect(proxy.ws) as ws:
        await send(ws, create(input=[user("a")]))
        first = (await until_terminal(ws))[-1]["response"]
        await send(ws, create(input=[user("b")], previous_response_id=first["id"]))
        assert (await until_terminal(ws))[-1]["type"] == "response.completed"
    assert sim.bodies()[0]["store"] is True  # so that the upstream can continue natively
    native, rebuilt = sim.bodies()[1:]
    assert native["previous_response_id"] == first["id"]
    assert native["input"] == [user("b")] and native["store"] is True
    assert "previous_response_id" not in rebuilt
    assert rebuilt["input"] == [user("a"), *first["output"], user("b")]


async def test_native_mode_never_chains_store_false_upstream(sim: Sim, proxy_factory: Any) -> None:
    proxy = await proxy_factory(sim.url, upstream__native_previous_response_id=True)
    async with connect(proxy.ws) as ws:
        await send(ws, create(input=[user("a")], store=False))
        first = (await until_terminal(ws))[-1]["response"]
        await send(ws, create(input=[user("b")], previous_response_id=first["id"], store=False))
        await until_terminal(ws)
    assert len(sim.bodies()) == 2
    assert sim.bodies()[1]["input"] == [user("a"), *first["output"], user("b")]

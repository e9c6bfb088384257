"""Sidecar mode end to end: plain HTTP clients -> sidecar -> wsmode front -> simulated model.

The same 20-turn tool loop runs once against the simulated model directly (the HTTP path the
client would otherwise use) and once through the sidecar; every answer must be the same but
for ids and timestamps, while the sidecar -> front leg carries only each turn's new items.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import orjson
import pytest
from openai import AsyncOpenAI
from wsmode.core.sse import SSEDecoder

from tests.support.helpers import Proxy, Sidecar, Sim, seconds, until, user

TOOLS = [
    {
        "type": "function",
        "name": "run_tests",
        "description": "Run the test suite",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
    }
]
VOLATILE = frozenset({"id", "item_id", "created_at", "completed_at"})
TURNS = 20

# One turn: (base URL, request body) -> (what the client observed, the final response object)
Turn = Callable[[str, dict[str, Any]], Awaitable[tuple[Any, dict[str, Any]]]]


def strip(value: Any) -> Any:
    """Everything but ids and timestamps (they differ on every run by design)."""
    if isinstance(value, dict):
        return {k: strip(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [strip(v) for v in value]
    return value


async def sdk_turn(base: str, body: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    async with AsyncOpenAI(
        base_url=base, api_key="sk-test", max_retries=0, timeout=seconds(30)
    ) as client:
        r = await client.responses.create(**body)
    return r.model_dump(), r.model_dump(exclude_none=True)


async def sdk_stream_turn(base: str, body: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    async with (
        AsyncOpenAI(base_url=base, api_key="sk-test", max_retries=0, timeout=seconds(30)) as client,
        asyncio.timeout(seconds(10)),
    ):
        events = [ev async for ev in await client.responses.create(**body, stream=True)]
    final = events[-1]
    assert final.type == "response.completed", final
    return [e.model_dump() for e in events], final.response.model_dump(exclude_none=True)


async def http_turn(base: str, body: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    headers = {"Authorization": "Bearer sk-test"}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{base}/responses", json=body, headers=headers) as r,
    ):
        assert r.status == 200, await r.text()
        assert r.headers["Content-Type"].startswith("application/json")
        doc: dict[str, Any] = orjson.loads(await r.read())
    return doc, doc


async def http_stream_turn(base: str, body: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    headers = {"Authorization": "Bearer sk-test"}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{base}/responses", json={**body, "stream": True}, headers=headers) as r,
    ):
        assert r.status == 200, await r.text()
        assert r.headers["Content-Type"].startswith("text/event-stream")
        raw = await r.read()
    events = []
    for ev in SSEDecoder(1 << 24).feed(raw):
        if ev.data == b"[DONE]":  # the simulated model adds one; OpenAI's streams do not
            continue
        data = orjson.loads(ev.data)
        assert ev.event == data["type"]  # `event:` names every event
        events.append(data)
    assert events[-1]["type"] == "response.completed"
    return events, events[-1]["response"]


CLIENTS: dict[str, Turn] = {
    "openai-sdk": sdk_turn,
    "openai-sdk-stream": sdk_stream_turn,
    "aiohttp": http_turn,
    "aiohttp-stream": http_stream_turn,
}


async def tool_loop(
    base: str, turn: Turn, on_turn: Callable[[int, dict[str, Any]], None] | None = None
) -> list[Any]:
    """20 turns of `tool_choice: required`; every turn resends the whole history (the HTTP
    way) plus the tool's output. Returns what the client observed on each turn."""
    history: list[Any] = [user("Fix the failing build.")]
    seen = []
    for n in range(TURNS):
        body = {
            "model": "sim",
            "input": history,
            "tools": TOOLS,
            "tool_choice": "required",
            "store": False,
            "instructions": "You are a build engineer.",
        }
        if on_turn is not None:
            on_turn(n, body)
        observed, final = await turn(base, body)
        seen.append(observed)
        call = final["output"][0]
        assert call["type"] == "function_call"
        assert orjson.loads(call["arguments"])["n"] == len(history)  # the model saw it all
        result = {"type": "function_call_output", "call_id": call["call_id"], "output": "ok"}
        history = [*history, *final["output"], result]
    return seen


@pytest.mark.parametrize("kind", list(CLIENTS))
async def test_twenty_turn_tool_loop_same_answers_and_linear_upstream_bytes(
    kind: str,
    sim_factory: Callable[..., Awaitable[Sim]],
    proxy_factory: Callable[..., Awaitable[Proxy]],
    sidecar_factory: Callable[..., Awaitable[Sidecar]],
) -> None:
    direct_sim, path_sim = await sim_factory(), await sim_factory()
    front = await proxy_factory(path_sim.url)
    sidecar = await sidecar_factory(front.http)
    turn = CLIENTS[kind]

    direct = await tool_loop(direct_sim.url, turn)

    leg: list[int] = []  # bytes the front received from the sidecar, per turn
    full: list[int] = []  # bytes of the request the client sent the sidecar, per turn
    mark = [front.state.client_bytes_received]

    def measure(n: int, body: dict[str, Any]) -> None:
        if n:
            leg.append(front.state.client_bytes_received - mark[0])
            mark[0] = front.state.client_bytes_received
        full.append(len(orjson.dumps(body)))

    via_sidecar = await tool_loop(sidecar.http, turn, measure)
    leg.append(front.state.client_bytes_received - mark[0])

    # 1. the client sees the same answers, event for event
    assert strip(via_sidecar) == strip(direct)
    # 2. the model received the same conversation on every turn (the front rebuilt it)
    assert len(path_sim.bodies()) == len(direct_sim.bodies()) == TURNS
    for a, b in zip(path_sim.bodies(), direct_sim.bodies(), strict=True):
        assert strip(a["input"]) == strip(b["input"])
        assert a["instructions"] == b["instructions"] and a["tools"] == b["tools"]
    # 3. the sidecar -> front leg carried only deltas: the first turn whole, then turns
    #    of a bounded size while the history the client sends grows without bound
    assert sidecar.state.stats["full"] == 1 and sidecar.state.stats["delta"] == TURNS - 1
    assert sidecar.state.stats["http"] == 0
    assert leg[0] >= full[0]
    deltas = leg[1:]
    assert max(deltas) <= 1.1 * min(deltas), deltas
    assert full[-1] > 8 * max(deltas), (full[-1], deltas)
    # linear, not quadratic: the second half of the turns costs what the first half did
    half = len(deltas) // 2
    assert sum(deltas[half:]) <= 1.2 * sum(deltas[:half])
    assert sum(full[half + 1 :]) > 2 * sum(full[1 : half + 1])  # while the client's grew


async def test_sse_framing_is_event_and_data_lines(proxy: Proxy, sidecar_factory: Any) -> None:
    sidecar = await sidecar_factory(proxy.http)
    body = {"model": "sim", "input": "hello", "stream": True}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{sidecar.http}/responses", json=body) as r,
    ):
        assert r.status == 200
        assert r.headers["Content-Type"] == "text/event-stream; charset=utf-8"
        raw = await r.read()
    blocks = raw.split(b"\n\n")
    assert blocks[-1] == b""  # ends with a complete event, and no [DONE]
    names = []
    for block in blocks[:-1]:
        event, data = block.split(b"\n")
        assert event.startswith(b"event: ") and data.startswith(b"data: ")
        doc = orjson.loads(data.removeprefix(b"data: "))
        assert doc["type"] == event.removeprefix(b"event: ").decode()
        names.append(doc["type"])
        assert doc["sequence_number"] == len(names) - 1
    assert names[0] == "response.created" and names[-1] == "response.completed"


async def test_client_previous_response_id_is_forwarded_as_it_is(
    proxy: Proxy, sim: Sim, sidecar_factory: Any, openai_client: Any
) -> None:
    """A client that chains itself keeps doing so: its request goes on the socket whose
    connection-local cache holds that response, with only its own input."""
    sidecar = await sidecar_factory(proxy.http)
    client = openai_client(sidecar.http, api_key="sk-test", max_retries=0)
    first = await client.responses.create(model="sim", input=[user("one")], store=False)
    second = await client.responses.create(
        model="sim", input=[user("two")], previous_response_id=first.id, store=False
    )
    assert second.previous_response_id == first.id  # as the upstream reported it
    out = [o.model_dump(exclude_none=True) for o in first.output]
    assert sim.bodies()[1]["input"] == [user("one"), *out, user("two")]
    assert sidecar.state.stats["delta"] == 0 and sidecar.state.stats["http"] == 0


async def test_previous_response_not_found_resends_the_full_request_once(
    sim: Sim, proxy_factory: Any, sidecar_factory: Any
) -> None:
    """The front keeps nothing (a cache of zero entries): every continuation the sidecar
    makes is answered previous_response_not_found, and the full request follows, on the
    same socket, and the client never notices."""
    front = await proxy_factory(sim.url, cache__connection_max_entries=0, store__enabled=False)
    sidecar = await sidecar_factory(front.http)
    history: list[Any] = [user("go")]
    for _ in range(3):
        final = (await http_turn(sidecar.http, {"model": "sim", "input": history}))[1]
        history += [*final["output"], user("more")]
        assert final["previous_response_id"] is None
    stats = sidecar.state.stats
    assert stats["delta"] == 2 and stats["retry_full"] == 2 and stats["full"] == 3
    assert sidecar.state.pool.opened == 1  # one socket throughout
    assert [len(b["input"]) for b in sim.bodies()] == [1, 3, 5]


async def test_client_vanishing_mid_stream_cancels_upstream(
    sim_factory: Any, proxy_factory: Any, sidecar_factory: Any
) -> None:

    sim = await sim_factory(tokens_per_second=20, output_tokens=1000)
    front = await proxy_factory(sim.url)
    sidecar = await sidecar_factory(front.http)
    body = {"model": "sim", "input": "long answer please", "stream": True}
    http = aiohttp.ClientSession()
    r = await http.post(f"{sidecar.http}/responses", json=body)
    async with asyncio.timeout(seconds(10)):
        async for line in r.content:
            if line.startswith(b"event: response.output_text.delta"):
                break
    assert sim.state.active == 1
    r.close()  # the client goes away without reading the rest
    await http.close()
    await until(lambda: sim.state.cancelled == 1 and sim.state.active == 0)
    assert sim.state.cancelled == 1 and sim.state.active == 0 and sim.state.completed == 0
    await until(lambda: sidecar.state.pool.open_count == 0)
    assert sidecar.state.pool.open_count == 0  # that socket is not reused

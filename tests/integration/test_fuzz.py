"""Hypothesis against the real app: random and mutated client frames, random and mutated
upstream SSE. Whatever arrives, the proxy answers with a documented error or a well-formed
response, keeps the socket usable, leaks no task and no upstream connection, and leaves other
conversations exactly as they were."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed
from wsmode.core.sse import SSEDecoder
from wsmode.sim.events import response_events
from wsmode.sim.model import plan

from tests.support.fuzz_harness import Stack, start_stack
from tests.support.helpers import create, seconds, user

EXAMPLES = int(os.environ.get("WSMODE_FUZZ_EXAMPLES", "150"))
# 150 examples take about 4 s here: a second an example, and never less than the default
pytestmark = pytest.mark.timeout(seconds(max(120, EXAMPLES)))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

# Every code the proxy itself puts in an `error` event (docs/errors.md).
PROXY_CODES = {
    "invalid_json",
    "unknown_event_type",
    "missing_required_parameter",
    "invalid_type",
    "invalid_value",
    "unsupported_parameter",
    "invalid_stream_id",
    "websocket_stream_limit_reached",
    "previous_response_not_found",
    "too_many_queued_requests",
    "upstream_unavailable",
    "upstream_timeout",
    "upstream_overloaded",
    "upstream_event_too_large",
    "server_error",
}
TERMINAL = {"response.completed", "response.failed", "response.incomplete"}


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    s = start_stack(server__max_message_bytes=64 * 1024)
    yield s
    s.stop()


def check_error(ev: dict[str, Any], relayed: bool = False) -> None:
    """The documented envelope (docs/protocol.md "WebSocket-only events"); codes from our list
    unless relayed upstream."""
    assert set(ev) <= {"type", "status", "error", "stream_id", "sequence_number", "headers"}
    assert isinstance(ev["status"], int) and 400 <= ev["status"] <= 599, ev
    err = ev["error"]
    assert set(err) >= {"type", "code", "message", "param"}
    assert isinstance(err["type"], str) and isinstance(err["message"], str) and err["message"]
    assert err["code"] is None or isinstance(err["code"], str)
    if not relayed:
        assert err["code"] in PROXY_CODES, err


async def recv_json(
    ws: ClientConnection, timeout: float = 15, relayed: frozenset[bytes] = frozenset()
) -> dict[str, Any]:
    """The next frame, parsed. A frame that is not a JSON object with a `type` must be one
    the upstream sent verbatim (`relayed`): the Responses dialect forwards delta events
    without decoding them, so a corrupt upstream delta reaches the client as it was; the
    proxy itself never produces one."""
    raw = await asyncio.wait_for(ws.recv(), timeout)
    assert isinstance(raw, str), "text frames only"
    try:
        ev = orjson.loads(raw)
    except orjson.JSONDecodeError:
        ev = None
    if not (isinstance(ev, dict) and isinstance(ev.get("type"), str)):
        assert raw.encode() in relayed, f"the proxy made a malformed frame: {raw[:300]!r}"
        return {"type": "relayed"}
    return dict(ev)


async def until_marker(ws: ClientConnection, marker: str) -> list[dict[str, Any]]:
    """Read until the terminal event of the response whose metadata carries `marker`."""
    seen: list[dict[str, Any]] = []
    while True:
        ev = await recv_json(ws)
        seen.append(ev)
        resp = ev.get("response")
        if (
            ev["type"] in TERMINAL
            and isinstance(resp, dict)
            and (resp.get("metadata") or {}).get("marker") == marker
        ):
            return seen


async def control_turn(stack: Stack) -> tuple[ClientConnection, dict[str, Any]]:
    """A bystander conversation, one turn in, to continue after the fuzzing."""
    ws = await connect(stack.ws)
    await ws.send(orjson.dumps(create(input=[user("bystander")], store=False)).decode())
    while True:
        ev = await recv_json(ws)
        if ev["type"] in TERMINAL:
            assert ev["type"] == "response.completed"
            return ws, ev["response"]


async def bystander_continues(stack: Stack, ws: ClientConnection, first: dict[str, Any]) -> None:
    msg = create(input=[user("still here")], previous_response_id=first["id"], store=False)
    await ws.send(orjson.dumps(msg).decode())
    while True:
        ev = await recv_json(ws)
        if ev["type"] in TERMINAL:
            assert ev["type"] == "response.completed", ev
            break
    await ws.close()
    # the upstream got exactly the bystander's own history
    sent = stack.sim.runner.app[__import__("wsmode.sim.app", fromlist=["SIM_STATE"]).SIM_STATE]
    body = sent.requests[-1]["body"]
    assert body["input"] == [user("bystander"), *first["output"], user("still here")]


# ------------------------------------------------------------------ client frames

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)
FIELDS = [
    "type",
    "model",
    "input",
    "previous_response_id",
    "stream_id",
    "generate",
    "background",
    "store",
    "tools",
    "instructions",
    "metadata",
    "temperature",
    "stream",
    "tool_choice",
]


@st.composite
def mutated_create(draw: st.DrawFn) -> str:
    msg: dict[str, Any] = create(input=[user("hi")], store=False)
    for _ in range(draw(st.integers(0, 4))):
        key = draw(st.sampled_from(FIELDS))
        if draw(st.booleans()):
            msg.pop(key, None)
        else:
            msg[key] = draw(JSON | st.just("response.create") | st.just("resp_unknown"))
    msg.pop("metadata", None) if draw(st.booleans()) else None
    text = orjson.dumps(msg).decode()
    if draw(st.integers(0, 4)) == 0:  # byte-level damage
        i = draw(st.integers(0, len(text)))
        text = text[:i] + draw(st.text(max_size=5)) + text[i + draw(st.integers(0, 5)) :]
    return text


OVERSIZE = "<a frame over server.max_message_bytes>"  # expanded when sent: 1009
FRAMES = st.lists(
    mutated_create()
    | st.text(max_size=200)
    | JSON.map(lambda v: orjson.dumps(v).decode())
    | st.just(OVERSIZE),
    min_size=1,
    max_size=6,
)


@FUZZ
@given(frames=FRAMES)
def test_fuzzed_client_frames(stack: Stack, frames: list[str]) -> None:
    baseline = stack.on_server(stack.at_rest())
    assert baseline == stack.rest

    async def run() -> None:
        bystander, first = await control_turn(stack)
        try:
            await fuzz(bystander, first)
        finally:
            await bystander.close()

    async def fuzz(bystander: ClientConnection, first: dict[str, Any]) -> None:
        async with connect(stack.ws, max_size=None) as ws:
            closed = False
            for frame in frames:
                try:
                    await ws.send(frame)
                except ConnectionClosed:
                    closed = True
                    break
            if not closed:
                try:
                    await ws.send(
                        orjson.dumps(create(input="end", metadata={"marker": "end"})).decode()
                    )
                    events = await until_marker(ws, "end")
                except ConnectionClosed:
                    closed = True
            if closed:
                assert ws.close_code == 1009  # the only frame that closes is the oversize one
                assert any(len(f) > 64 * 1024 for f in frames)
            else:
                for ev in events:
                    if ev["type"] == "error":
                        check_error(ev)
                assert events[-1]["type"] == "response.completed"
        await bystander_continues(stack, bystander, first)

    asyncio.run(run())
    after = stack.on_server(stack.settled({**baseline}))
    assert after == baseline


# ------------------------------------------------------------------ upstream SSE


def valid_stream() -> bytes:
    body = {"model": "sim", "input": [user("fuzz")], "metadata": {"fuzz": "1"}, "stream": True}
    p = plan(body, seed=1, output_tokens=4, tool_calls_per_turn=1)
    out = b""
    for ev in response_events(body, p):
        out += b"event: " + ev["type"].encode() + b"\ndata: " + orjson.dumps(ev) + b"\n\n"
    return out + b"data: [DONE]\n\n"


VALID = valid_stream()


@st.composite
def mutated_sse(draw: st.DrawFn) -> bytes:
    data = VALID
    for _ in range(draw(st.integers(0, 5))):
        op = draw(st.integers(0, 4))
        i = draw(st.integers(0, len(data)))
        j = draw(st.integers(i, min(len(data), i + 200)))
        if op == 0:
            data = data[:i] + data[j:]  # delete
        elif op == 1:
            data = data[:i] + draw(st.binary(max_size=40)) + data[i:]  # insert garbage
        elif op == 2:
            data = data[:i] + data[i:j] + data[i:]  # duplicate
        elif op == 3:
            data = data[:i]  # truncate
        else:
            junk = draw(
                st.sampled_from(
                    [
                        b"data: {}\n\n",
                        b"data: [1,2]\n\n",
                        b"data: null\n\n",
                        b'data: {"type":"error","status":true}\n\n',
                        b'data: {"type":"error","error":{"code":5}}\n\n',
                        b'data: {"type":"response.completed","response":[]}\n\n',
                        b'data: {"type":"response.completed","response":{"output":7}}\n\n',
                        b'data: {"type":"response.output_item.done","item":{},'
                        b'"output_index":"x"}\n\n',
                        b": comment\r\n\r\n",
                        b"retry: 5\n\n",
                        b"\r\r\n\n",
                    ]
                )
            )
            data = data[:i] + junk + data[i:]
    return data


@st.composite
def chunked(draw: st.DrawFn, data: bytes) -> list[bytes]:
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=8)))
    pieces, last = [], 0
    for c in [*cuts, len(data)]:
        pieces.append(data[last:c])
        last = c
    return [p for p in pieces if p]


SSE = st.one_of(mutated_sse(), st.binary(max_size=400)).flatmap(
    lambda d: st.tuples(st.just(d), chunked(d))
)


@FUZZ
@given(stream=SSE)
def test_fuzzed_upstream_sse(stack: Stack, stream: tuple[bytes, list[bytes]]) -> None:
    data, chunks = stream
    stack.script.chunks = chunks
    decoder = SSEDecoder(1 << 20)
    relayed = frozenset(ev.data.strip() for ev in [*decoder.feed(data), *decoder.feed(b"\n\n")])
    baseline = stack.on_server(stack.at_rest())
    assert baseline == stack.rest

    async def run() -> None:
        bystander, first = await control_turn(stack)
        try:
            await fuzz(bystander, first)
        finally:
            await bystander.close()

    async def fuzz(bystander: ClientConnection, first: dict[str, Any]) -> None:
        async with connect(stack.ws, max_size=None) as ws:
            msg = create(input=[user("fuzz")], metadata={"fuzz": "1", "marker": "f"}, store=False)
            await ws.send(orjson.dumps(msg).decode())
            events: list[dict[str, Any]] = []
            while True:
                ev = await recv_json(ws, relayed=relayed)
                events.append(ev)
                if ev["type"] == "error":
                    check_error(ev, relayed=True)
                    break
                if ev["type"] in TERMINAL and isinstance(ev.get("response"), dict):
                    break  # a response.failed may be followed by an error: read below
            # the socket takes the next create, from the real model
            await ws.send(orjson.dumps(create(input="next", metadata={"marker": "n"})).decode())
            after = await until_marker(ws, "n")
            for ev in after:
                if ev["type"] == "error":
                    check_error(ev, relayed=True)
            assert after[-1]["type"] == "response.completed"
        await bystander_continues(stack, bystander, first)

    asyncio.run(run())
    after = stack.on_server(stack.settled({**baseline}))
    assert after == baseline

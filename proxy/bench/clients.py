"""Lean benchmark clients: one streamed HTTP turn, one WebSocket-mode turn.

Both are aiohttp (its WebSocket frame reader is compiled, so the client is not what limits a
relay measurement). Events are told apart by the `type` the simulated model writes first in
every event; only terminal events are parsed, as an agent reads the final response.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from ..core.sse import SSEDecoder
from .procs import BenchError

TERMINAL = frozenset({"response.completed", "response.failed", "response.incomplete", "error"})
DELTAS = frozenset({"response.output_text.delta", "response.function_call_arguments.delta"})
_TYPE_PREFIX = '{"type":"'
MAX_EVENT_BYTES = 256 * 1024 * 1024
MAX_MESSAGE_BYTES = 256 * 1024 * 1024
HEADERS = {"Content-Type": "application/json", "Authorization": "Bearer wsmode-bench"}


@dataclass
class Turn:
    sent: float  # perf_counter() when the request left
    first: float = 0.0  # first event
    done: float = 0.0  # terminal event
    events: int = 0
    deltas: int = 0
    response: dict[str, Any] = field(default_factory=dict)
    stamps: list[int] = field(default_factory=list)  # receive time minus sim_sent_ns, ns

    @property
    def ttfe(self) -> float:
        return self.first - self.sent

    @property
    def total(self) -> float:
        return self.done - self.sent


def event_type(text: str | bytes) -> str:
    """The event type of a frame, read from its first field when it is written first."""
    if isinstance(text, bytes):
        text = text.decode()
    if text.startswith(_TYPE_PREFIX):
        end = text.find('"', len(_TYPE_PREFIX))
        if end > 0:
            return text[len(_TYPE_PREFIX) : end]
    kind = orjson.loads(text).get("type")
    return kind if isinstance(kind, str) else ""


def _terminal(kind: str, data: str | bytes, turn: Turn) -> None:
    ev = orjson.loads(data)
    if kind != "response.completed":
        raise BenchError(f"the turn ended with {kind}: {str(ev)[:300]}")
    turn.response = ev["response"]


def _stamp(data: str | bytes, now_ns: int, turn: Turn) -> None:
    ev = orjson.loads(data)
    sent = ev.get("sim_sent_ns")
    if isinstance(sent, int):
        turn.stamps.append(now_ns - sent)


async def http_turn(
    session: aiohttp.ClientSession, url: str, body: bytes, *, stamps: bool = False
) -> Turn:
    """POST one streamed `/v1/responses` request and read its SSE stream to the end."""
    turn = Turn(time.perf_counter())
    async with session.post(url, data=body, headers=HEADERS) as resp:
        if resp.status != 200:
            raise BenchError(f"HTTP {resp.status}: {(await resp.read())[:300]!r}")
        decoder = SSEDecoder(MAX_EVENT_BYTES)
        async for chunk in resp.content.iter_any():
            for ev in decoder.feed(chunk):
                if ev.data == b"[DONE]":
                    continue
                now = time.perf_counter()
                if not turn.events:
                    turn.first = now
                turn.events += 1
                kind = ev.event or event_type(ev.data)
                if stamps:
                    _stamp(ev.data, time.monotonic_ns(), turn)
                if kind in DELTAS:
                    turn.deltas += 1
                elif kind in TERMINAL:
                    turn.done = now
                    _terminal(kind, ev.data, turn)
        if not turn.done:
            raise BenchError("the HTTP stream ended without a terminal event")
    return turn


async def ws_turn(
    ws: aiohttp.ClientWebSocketResponse, frame: bytes, *, stamps: bool = False
) -> Turn:
    """Send one `response.create` and read events up to the terminal one."""
    turn = Turn(time.perf_counter())
    await ws.send_frame(frame, aiohttp.WSMsgType.TEXT)
    while True:
        msg = await ws.receive()
        if msg.type is not aiohttp.WSMsgType.TEXT:
            raise BenchError(f"the socket answered {msg.type.name}: {msg.data!r}")
        now = time.perf_counter()
        if not turn.events:
            turn.first = now
        turn.events += 1
        data: str = msg.data
        kind = event_type(data)
        if stamps:
            _stamp(data, time.monotonic_ns(), turn)
        if kind in DELTAS:
            turn.deltas += 1
        elif kind in TERMINAL:
            turn.done = now
            _terminal(kind, data, turn)
            return turn


async def ws_connect(session: aiohttp.ClientSession, url: str) -> aiohttp.ClientWebSocketResponse:
    return await session.ws_connect(
        url,
        headers={"Authorization": HEADERS["Authorization"]},
        max_msg_size=MAX_MESSAGE_BYTES,
        autoping=True,
        compress=0,
    )


async def wait_ready(base: str, timeout: float) -> None:
    """Until `base`'s /readyz answers 200 (the token path probes its model server first)."""
    deadline, why = time.monotonic() + timeout, ""
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            async with session.get(f"{base}/readyz") as r:
                if r.status == 200:
                    return
                why = await r.text()
            await asyncio.sleep(0.2)
    raise BenchError(f"{base} was not ready within {timeout:g}s: {why[:300]}")

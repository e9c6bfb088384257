"""Scenario "fairness": one client floods its socket with small frames; another client's
turn latency, with the flood and without it (the target: flooded at most 2x alone).

One `wsmode serve` process in front of the simulated model (answers at once). The measured
client runs turns one after another on its own connection, in phases: alone, then while a
flooder (a separate process, so it does not share the measuring client's event loop) writes
pre-encoded frames as fast as its socket takes them and reads every answer; alone, flooded,
and so on, so that drift on a busy machine hits both sides alike. Each contender is one
proxy configuration: the defaults (`server.max_frames_per_second` 1000), and no read rate
(0), for comparison. Reported: each side's p50 and the ratio flooded / alone.

`python -m wsmode.bench.fairness PORT SECONDS` is the flooder.
"""

from __future__ import annotations

import asyncio
import base64
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson

from .clients import ws_connect, ws_turn
from .procs import BenchError, Server, Servers, free_port, sim_env, start_proxy, start_sim, together
from .stats import spread

FLOOD_FRAME = b'{"type":"no.such.event"}'  # answered with a small error by the proxy
FLOOD_RAMP_S = 0.1  # after the flooder says it floods, before the measured turns
CONTENDERS = {"read rate 1000/s (default)": "1000", "no read rate": "0"}


async def _flood(port: int, seconds: float) -> int:
    """Write masked text frames (a zero mask: RFC 6455 5.3 allows any key) for `seconds`."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    key = base64.b64encode(os.urandom(16)).decode()
    writer.write(
        f"GET /v1/responses HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
        "Authorization: Bearer wsmode-bench\r\n\r\n".encode()
    )
    head = await reader.readuntil(b"\r\n\r\n")
    if b" 101 " not in head.split(b"\r\n", 1)[0]:
        raise SystemExit(f"flooder: upgrade refused: {head[:80]!r}")
    print("flooding", flush=True)  # the measuring side waits for this line
    frame = bytes((0x81, 0x80 | len(FLOOD_FRAME))) + b"\0\0\0\0" + FLOOD_FRAME
    chunk = frame * 500

    async def drain_answers() -> None:
        while await reader.read(1 << 16):
            pass

    answers = asyncio.create_task(drain_answers())
    sent = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        writer.write(chunk)
        sent += 500
        await writer.drain()
    answers.cancel()
    writer.transport.abort()
    return sent


async def _phase(ws: aiohttp.ClientWebSocketResponse, frame: bytes, turns: int) -> list[float]:
    out = []
    for _ in range(turns):
        t = await asyncio.wait_for(ws_turn(ws, frame), 60)
        out.append(t.total)
    return out


async def _start(servers: Servers, rate: str) -> Server:
    """A sim and a `wsmode serve` with this read rate in front of it, side by side."""
    port = free_port()
    env = {"WSMODE_SERVER_MAX_FRAMES_PER_SECOND": rate, "WSMODE_SERVER_LOG_LEVEL": "WARNING"}
    _, proxy = await together(
        start_sim(servers, sim_env(ttft_ms=0, tokens_per_second=0, output_tokens=8), port=port),
        start_proxy(servers, f"http://127.0.0.1:{port}/v1", env=env),
    )
    return proxy


async def _flood_on(proxy: Server) -> subprocess.Popen[bytes]:
    """The flooder, once it has upgraded its socket and started writing."""
    flooder = subprocess.Popen(
        [sys.executable, "-m", "wsmode.bench.fairness", str(proxy.port), "600"],
        stdout=subprocess.PIPE,
    )
    assert flooder.stdout is not None
    try:
        line = await asyncio.wait_for(asyncio.to_thread(flooder.stdout.readline), 20)
    except TimeoutError:
        line = b""
    if not line:
        flooder.kill()
        flooder.wait()
        raise BenchError("the flooder did not start flooding")
    await asyncio.sleep(FLOOD_RAMP_S)  # the flood is on: its writes fill the proxy's reads
    return flooder


async def _contender(
    proxy: Server, turns: int, reps: int, session: aiohttp.ClientSession
) -> dict[str, Any]:
    frame = orjson.dumps({"type": "response.create", "model": "sim", "input": "hi"})
    alone: list[float] = []
    flooded: list[float] = []
    per_rep: list[float] = []  # each repetition's flooded / alone, for the spread
    ws = await ws_connect(session, f"ws://{proxy.host}:{proxy.port}/v1/responses")
    try:
        await _phase(ws, frame, 5)  # warm-up
        for _ in range(reps):
            alone_once = await _phase(ws, frame, turns)
            alone += alone_once
            flooder = await _flood_on(proxy)
            try:
                flooded_once = await _phase(ws, frame, turns)
                flooded += flooded_once
            finally:
                flooder.kill()
                flooder.wait()
                if flooder.stdout is not None:
                    flooder.stdout.close()
            per_rep.append(statistics.median(flooded_once) / statistics.median(alone_once))
    finally:
        await ws.close()
    p50_alone = statistics.median(alone) * 1000
    p50_flooded = statistics.median(flooded) * 1000
    return {
        "p50_alone_ms": round(p50_alone, 2),
        "p50_flooded_ms": round(p50_flooded, 2),
        "ratio": round(p50_flooded / p50_alone, 2),
        "ratio_spread": spread(per_rep),
        "turns_each": len(alone),
    }


async def run(turns: int, reps: int, log: Callable[[str], None]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    servers = Servers()
    async with aiohttp.ClientSession() as session:
        try:
            # every contender's processes at once; idle, one costs the other nothing
            proxies = await together(*(_start(servers, rate) for rate in CONTENDERS.values()))
            for name, proxy in zip(CONTENDERS, proxies, strict=True):
                out[name] = await _contender(proxy, turns, reps, session)
        finally:
            servers.stop_all()
        for name, r in out.items():
            log(
                f"  fairness, {name}: p50 {r['p50_alone_ms']} ms alone, "
                f"{r['p50_flooded_ms']} ms with a flooding client ({r['ratio']}x)"
            )
    return out


if __name__ == "__main__":
    asyncio.run(_flood(int(sys.argv[1]), float(sys.argv[2])))

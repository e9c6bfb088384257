"""Scenario "scale": many connections, each holding a conversation; wsmode's memory.

For each connection count, a fresh `wsmode serve` process: its resident memory (VmRSS) is
read after one warm-up turn, after opening every connection (idle: memory per connection),
and after every connection has run one turn whose input is a ~100 KB conversation with
`store: false` (memory per cached byte: the growth divided by the JSON size of what the
cache holds, the input and output items). Connections open 100 at a time and turns run 100
at a time, so the listen backlog never overflows; every error is counted.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson

from .clients import ws_connect, ws_turn
from .overhead import history
from .procs import (
    Servers,
    free_port,
    open_files,
    raise_nofile_limit,
    sim_env,
    start_proxy,
    start_sim,
    together,
)

CONCURRENCY = 100
SETTLE_S = 0.5  # let the allocator and the event loop settle before reading VmRSS


async def _settled_rss(read: Callable[[], int]) -> int:
    await asyncio.sleep(SETTLE_S)
    return read()


async def _one(
    counts: int, conv_bytes: int, session: aiohttp.ClientSession, log: Callable[[str], None]
) -> dict[str, Any]:
    servers = Servers()
    sockets: list[aiohttp.ClientWebSocketResponse] = []
    errors: dict[str, int] = {}

    def error(exc: BaseException) -> None:
        key = type(exc).__name__
        errors[key] = errors.get(key, 0) + 1

    try:
        # the connection limit (server.max_connections, 4096 by default) must not be what
        # this scenario measures: allow every connection it opens, and the warm-up one
        limit = {"WSMODE_SERVER_MAX_CONNECTIONS": str(counts + 16)}
        port = free_port()  # chosen first: the sim and wsmode start side by side
        _, proxy = await together(
            start_sim(servers, sim_env(ttft_ms=0, tokens_per_second=0, output_tokens=8), port=port),
            start_proxy(servers, f"http://127.0.0.1:{port}/v1", env=limit),
        )
        url = f"ws://{proxy.host}:{proxy.port}/v1/responses"
        items = history(conv_bytes)
        frame = orjson.dumps(
            {"type": "response.create", "model": "sim", "store": False, "input": items}
        )
        warm = await ws_connect(session, url)
        await ws_turn(warm, frame)
        await warm.close()
        rss0 = await _settled_rss(proxy.rss_bytes)

        sem = asyncio.Semaphore(CONCURRENCY)
        t0 = time.perf_counter()

        async def connect() -> None:
            async with sem:
                try:
                    sockets.append(await asyncio.wait_for(ws_connect(session, url), 60))
                except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                    error(exc)

        await asyncio.gather(*(connect() for _ in range(counts)))
        connect_s = time.perf_counter() - t0
        rss1 = await _settled_rss(proxy.rss_bytes)
        fds = open_files(proxy.pid)
        cached = [0]

        async def turn(ws: aiohttp.ClientWebSocketResponse) -> None:
            async with sem:
                try:
                    t = await asyncio.wait_for(ws_turn(ws, frame), 120)
                    out = t.response["output"]
                    cached[0] += sum(len(orjson.dumps(i)) for i in [*items, *out])
                except Exception as exc:  # counted, reported; the scenario goes on
                    error(exc)

        t0 = time.perf_counter()
        await asyncio.gather(*(turn(ws) for ws in sockets))
        turns_s = time.perf_counter() - t0
        rss2 = await _settled_rss(proxy.rss_bytes)
        opened = len(sockets)
        result = {
            "connections": counts,
            "opened": opened,
            "conversation_bytes": len(orjson.dumps(items)),
            "cached_bytes": cached[0],
            "proxy_open_files": fds,
            "rss_start_mb": round(rss0 / 2**20, 1),
            "rss_idle_mb": round(rss1 / 2**20, 1),
            "rss_cached_mb": round(rss2 / 2**20, 1),
            "kb_per_idle_connection": round((rss1 - rss0) / max(opened, 1) / 1024, 2),
            "rss_per_cached_byte": round((rss2 - rss1) / max(cached[0], 1), 3),
            "connect_s": round(connect_s, 2),
            "turns_s": round(turns_s, 2),
            "errors": errors,
        }
        log(
            f"  scale {counts} connections: {result['kb_per_idle_connection']} KB/idle "
            f"connection, {result['rss_per_cached_byte']}x per cached byte, "
            f"errors {sum(errors.values())}"
        )
        return result
    finally:
        await asyncio.gather(*(ws.close() for ws in sockets), return_exceptions=True)
        servers.stop_all()


async def run(counts: list[int], conv_bytes: int, log: Callable[[str], None]) -> dict[str, Any]:
    nofile = raise_nofile_limit()
    out: dict[str, Any] = {"nofile_limit": nofile, "runs": []}
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        for n in counts:
            if n + 64 > nofile:
                out["runs"].append({"connections": n, "skipped": f"open-file limit {nofile}"})
                continue
            out["runs"].append(await _one(n, conv_bytes, session, log))
    return out

"""A client that stops reading: bounded buffering, paused upstream, then a clear cancel.

What happens without our bounds (measured, 2 cores, loopback; see the commit message): the
proxy already waits on each write, but only after aiohttp's 64 KiB writer limit and asyncio's
64 KiB high-water mark, and the kernel's autotuned send buffer absorbed ~3 MB for one stalled
client. `server.outbound_buffer_bytes` makes the user-space bound and the kernel request
explicit, and `server.send_timeout` ends the wait.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

from websockets.asyncio.client import ClientConnection as WebSocket
from websockets.asyncio.client import connect
from wsmode.ops.middleware import OPS
from wsmode.ws_front import ClientConnection as Conn

from tests.support.helpers import (
    Proxy,
    Sim,
    create,
    recv,
    sample,
    scrape,
    scrape_until,
    seconds,
    send,
    until,
    until_terminal,
)

ProxyFactory = Callable[..., Awaitable[Proxy]]
BOUND = 256 * 1024
TOKENS = 200_000  # a stream of ~30 MB: far more than every buffer on the way together


def small_socket(port: int) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    return s


@asynccontextmanager
async def stalled_socket(proxy: Proxy) -> AsyncIterator[tuple[WebSocket, dict[str, Any], Conn]]:
    """A WebSocket that asked for a long answer and then reads nothing (max_queue=1: the
    websockets client stops reading its socket while we do not recv()): the socket, the
    `response.created` it did read, and the proxy's side of the connection."""
    async with connect(
        proxy.ws, sock=small_socket(proxy.served.port), max_queue=1, max_size=None
    ) as ws:
        await send(ws, create(input="a long answer please", store=False))
        first = await recv(ws)
        assert first["type"] == "response.created"
        yield ws, first, next(iter(proxy.served.runner.app[OPS].connections))


async def stalled_peaks(conn: Conn) -> list[int]:
    """The connection's write buffer, sampled until its wait for the client to read times
    out. Read in-process: the timed-out write queues the rest of its chunk (for when the
    client reads again) in the same step that counts the timeout, so no sample sees it."""
    transport = conn.request.transport
    assert transport is not None
    peaks: list[int] = []

    def timed_out() -> bool:
        if conn.write_timeouts:
            return True
        peaks.append(transport.get_write_buffer_size())
        return False

    await until(timed_out, 30, every=0.01, message="the write never timed out")
    return peaks


async def test_a_large_upstream_chunk_is_written_within_the_bound(
    sim_factory: Callable[..., Awaitable[Sim]], proxy_factory: ProxyFactory
) -> None:
    """The sim writes its events in chunks of up to 64 KiB; with a 16 KiB outbound bound one
    chunk's frames are more than the bound, so they go out in batches, each after the
    client read the last: the buffer never holds more than the bound (and one frame)."""
    small = 16 * 1024
    sim = await sim_factory(output_tokens=TOKENS)
    proxy = await proxy_factory(
        sim.url, server__outbound_buffer_bytes=small, server__send_timeout=seconds(1.5)
    )
    async with stalled_socket(proxy) as (_, _, conn):
        peaks = await stalled_peaks(conn)
        assert 0 < max(peaks) <= small + 1024  # the bound, and at most one delta frame more


async def test_client_that_stops_reading(
    sim_factory: Callable[..., Awaitable[Sim]], proxy_factory: ProxyFactory
) -> None:
    sim = await sim_factory(output_tokens=TOKENS)
    proxy = await proxy_factory(
        sim.url, server__outbound_buffer_bytes=BOUND, server__send_timeout=seconds(1.5)
    )
    async with stalled_socket(proxy) as (ws, first, conn):
        # stalled: while the response is blocked, our buffer stays within the bound and
        # the upstream is not read to the end
        peaks = await stalled_peaks(conn)
        assert max(peaks) <= BOUND
        m = await scrape_until(
            proxy, lambda m: sample(m, "wsmode_slow_client_cancellations_total") == 1
        )
        upstream_read = sample(m, "wsmode_upstream_bytes_received_total")
        assert 0 < upstream_read < 0.2 * TOKENS * 150  # paused long before the end
        await until(lambda: sim.state.cancelled == 1)  # the upstream request was closed
        assert sim.state.cancelled == 1 and sim.state.completed == 0
        # the client reads again: everything queued, then a terminal failure and the reason
        events: list[dict[str, Any]] = [first, *await until_terminal(ws, timeout=30)]
        assert events[-1]["type"] == "response.failed"
        said = events[-1]["response"]["error"]  # the API's code, the proxy's alongside
        assert said["code"] == "server_error" and said["wsmode_code"] == "client_too_slow"
        err = await recv(ws)
        assert err["type"] == "error" and err["error"]["code"] == "client_too_slow"
        assert "did not read" in err["error"]["message"]
        seqs = [e["sequence_number"] for e in [*events, err]]
        assert seqs == list(range(len(seqs)))
        # and the socket goes on
        sim.state.settings = replace(sim.state.settings, output_tokens=8)
        await send(ws, create(input="short now"))
        assert (await until_terminal(ws))[-1]["type"] == "response.completed"
    m = await scrape(proxy)
    assert sample(m, "wsmode_upstream_errors_total", kind="stream") == 0


async def test_a_reading_client_is_never_cancelled(
    sim_factory: Callable[..., Awaitable[Sim]], proxy_factory: ProxyFactory
) -> None:
    """The same stream, read promptly through the same small bound, completes."""
    sim = await sim_factory(output_tokens=20_000)
    proxy = await proxy_factory(
        sim.url, server__outbound_buffer_bytes=BOUND, server__send_timeout=seconds(5)
    )
    async with connect(proxy.ws, max_size=None) as ws:
        await send(ws, create(input="go"))
        events = await until_terminal(ws, timeout=60)
    assert events[-1]["type"] == "response.completed"
    assert sim.state.completed == 1
    m = await scrape(proxy)
    assert sample(m, "wsmode_slow_client_cancellations_total") == 0


async def stalled_sse_post(proxy: Proxy) -> asyncio.StreamWriter:
    """A streaming `POST /v1/responses` over a small socket whose client reads the status
    line and then nothing more: the proxy's writes back up."""
    body = b'{"model":"sim","input":"long","stream":true}'
    reader, writer = await asyncio.open_connection(sock=small_socket(proxy.served.port))
    writer.write(
        b"POST /v1/responses HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    await writer.drain()
    assert (await asyncio.wait_for(reader.readline(), seconds(10))).startswith(b"HTTP/1.1 200")
    return writer


async def test_http_sse_client_that_stops_reading(
    sim_factory: Callable[..., Awaitable[Sim]], proxy_factory: ProxyFactory
) -> None:
    sim = await sim_factory(output_tokens=TOKENS)
    proxy = await proxy_factory(
        sim.url, server__outbound_buffer_bytes=BOUND, server__send_timeout=seconds(1)
    )
    writer = await stalled_sse_post(proxy)
    # ...and now we read nothing more
    m = await scrape_until(
        proxy,
        lambda m: (
            sample(m, "wsmode_slow_client_cancellations_total") == 1 and bool(sim.state.cancelled)
        ),
    )
    assert sample(m, "wsmode_slow_client_cancellations_total") == 1
    assert sim.state.cancelled == 1 and sim.state.completed == 0
    assert sample(m, "wsmode_upstream_bytes_received_total") < 0.2 * TOKENS * 150
    writer.close()


async def test_outbound_bytes_count_against_the_memory_budget(
    sim_factory: Callable[..., Awaitable[Sim]], proxy_factory: ProxyFactory
) -> None:
    # what waits in our write buffer for a client that stopped reading is part of the process
    # memory budget (wsmode_memory_bytes{part="outbound"}); it is released with the socket
    sim = await sim_factory(output_tokens=TOKENS)
    proxy = await proxy_factory(
        sim.url, server__outbound_buffer_bytes=BOUND, server__send_timeout=seconds(30)
    )
    async with stalled_socket(proxy) as (_, _, conn):
        m = await scrape_until(
            proxy, lambda m: sample(m, "wsmode_memory_bytes", part="outbound") > BOUND // 4
        )
        held = sample(m, "wsmode_memory_bytes", part="outbound")
        assert held <= 2 * BOUND  # within the connection's own bound (plus one write)
        assert held == proxy.state.core.memory.outbound == conn.outbound.held
    await scrape_until(proxy, lambda m: sample(m, "wsmode_connections_open") == 0)
    assert sample(await scrape(proxy), "wsmode_memory_bytes", part="outbound") == 0


async def test_a_streamed_http_answer_counts_against_the_memory_budget(
    sim_factory: Callable[..., Awaitable[Sim]], proxy_factory: ProxyFactory
) -> None:
    # an SSE stream to an HTTP client that stopped reading holds bytes in our write buffer
    # like a WebSocket does: they are in the outbound part until the exchange ends
    sim = await sim_factory(output_tokens=TOKENS)
    proxy = await proxy_factory(
        sim.url, server__outbound_buffer_bytes=BOUND, server__send_timeout=seconds(30)
    )
    writer = await stalled_sse_post(proxy)
    m = await scrape_until(
        proxy, lambda m: sample(m, "wsmode_memory_bytes", part="outbound") > BOUND // 4
    )
    assert sample(m, "wsmode_memory_bytes", part="outbound") <= 2 * BOUND
    writer.transport.abort()  # the client leaves: its buffer no longer counts
    await scrape_until(proxy, lambda m: sample(m, "wsmode_memory_bytes", part="outbound") == 0)

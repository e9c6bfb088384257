"""Descriptor exhaustion, on a real `wsmode serve` process: request heads that never end,
a low `ulimit -n` (RLIMIT_NOFILE set in the child before it starts), and a flood of
sockets beyond it. What clients see: a timeout closes the idle sockets, over-limit upgrades
get 503, `/healthz` answers, and the log stays a few lines long."""

from __future__ import annotations

import asyncio
import resource
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import aiohttp
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus

from tests.support.helpers import (
    Proxy,
    Sim,
    create,
    free_port,
    seconds,
    send,
    until,
    until_terminal,
    wait_healthy,
)

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="RLIMIT_NOFILE is POSIX")


@contextmanager
def wsmode_serve(
    port: int, log: Path, nofile: int | None, *sets: str
) -> Iterator[subprocess.Popen[bytes]]:
    """`wsmode serve` (simulated upstream, WARNING log to `log`), under `nofile` descriptors."""

    def limit() -> None:
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    args = [sys.executable, "-m", "wsmode", "serve", "--port", str(port), "--log-level", "WARNING"]
    for s in sets:
        args += ["--set", s]
    with log.open("wb") as err:
        proc = subprocess.Popen(args, stderr=err, preexec_fn=limit)
    try:
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=seconds(15))


async def open_raw(port: int, head: bytes, count: int) -> list[asyncio.StreamWriter]:
    """`count` TCP connections that send `head` and then nothing; those the kernel took."""

    async def one() -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        try:
            pair = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), seconds(5))
        except (OSError, TimeoutError):
            return None
        if head:
            pair[1].write(head)
        return pair

    pairs = await asyncio.gather(*(one() for _ in range(count)))
    return [p[1] for p in pairs if p is not None]


async def healthz(base: str) -> int:
    timeout = aiohttp.ClientTimeout(total=seconds(2))
    async with aiohttp.ClientSession(timeout=timeout) as http, http.get(f"{base}/healthz") as r:
        return r.status


async def test_request_heads_that_never_end_are_closed(tmp_path: Path) -> None:
    port = free_port()
    with wsmode_serve(port, tmp_path / "err.log", None, "server.header_timeout=1"):
        base = f"http://127.0.0.1:{port}"
        await wait_healthy(base)
        async with connect(f"ws://127.0.0.1:{port}/v1/responses") as ws:
            slow = [await asyncio.open_connection("127.0.0.1", port) for _ in range(50)]
            for _, writer in slow:
                writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            # each is closed by the proxy (EOF) once the timeout is over, unanswered
            for reader, _ in slow:
                assert await asyncio.wait_for(reader.read(), seconds(15)) == b""
            for _, writer in slow:
                writer.close()
            # an open WebSocket is not a request head: it outlives the timeout
            await asyncio.sleep(seconds(1.5))
            await send(ws, create(input="still here", store=False))
            assert (await until_terminal(ws))[-1]["type"] == "response.completed"


async def test_a_low_descriptor_limit_lowers_the_connection_limit(tmp_path: Path) -> None:
    """256 descriptors, 16 upstream connections (32 with the in-process simulated model)
    and 64 kept for the proxy: 160 WebSockets, not the default 4096."""
    port = free_port()
    log = tmp_path / "err.log"
    with wsmode_serve(port, log, 256, "upstream.max_connections=16"):
        base = f"http://127.0.0.1:{port}"
        await wait_healthy(base)
        started = log.read_text()
        assert "server.max_connections = 4096 cannot be honoured" in started
        assert "descriptor limit of 256" in started and "at most 160 WebSocket" in started

        opened: list[ClientConnection] = []
        refused: list[int] = []

        async def one() -> None:
            try:
                ws = await connect(f"ws://127.0.0.1:{port}/v1/responses", open_timeout=seconds(15))
            except InvalidStatus as exc:
                refused.append(exc.response.status_code)
                return
            opened.append(ws)

        try:
            await asyncio.gather(*(one() for _ in range(200)))
            assert len(opened) == 160
            assert refused == [503] * 40
            # the upstream still has descriptors: turns on open sockets complete
            for ws in opened[:3]:
                await send(ws, create(input="hi", store=False))
                assert (await until_terminal(ws))[-1]["type"] == "response.completed"
            assert await healthz(base) == 200
        finally:
            await asyncio.gather(*(ws.close() for ws in opened))
    lines = log.read_text().splitlines()
    # 40 refusals log at most log_repeat_limit (20) lines; nothing else repeats
    assert sum("connection refused" in line for line in lines) <= 21
    assert len(lines) < 40, lines[:50]


async def test_out_of_descriptors_the_proxy_backs_off_and_recovers(tmp_path: Path) -> None:
    """300 sockets against 256 descriptors, none sending a byte: accept fails with EMFILE.
    The proxy pauses accepting instead of spinning, the header timeout frees descriptors,
    and /healthz answers while the flood is still connected."""
    port = free_port()
    log = tmp_path / "err.log"
    # the timeout is long enough that no socket of the flood is freed before the last one
    # arrives, even when this machine is slow to accept them
    timeout = f"server.header_timeout={seconds(5):g}"
    with wsmode_serve(port, log, 256, "upstream.max_connections=16", timeout):
        base = f"http://127.0.0.1:{port}"
        await wait_healthy(base)
        flood = await open_raw(port, b"", 300)
        try:
            assert len(flood) > 200
            status = await until(
                lambda: healthz(base),
                timeout=60,
                ignore=(aiohttp.ClientError, TimeoutError),
                message="/healthz never answered",
            )
            assert status == 200
        finally:
            for writer in flood:
                writer.close()
    text = log.read_text()
    assert "cannot accept connections" in text  # the limit was really reached
    assert len(text.splitlines()) < 40, text[:4000]


async def test_a_refused_upgrade_does_not_keep_its_connection(
    sim: Sim, proxy_factory: Callable[..., Awaitable[Proxy]]
) -> None:
    """At the connection limit a descriptor is what is short: the 503 closes its socket
    instead of keeping it alive for another request (so does a 403 for a foreign origin)."""
    proxy = await proxy_factory(sim.url, server__max_connections=1)
    upgrade = (
        "GET /v1/responses HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
        "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        "Sec-WebSocket-Version: 13\r\n{extra}\r\n"
    )
    async with connect(proxy.ws):
        for extra, status in (("", b"503"), ("Origin: https://evil.example\r\n", b"403")):
            reader, writer = await asyncio.open_connection("127.0.0.1", proxy.served.port)
            writer.write(upgrade.format(extra=extra).encode())
            answer = await asyncio.wait_for(reader.read(), seconds(10))  # to EOF
            assert answer.split(b"\r\n", 1)[0].split(b" ")[1] == status
            writer.close()

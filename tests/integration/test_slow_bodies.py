"""A client that sends its request head and then trickles its body, or stops, gets 408
`request_timeout` after `server.body_timeout` and its connection is closed: it cannot hold a
handler and a descriptor for as long as it likes (docs/operations.md "Limits")."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from wsmode.config import load_settings
from wsmode.sidecar.app import create_sidecar_app

from tests.support.helpers import Proxy, Sim, sample, scrape, seconds, serve


async def _half_sent(port: int, path: str) -> tuple[bytes, bytes]:
    """POST `path` announcing 1,000 body bytes and sending 10: the answer's status line and
    body. The answer says it closes the connection (aiohttp then lingers up to 10 s reading
    what is left of the body before closing it, a bounded wait)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        "Content-Length: 1000\r\n\r\n".encode()
        + b'{"model":"'
    )
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), seconds(20))
    lines = head.decode().split("\r\n")
    fields = dict(line.lower().split(": ", 1) for line in lines[1:] if line)
    assert fields["connection"] == "close"
    body = await asyncio.wait_for(reader.readexactly(int(fields["content-length"])), seconds(10))
    writer.close()
    return lines[0].encode(), body


@pytest.mark.parametrize("path", ["/v1/responses", "/v1/responses/compact"])
async def test_a_body_that_never_arrives_gets_408_and_the_connection_closes(
    sim: Sim, proxy_factory: Any, path: str
) -> None:
    proxy: Proxy = await proxy_factory(sim.url, server__body_timeout=seconds(0.5))
    status, body = await _half_sent(proxy.served.port, path)
    assert status == b"HTTP/1.1 408 Request Timeout"
    assert orjson.loads(body)["error"]["code"] == "request_timeout"
    assert sim.bodies() == []  # nothing went upstream
    counted = sample(
        await scrape(proxy), "wsmode_http_requests_total", route=path, method="POST", status="408"
    )
    assert counted == 1


async def test_the_sidecar_bounds_a_body_it_reads_too(sim: Sim) -> None:
    settings = load_settings(
        None, {}, {"sidecar.upstream": sim.url, "server.body_timeout": seconds(0.5)}
    )
    served = await serve(create_sidecar_app(settings), handler_cancellation=True)
    try:
        status, body = await _half_sent(served.port, "/v1/responses")
    finally:
        await served.runner.cleanup()
    assert status == b"HTTP/1.1 408 Request Timeout"
    assert orjson.loads(body)["error"]["code"] == "request_timeout"

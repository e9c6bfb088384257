"""An HTTP client that leaves before its answer is complete.

Leaving is ordinary: no traceback or ERROR in the log, the request counted with status 499
(nginx's "client closed request") rather than 500, and its upstream request cancelled at
once, whether the answer was streaming, was not, or the upstream was silent. The clients here
are raw sockets on 127.0.0.1 that send a real request and then abort (RST) or close (FIN).
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.helpers import (
    Proxy,
    Sidecar,
    Sim,
    free_port,
    running,
    sample,
    scrape,
    scrape_until,
    seconds,
    until,
    wait_healthy,
)

SimFactory = Callable[..., Awaitable[Sim]]
ProxyFactory = Callable[..., Awaitable[Proxy]]


async def post_and_leave(
    port: int,
    path: str,
    body: dict[str, Any],
    *,
    after: bytes | None = None,
    when: Callable[[], bool] | None = None,
    abort: bool = True,
) -> bytes:
    """POST `body`, read until `after` has arrived (or wait until `when()` holds), then
    leave: abort the connection (RST) or close it (FIN). Returns what was read."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    data = orjson.dumps(body)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    )
    writer.write(head.encode() + data)
    await writer.drain()
    seen = b""
    if after is not None:
        seen = await asyncio.wait_for(reader.readuntil(after), seconds(10))
    if when is not None:
        await until(when, message="the upstream request never started")
    if abort:
        writer.transport.abort()
    else:
        writer.close()
    return seen


def troubles(caplog: pytest.LogCaptureFixture) -> list[str]:
    """Log records that would page someone: ERROR and above, or any with a traceback."""
    return [
        f"{r.levelname} {r.name}: {r.getMessage()}"
        for r in caplog.records
        if r.levelno >= logging.ERROR or r.exc_info
    ]


def left_and_not_500(metrics: dict[Any, float], route: str, method: str = "POST") -> bool:
    return (
        sample(metrics, "wsmode_http_requests_total", route=route, method=method, status="499") == 1
    )


async def assert_counted_as_left(proxy: Proxy, route: str) -> None:
    m = await scrape_until(proxy, lambda m: left_and_not_500(m, route))
    assert sample(m, "wsmode_http_requests_total", route=route, method="POST", status="500") == 0
    assert sample(m, "wsmode_internal_errors_total") == 0


async def assert_left_cleanly(
    proxy: Proxy, sim: Sim, route: str, caplog: pytest.LogCaptureFixture
) -> None:
    """What a client leaving must look like: its upstream request cancelled at once, the
    request counted as 499 (never 500), and nothing in the log that would page someone."""
    await until(lambda: sim.state.cancelled == 1 and sim.state.active == 0)
    await assert_counted_as_left(proxy, route)
    assert troubles(caplog) == []


async def test_streaming_client_leaving_mid_stream(
    sim_factory: SimFactory, proxy_factory: ProxyFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    sim = await sim_factory(tokens_per_second=20, output_tokens=1000)
    proxy = await proxy_factory(sim.url)
    body = {"model": "sim", "input": "long answer please", "stream": True}
    seen = await post_and_leave(
        proxy.served.port, "/v1/responses", body, after=b"response.output_text.delta"
    )
    assert seen.startswith(b"HTTP/1.1 200")
    await assert_left_cleanly(proxy, sim, "/v1/responses", caplog)
    assert sim.state.completed == 0


async def test_streaming_client_leaving_while_the_upstream_is_silent(
    sim: Sim, proxy: Proxy, caplog: pytest.LogCaptureFixture
) -> None:
    """Nothing is written after the client leaves, so no write can fail: the proxy still
    notices at once and closes the upstream request."""
    caplog.set_level(logging.INFO)
    body = {"model": "sim", "input": "x", "stream": True, "metadata": {"sim_fault": "stall:3"}}
    await post_and_leave(
        proxy.served.port, "/v1/responses", body, after=b"response.in_progress", abort=False
    )
    await assert_left_cleanly(proxy, sim, "/v1/responses", caplog)


async def test_non_streaming_client_leaving_cancels_its_upstream_request(
    sim_factory: SimFactory, proxy_factory: ProxyFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    sim = await sim_factory(tokens_per_second=20, output_tokens=1000)
    proxy = await proxy_factory(sim.url)
    body = {"model": "sim", "input": "long answer please"}
    await post_and_leave(
        proxy.served.port, "/v1/responses", body, when=lambda: sim.state.active == 1
    )
    await assert_left_cleanly(proxy, sim, "/v1/responses", caplog)
    assert sim.state.completed == 0


async def test_passthrough_client_leaving_mid_stream(
    sim_factory: SimFactory, proxy_factory: ProxyFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    sim = await sim_factory(tokens_per_second=20, output_tokens=1000)
    proxy = await proxy_factory(sim.url)
    body = {"model": "sim", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    await post_and_leave(proxy.served.port, "/v1/chat/completions", body, after=b"delta")
    await assert_left_cleanly(proxy, sim, "/v1/{tail}", caplog)


async def test_compact_client_leaving_cancels_the_summary(
    sim_factory: SimFactory, proxy_factory: ProxyFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    sim = await sim_factory(tokens_per_second=20, output_tokens=1000)
    proxy = await proxy_factory(sim.url)
    notes = [
        {"type": "message", "role": "user", "content": f"note {i} " + "detail " * 60}
        for i in range(6)
    ]
    body = {"model": "sim", "input": notes}
    await post_and_leave(
        proxy.served.port, "/v1/responses/compact", body, when=lambda: sim.state.active == 1
    )
    await assert_left_cleanly(proxy, sim, "/v1/responses/compact", caplog)


async def test_the_proxy_still_answers_after_clients_left(
    sim_factory: SimFactory, proxy_factory: ProxyFactory
) -> None:
    """Leaving leaves nothing behind: the next request on a new connection works."""
    sim = await sim_factory(tokens_per_second=20, output_tokens=1000)
    proxy = await proxy_factory(sim.url)
    body = {"model": "sim", "input": "x", "stream": True}
    for abort in (True, False):
        await post_and_leave(
            proxy.served.port, "/v1/responses", body, after=b"output_text.delta", abort=abort
        )
    await until(lambda: sim.state.cancelled == 2 and sim.state.active == 0)
    short = await sim_factory()
    other = await proxy_factory(short.url)
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{other.http}/responses", json={"model": "sim", "input": "hi"}) as r,
    ):
        assert r.status == 200 and (await r.json())["status"] == "completed"
    m = await scrape(proxy)
    assert (
        sample(m, "wsmode_http_requests_total", route="/v1/responses", method="POST", status="499")
        == 2
    )


async def test_sidecar_clients_leaving(
    sim_factory: SimFactory,
    proxy_factory: ProxyFactory,
    sidecar_factory: Callable[..., Awaitable[Sidecar]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The sidecar's HTTP side: a client leaving a streaming answer, a non-streaming one and
    a passthrough stream; each closes what it held upstream, without a traceback."""
    caplog.set_level(logging.INFO)
    sim = await sim_factory(tokens_per_second=20, output_tokens=1000)
    front = await proxy_factory(sim.url)
    sidecar = await sidecar_factory(front.http)
    port = sidecar.served.port
    streaming = {"model": "sim", "input": "long", "stream": True}
    await post_and_leave(port, "/v1/responses", streaming, after=b"output_text.delta")
    await until(lambda: sim.state.cancelled == 1 and sim.state.active == 0)
    await post_and_leave(
        port, "/v1/responses", {"model": "sim", "input": "long"}, when=lambda: sim.state.active == 1
    )
    await until(lambda: sim.state.cancelled == 2 and sim.state.active == 0)
    chat = {"model": "sim", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    await post_and_leave(port, "/v1/chat/completions", chat, after=b"delta")
    await until(lambda: sim.state.cancelled == 3 and sim.state.active == 0)
    assert sim.state.completed == 0
    assert troubles(caplog) == []


async def test_wsmode_serve_logs_a_client_leaving_without_a_traceback(
    sim_factory: SimFactory,
) -> None:
    """The real command: what an operator's log and /metrics show."""
    sim = await sim_factory(tokens_per_second=20, output_tokens=1000)
    port = free_port()
    with running(["serve", "--port", str(port), "--upstream", sim.url]) as proc:
        base = f"http://127.0.0.1:{port}"
        await wait_healthy(base)
        for stream in (True, False):
            body = {"model": "sim", "input": "long answer please", "stream": stream}
            before = sim.state.cancelled
            if stream:
                await post_and_leave(port, "/v1/responses", body, after=b"output_text.delta")
            else:
                await post_and_leave(
                    port, "/v1/responses", body, when=lambda: sim.state.active == 1
                )
            await until(lambda b=before: sim.state.cancelled == b + 1 and sim.state.active == 0)

        async def statuses() -> dict[str, float] | None:
            """The counts of POST /v1/responses by status, once the two 499s are in."""
            async with aiohttp.ClientSession() as http, http.get(f"{base}/metrics") as r:
                text = await r.text()
            found = {
                s.labels["status"]: s.value
                for family in text_string_to_metric_families(text)
                for s in family.samples
                if s.name == "wsmode_http_requests_total"
                and s.labels["route"] == "/v1/responses"
                and s.labels["method"] == "POST"
            }
            return found if found.get("499") == 2 else None

        found = await until(statuses, message="the two requests were not counted as 499")
        assert found == {"499": 2}
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.to_thread(proc.communicate, timeout=seconds(20))
    assert proc.returncode == 0
    assert "Traceback" not in err and "ERROR" not in err, err
    assert "Cannot write to closing transport" not in err
    assert sim.state.completed == 0

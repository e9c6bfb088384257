"""Request targets that a client library would never send, written on a raw socket: the
open routes answer only at their own spelling (`/%6detrics` and `/metric%73` are not
/metrics, docs/operations.md "Metrics"); an absolute-form request line (`GET http://host/v1/
models HTTP/1.1`) is relayed as its path, whatever the upstream URL, never a 500; and a
passthrough path with dot segments (`/v1/../../x`) is refused with 400 before anything is
sent upstream (docs/upstreams.md "Passthrough"). The upstream records what reaches it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import orjson
import pytest
from aiohttp import web

from tests.support.helpers import Proxy, Served, seconds, serve


async def raw_get(port: int, target: str) -> tuple[int, bytes]:
    """`GET target HTTP/1.1` as written, on a socket of its own: the status and body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        request = f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
        writer.write(request.encode())
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), seconds(10))
    finally:
        writer.close()
        await writer.wait_closed()
    head, _, body = raw.partition(b"\r\n\r\n")
    if b"transfer-encoding: chunked" in head.lower():
        body = dechunk(body)
    return int(head.split()[1]), body


def dechunk(body: bytes) -> bytes:
    out = b""
    while body:
        size, _, body = body.partition(b"\r\n")
        n = int(size, 16)
        if n == 0:
            break
        out, body = out + body[:n], body[n + 2 :]
    return out


class Recorder:
    """An upstream that answers every request 200 `{"path": ...}` and keeps the raw paths."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    async def handle(self, request: web.Request) -> web.Response:
        self.paths.append(request.raw_path)
        return web.json_response({"object": "list", "data": [], "path": request.raw_path})

    async def start(self) -> Served:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return await serve(app)


@pytest.fixture
async def recorder() -> AsyncIterator[tuple[Recorder, Served]]:
    rec = Recorder()
    served = await rec.start()
    yield rec, served
    await served.runner.cleanup()


@pytest.mark.parametrize("target", ["/%6detrics", "/metric%73", "/%6D%65trics", "/./metrics"])
async def test_metrics_answers_only_at_its_own_spelling(proxy: Proxy, target: str) -> None:
    status, body = await raw_get(proxy.served.port, target)
    assert status == 404, body
    assert b"wsmode_" not in body
    status, body = await raw_get(proxy.served.port, "/metrics")
    assert status == 200 and b"wsmode_http_requests_total" in body


@pytest.mark.parametrize("base", ["", "/v1", "/api"])
async def test_an_absolute_form_request_line_is_relayed_as_its_path(
    recorder: tuple[Recorder, Served],
    proxy_factory: Callable[..., Awaitable[Proxy]],
    base: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    rec, up = recorder
    proxy = await proxy_factory(f"{up.base}{base}", upstream__health_interval=0)
    target = f"http://127.0.0.1:{proxy.served.port}/v1/models?limit=2"
    status, body = await raw_get(proxy.served.port, target)
    assert status == 200, body
    assert rec.paths[-1] == f"{base}/models?limit=2"
    assert not [r for r in caplog.records if r.exc_info], "no traceback"
    # another host's absolute form is not relayed to this upstream
    status, body = await raw_get(proxy.served.port, "http://elsewhere.invalid:81/v1/models")
    assert status in (200, 400), body
    assert not [r for r in caplog.records if r.exc_info], "no traceback"


@pytest.mark.parametrize(
    "target",
    [
        "/v1/../../x",
        "/v1/models/../../admin",
        "/v1/./models",
        "/v1/%2e%2e/%2e%2e/x",
        "/v1/models/%2E%2E/x",
        "/v1/a/..",
        "/v1/a%2f..%2fb",
    ],
)
async def test_passthrough_refuses_dot_segments_before_anything_goes_upstream(
    recorder: tuple[Recorder, Served],
    proxy_factory: Callable[..., Awaitable[Proxy]],
    target: str,
) -> None:
    rec, up = recorder
    proxy = await proxy_factory(f"{up.base}/v1", upstream__health_interval=0)
    status, body = await raw_get(proxy.served.port, target)
    assert status == 400, body
    error = orjson.loads(body)["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_path", error
    assert rec.paths == []  # nothing was sent
    status, _ = await raw_get(proxy.served.port, "/v1/models/a..b")  # dots in a name: fine
    assert status == 200 and rec.paths == ["/v1/models/a..b"]

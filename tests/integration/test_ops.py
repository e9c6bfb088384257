"""Operations on every route: metrics, request ids, proxy auth, upstream credential, logs."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from tests.support.helpers import (
    Proxy,
    Sim,
    create,
    recv,
    sample,
    scrape,
    seconds,
    send,
    until_terminal,
    user,
)

ProxyFactory = Callable[..., Awaitable[Proxy]]


def sent_header(headers: dict[str, str], name: str) -> str | None:
    """A header the simulated upstream received, looked up case-insensitively."""
    return {k.lower(): v for k, v in headers.items()}.get(name.lower())


def last_upstream(sim: Sim, name: str) -> str | None:
    return sent_header(sim.state.requests[-1]["headers"], name)


async def test_metrics_follow_a_conversation(proxy: Proxy, sim: Sim) -> None:
    async with connect(proxy.ws) as ws:
        await send(ws, create(input=[user("a" * 1000)], store=False))
        first = (await until_terminal(ws))[-1]["response"]
        mid = await scrape(proxy)
        assert sample(mid, "wsmode_connections_open") == 1
        assert sample(mid, "wsmode_cache_entries") == 1
        assert sample(mid, "wsmode_cache_bytes") > 1000
        await send(ws, create(input=[user("b")], previous_response_id=first["id"], store=False))
        await until_terminal(ws)
        await send(ws, create(input=[user("c")], previous_response_id="resp_nope"))
        assert (await recv(ws))["error"]["code"] == "previous_response_not_found"
        sim.state.faults.append("status:503")
        await send(ws, create(input=[user("d")]))
        assert (await recv(ws))["status"] == 503
    m = await scrape(proxy)
    assert sample(m, "wsmode_connections_open") == 0
    assert sample(m, "wsmode_connections_total", close_class="normal") == 1
    assert sample(m, "wsmode_responses_total", outcome="completed", dialect="responses") == 2
    assert sample(m, "wsmode_responses_total", outcome="rejected", dialect="responses") == 1
    assert sample(m, "wsmode_responses_total", outcome="failed", dialect="responses") == 1
    assert sample(m, "wsmode_upstream_errors_total", kind="http_5xx") == 1
    assert sample(m, "wsmode_cache_hits_total") == 1
    assert sample(m, "wsmode_cache_misses_total") == 1
    assert sample(m, "wsmode_cache_entries") == 0  # the cache died with the socket
    for part in ("total", "upstream", "proxy"):
        # first events: the two completed turns; durations: every upstream request
        assert sample(m, "wsmode_time_to_first_event_seconds_count", part=part) == 2
        assert sample(m, "wsmode_response_duration_seconds_count", part=part) == 3
    # the second turn sent 1 short item; the upstream got the whole history both times
    received = sample(m, "wsmode_client_bytes_received_total")
    sent_up = sample(m, "wsmode_upstream_bytes_sent_total")
    assert received > 1000 and sent_up > received
    assert sent_up == sum(r["bytes"] for r in _request_sizes(sim))
    assert (
        sample(m, "wsmode_http_requests_total", route="/v1/responses", method="GET", status="101")
        == 1
    )


def _request_sizes(sim: Sim) -> list[dict[str, int]]:
    return [{"bytes": int(r["headers"]["Content-Length"])} for r in sim.state.requests]


async def test_metrics_registry_is_per_app(sim: Sim, proxy_factory: ProxyFactory) -> None:
    a = await proxy_factory(sim.url)
    b = await proxy_factory(sim.url)  # a global registry would raise "Duplicated timeseries"
    async with connect(a.ws) as ws:
        await send(ws, create(input="x"))
        await until_terminal(ws)
    ma, mb = await scrape(a), await scrape(b)
    assert sample(ma, "wsmode_responses_total", outcome="completed", dialect="responses") == 1
    assert sample(mb, "wsmode_responses_total", outcome="completed", dialect="responses") == 0


async def test_request_id_returned_and_sent_upstream(proxy: Proxy, sim: Sim) -> None:
    async with aiohttp.ClientSession() as http:
        body = {"model": "sim", "input": "hi"}
        async with http.post(
            f"{proxy.http}/responses", json=body, headers={"X-Request-Id": "req-abc.123"}
        ) as r:
            assert r.status == 200 and r.headers["X-Request-Id"] == "req-abc.123"
        assert last_upstream(sim, "X-Request-Id") == "req-abc.123"
        # none, or an unusable one: the proxy makes one up, returns it and sends it upstream
        async with http.post(
            f"{proxy.http}/responses", json=body, headers={"X-Request-Id": "bad id\u00e9" * 40}
        ) as r:
            rid = r.headers["X-Request-Id"]
        assert rid.startswith("req_") and last_upstream(sim, "X-Request-Id") == rid
        async with http.get(f"{proxy.http}/models") as r:  # passthrough too
            assert r.headers["X-Request-Id"] == sent_header(sim.state.last_headers, "X-Request-Id")
    async with connect(proxy.ws, additional_headers={"X-Request-Id": "ws-1"}) as ws:
        assert ws.response is not None and ws.response.headers["X-Request-Id"] == "ws-1"
        await send(ws, create(input="x"))
        await until_terminal(ws)
    assert last_upstream(sim, "X-Request-Id") == "ws-1"


KEY = "sk-proxy-key-0123456789"


async def test_proxy_auth_on_upgrade_and_http(
    sim: Sim, proxy_factory: ProxyFactory, tmp_path: Path
) -> None:
    hashed = "sk-hashed-key-9876543210"
    hashes = tmp_path / "keys.sha256"
    hashes.write_text(f"# team a\n{hashlib.sha256(hashed.encode()).hexdigest()}\n")
    proxy = await proxy_factory(
        sim.url, auth__api_keys=(KEY,), auth__api_key_hashes_file=str(hashes)
    )
    for headers in ({}, {"Authorization": "Bearer sk-wrong"}, {"Authorization": KEY}):
        with pytest.raises(InvalidStatus) as info:
            async with connect(proxy.ws, additional_headers=headers):
                pass
        assert info.value.response.status_code == 401
        async with (
            aiohttp.ClientSession() as http,
            http.post(
                f"{proxy.http}/responses", json={"model": "sim", "input": "x"}, headers=headers
            ) as r,
        ):
            assert r.status == 401
            assert (await r.json())["error"]["code"] == "invalid_api_key"
    assert sim.state.requests == deque_empty()
    for key in (KEY, hashed):
        async with connect(proxy.ws, additional_headers={"Authorization": f"Bearer {key}"}) as ws:
            await send(ws, create(input="x"))
            assert (await until_terminal(ws))[-1]["type"] == "response.completed"
    # the client's credential is forwarded when no upstream key is configured
    assert last_upstream(sim, "Authorization") == f"Bearer {hashed}"
    async with aiohttp.ClientSession() as http:
        for path in ("/healthz", "/readyz"):  # open: for probes
            async with http.get(f"{proxy.served.base}{path}") as r:
                assert r.status == 200
        async with http.get(f"{proxy.served.base}/metrics") as r:  # a scraper sends a key
            assert r.status == 401
        async with http.get(f"{proxy.http}/models") as r:  # passthrough is protected too
            assert r.status == 401
    m = await scrape(proxy)
    assert sample(m, "wsmode_connections_rejected_total", reason="auth") == 3


def deque_empty() -> Any:
    from collections import deque

    return deque(maxlen=10_000)


async def test_openai_sdk_with_proxy_key(
    sim: Sim, proxy_factory: ProxyFactory, openai_client: Any
) -> None:
    proxy = await proxy_factory(sim.url, auth__api_keys=(KEY,), upstream__api_key="sk-upstream")
    client = openai_client(proxy.http, api_key=KEY, max_retries=0)
    async with client.responses.connect() as conn:
        await conn.response.create(model="sim", input="hi", store=False)
        async with asyncio.timeout(seconds(10)):
            async for ev in conn:
                if ev.type == "response.completed":
                    break
    # the configured upstream credential replaced the client's proxy key
    assert last_upstream(sim, "Authorization") == "Bearer sk-upstream"
    bad = openai_client(proxy.http, api_key="sk-nope", max_retries=0)
    # the limit outside `raises`: running out of time fails as a TimeoutError of its own
    async with asyncio.timeout(seconds(10)):
        with pytest.raises(Exception) as info:
            async with bad.responses.connect() as conn:
                await conn.response.create(model="sim", input="hi")
                async for _ in conn:
                    break
    assert "401" in str(info.value)


async def test_keys_never_logged(
    sim: Sim, proxy_factory: ProxyFactory, caplog: pytest.LogCaptureFixture
) -> None:
    upstream_key = "sk-upstream-secret-abcdef"
    caplog.set_level(logging.DEBUG)
    proxy = await proxy_factory(sim.url, auth__api_keys=(KEY,), upstream__api_key=upstream_key)
    auth = {"Authorization": f"Bearer {KEY}"}
    async with connect(proxy.ws, additional_headers=auth) as ws:
        await send(ws, create(input=[user("a")], store=False))
        first = (await until_terminal(ws))[-1]["response"]
        sim.state.faults.append("cut:3")  # a WARNING path
        await send(ws, create(input=[user("b")], previous_response_id=first["id"]))
        await until_terminal(ws)
        await ws.send("{broken")  # a client error path
        await recv(ws)
    with pytest.raises(InvalidStatus):
        async with connect(proxy.ws, additional_headers={"Authorization": "Bearer sk-wrong-key-1"}):
            pass
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{proxy.http}/responses", json={"model": "sim", "input": "x"}, headers=auth
        ) as r,
    ):
        assert r.status == 200
    # ours and the server library's records (the websockets *client* logs its own headers)
    ours = [r for r in caplog.records if r.name.startswith(("wsmode", "aiohttp"))]
    text = "\n".join(f"{r.getMessage()} {r.exc_text or ''} {r.__dict__}" for r in ours)
    assert "connection conn_" in text and "upstream failure" in text  # logs were captured
    for secret in (KEY, upstream_key, "sk-wrong-key-1"):
        assert secret not in text
    assert not any('"role"' in r.getMessage() for r in ours)  # no payloads


async def test_a_bug_is_logged_with_traceback_and_closes_1011(
    proxy: Proxy, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug (here: an exception planted in the session) closes only its socket with 1011,
    is logged at ERROR with its traceback and counted; HTTP routes answer 500."""
    from wsmode.core.session import Session
    from wsmode.http_front.responses import HttpExchange

    real = Session.handle

    def planted(self: Session, event: Any) -> Any:
        if "boom" in str(getattr(event, "data", "")):
            raise RuntimeError("planted bug")
        return real(self, event)

    async def planted_http(self: HttpExchange, body: Any, nbytes: int = 0) -> Any:
        raise RuntimeError("planted http bug")

    monkeypatch.setattr(Session, "handle", planted)
    monkeypatch.setattr(HttpExchange, "run", planted_http)
    async with connect(proxy.ws) as healthy, connect(proxy.ws) as ws:
        await send(ws, create(input="boom"))
        await ws.wait_closed()
        assert ws.close_code == 1011
        await send(healthy, create(input="fine"))  # other connections are untouched
        assert (await until_terminal(healthy))[-1]["type"] == "response.completed"
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{proxy.http}/responses", json={"model": "sim", "input": "x"}) as r,
    ):
        assert r.status == 500 and (await r.json())["error"]["code"] == "internal_error"
    errors = [
        r for r in caplog.records if r.levelno == logging.ERROR and r.name.startswith("wsmode")
    ]
    assert len(errors) == 2 and all(r.exc_info for r in errors)
    traces = [logging.Formatter().formatException(r.exc_info) for r in errors if r.exc_info]
    assert "planted bug" in traces[0] and "planted http bug" in traces[1]
    m = await scrape(proxy)
    assert sample(m, "wsmode_internal_errors_total") == 2
    assert sample(m, "wsmode_connections_total", close_class="internal_error") == 1

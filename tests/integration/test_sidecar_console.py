"""The sidecar's console (proxy/sidecar/console.py) over real sockets: sidecar -> wsmode ->
sim. Its feed shows each HTTP turn with the bytes the client sent beside the bytes the
sidecar sent on its WebSocket, under the proxy console's policy: on by default on loopback,
off by default elsewhere, and on elsewhere only with proxy auth.

The page itself, in a real browser, is tests/system/test_console_browser.py."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from wsmode.config import ConfigError, load_settings
from wsmode.sidecar.app import create_sidecar_app

from tests.support.console_feed import Events, read_events, short
from tests.support.helpers import Proxy, Sidecar, Sim, serve
from tests.support.sidecar_turns import conversation


def turns(events: Events) -> Events:
    return [e for e in events if e["type"] == "turn"]


async def feed(sidecar: Sidecar, n: int, headers: dict[str, str] | None = None) -> Events:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{sidecar.served.base}/console/feed", headers=headers) as r,
    ):
        assert r.status == 200 and r.headers["Content-Type"] == "text/event-stream"
        return await read_events(
            r, lambda ev: len(turns(ev)) >= n and any(e["type"] == "state" for e in ev)
        )


async def test_the_feed_shows_each_turn_and_its_bytes(proxy: Proxy, sidecar_factory: Any) -> None:
    sidecar = await sidecar_factory(proxy.http)
    done = await conversation(sidecar.http, ["zebra-quartz", "mango-lantern", "violet-anchor"])
    events = await feed(sidecar, 3)
    assert events[0]["type"] == "hello" and events[0]["show_content"] is False
    shown = turns(events)
    assert [t["response_id"] for t in shown] == [short(d["response_id"]) for d in done]
    # each continues the last: linked by the (shortened) id of the chain's last response
    assert [t["previous_response_id"] for t in shown] == [
        None,
        *(t["response_id"] for t in shown[:2]),
    ]
    assert [t["via"] for t in shown] == ["full", "delta", "delta"]
    assert [t["outcome"] for t in shown] == ["completed"] * 3
    assert [t["client_bytes"] for t in shown] == [d["client_bytes"] for d in done]
    # the proxy received, over the sidecar's WebSocket, exactly what the feed says was sent
    assert sum(t["upstream_bytes"] for t in shown) == proxy.state.client_bytes_received
    assert shown[2]["upstream_bytes"] < shown[2]["client_bytes"]  # only the new items
    [state] = [e for e in events if e["type"] == "state"][-1:]
    assert state["sidecar"]["upstream_websockets"] == 1 and state["sidecar"]["chains"] == 1
    raw = str(events)
    assert "zebra-quartz" not in raw and done[0]["response_id"] not in raw


async def test_the_page_opens_and_refused_requests_are_recent_errors(
    proxy: Proxy, sidecar_factory: Any
) -> None:
    sidecar = await sidecar_factory(proxy.http)
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{sidecar.served.base}/console") as r:
            assert r.status == 200 and "wsmode sidecar console" in await r.text()
            assert "default-src 'none'" in r.headers["Content-Security-Policy"]
        async with http.post(f"{sidecar.http}/responses", data=b"{not json") as r:
            assert r.status == 400
        async with http.get(f"{sidecar.served.base}/console/feed") as r:
            events = await read_events(r, lambda ev: any(e["type"] == "state" for e in ev))
    [state] = [e for e in events if e["type"] == "state"]
    assert [(e["where"], e["status"]) for e in state["errors"]] == [("POST /v1/responses", 400)]


async def test_turns_relayed_over_plain_http_are_turns_too(sim: Sim, sidecar_factory: Any) -> None:
    """In front of the simulated model, which has no WebSocket mode, every turn goes over
    plain HTTP: each is shown, with the whole body sent on and its answer relayed unread."""
    sidecar = await sidecar_factory(sim.url)
    done = await conversation(sidecar.http, ["zebra-quartz", "mango-lantern"])
    assert sidecar.state.stats["http"] == 2 and sidecar.state.pool.opened == 0
    events = await feed(sidecar, 2)
    shown = turns(events)
    assert [(t["via"], t["outcome"], t["status"]) for t in shown] == [("http", "relayed", 200)] * 2
    assert [t["client_bytes"] for t in shown] == [d["client_bytes"] for d in done]
    assert all(t["upstream_bytes"] == t["client_bytes"] for t in shown)  # all of it went
    assert [t["new_items"] for t in shown] == [1, 3]  # the whole input, each time
    assert all(t["response_id"] is None for t in shown)  # not read: relayed as it came
    assert [t["run"] for t in shown] == [1, 2]
    [state] = [e for e in events if e["type"] == "state"][-1:]
    assert state["errors"] == []


async def test_a_turn_failing_after_its_200_is_a_recent_error(
    proxy: Proxy, sidecar_factory: Any
) -> None:
    """The stream began (HTTP 200), then the model failed: the HTTP client sees a
    `response.failed` event, the middleware only the 200; the turn says so itself."""
    sidecar = await sidecar_factory(proxy.http)
    body = {"model": "sim", "input": "x", "stream": True, "metadata": {"sim_fault": "error:4"}}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{sidecar.http}/responses", json=body) as r,
    ):
        assert r.status == 200
        assert b"response.failed" in await r.read()
    events = await feed(sidecar, 1)
    (shown,) = turns(events)
    assert (shown["via"], shown["outcome"], shown["status"]) == ("full", "failed", 200)
    [state] = [e for e in events if e["type"] == "state"][-1:]
    (error,) = state["errors"]
    assert error["where"] == f"sidecar {shown['response_id']}"
    assert (error["status"], error["code"]) == (500, "server_error")
    assert "message" not in error  # its text only with console.show_content
    assert any(e["type"] == "error" and e["code"] == "server_error" for e in events)


def settings(upstream: str, **flat: Any) -> Any:
    return load_settings(None, {}, {"sidecar.upstream": upstream, **flat})


async def test_off_by_default_on_a_non_loopback_host(proxy: Proxy) -> None:
    app = create_sidecar_app(settings(proxy.http, **{"sidecar.host": "0.0.0.0"}))
    served = await serve(app, handler_cancellation=True)
    try:
        async with aiohttp.ClientSession() as http:
            for path in ("/console", "/console/feed", "/console/console.js"):
                async with http.get(f"{served.base}{path}") as r:
                    assert r.status == 404, path
    finally:
        await served.runner.cleanup()


def test_on_for_a_non_loopback_host_needs_auth(proxy: Proxy) -> None:
    flat = {"sidecar.host": "0.0.0.0", "console.enabled": "true"}
    with pytest.raises(ConfigError, match="needs proxy auth"):
        create_sidecar_app(settings(proxy.http, **flat))


async def test_behind_auth_the_feed_needs_the_key(proxy: Proxy) -> None:
    flat = {"sidecar.host": "0.0.0.0", "console.enabled": "true", "auth.api_keys": "k-1"}
    served = await serve(
        create_sidecar_app(settings(proxy.http, **flat)), handler_cancellation=True
    )
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{served.base}/console") as r:
                assert r.status == 200  # the page holds no data
            async with http.get(f"{served.base}/console/feed") as r:
                assert r.status == 401
            headers = {"Authorization": "Bearer k-1"}
            async with http.get(f"{served.base}/console/feed", headers=headers) as r:
                assert r.status == 200
                events = await read_events(r, lambda ev: any(e["type"] == "state" for e in ev))
        [state] = [e for e in events if e["type"] == "state"]
        assert [(e["where"], e["status"]) for e in state["errors"]] == [("GET /console/feed", 401)]
    finally:
        await served.runner.cleanup()

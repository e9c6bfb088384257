"""The console's routes over real HTTP (proxy/console/routes.py): its feed after a real
conversation (the openai SDK over WebSocket mode, the sim upstream), no payload text by
default, off on a non-loopback listener by default and behind auth when turned on there,
the Origin/Host policy, and the feed's bounds: pages, and a page that stops reading.

The page itself, in a real browser, is tests/system/test_console_browser.py.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable

import aiohttp
import orjson
import pytest
from openai import AsyncOpenAI
from websockets.asyncio.client import connect
from wsmode.app import create_app
from wsmode.config import ConfigError
from wsmode.ops.middleware import OPS

from tests.support.console_feed import SECRET_WORDS, Events, conversation, read_events, short
from tests.support.helpers import (
    Proxy,
    Sim,
    create,
    post_responses,
    proxy_settings,
    recv,
    sample,
    scrape,
    seconds,
    send,
    until,
    until_terminal,
    user,
)


def turns(events: Events) -> Events:
    return [e for e in events if e["type"] == "turn"]


def has_turns(n: int) -> Callable[[Events], bool]:
    return lambda events: len(turns(events)) >= n


async def feed_of(proxy: Proxy, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{proxy.served.base}/console/feed", headers=headers) as r,
    ):
        if r.status != 200:
            return r.status, await r.read()
        events = await read_events(r, lambda ev: any(e["type"] == "state" for e in ev))
        return r.status, orjson.dumps(events)


async def test_the_feed_shows_each_turn_with_its_bytes_and_no_payload_text(
    proxy: Proxy, openai_client: Callable[..., AsyncOpenAI]
) -> None:
    done = await conversation(openai_client(proxy.http, api_key="sk-test"))
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{proxy.served.base}/console/feed") as r,
    ):
        assert r.status == 200 and r.headers["Content-Type"] == "text/event-stream"
        events = await read_events(r, has_turns(3))
    hello = events[0]
    assert hello["type"] == "hello" and hello["show_content"] is False
    shown = turns(events)
    assert [t["response_id"] for t in shown] == [short(resp.id) for resp in done]
    assert [t["previous_response_id"] for t in shown] == [None, *(short(r.id) for r in done[:2])]
    metrics = await scrape(proxy)
    # the bytes of each turn add up to what the proxy counted: from the client, and upstream
    assert sum(t["client_bytes"] for t in shown) == sample(
        metrics, "wsmode_client_bytes_received_total"
    )
    assert sum(t["upstream_bytes"] for t in shown) == sample(
        metrics, "wsmode_upstream_bytes_sent_total"
    )
    # WebSocket mode: the client sends only the new turn, the upstream gets the history too
    assert shown[2]["upstream_bytes"] > shown[2]["client_bytes"]
    for t in shown:
        assert t["outcome"] == "completed" and t["source"].startswith("conn_")
        assert t["lane"] is None and t["new_items"] == 1 and t["output_items"] >= 1
        # the pool's one replica (the sim) served it, and reported no prompt cache hits
        assert t["replica"] == proxy.state.pool.replicas[0].name
        assert t["cached_tokens"] == 0
        # the time to the first event, split: the model server's part and the proxy's own
        # (reading the turn, building the request; relaying the event), each a real wait
        first = t["first_event"]
        assert first["upstream"] > 0 and first["proxy"] > 0
        assert first["proxy"] + first["upstream"] == pytest.approx(first["total"])
        # wsmode's part: before the request went out, and relaying the first event
        assert first["proxy_request"] + first["proxy_relay"] == pytest.approx(first["proxy"])
        assert first["total"] <= t["duration"]
    # the snapshot's replica: the running totals of its prompt and cached tokens (the page's
    # samples for its charts of the replicas)
    [replica] = next(e for e in events if e["type"] == "state")["upstreams"]
    assert replica["prompt_tokens"] == sum(t["input_tokens"] for t in shown) > 0
    assert replica["cached_tokens"] == 0
    raw = orjson.dumps(events).decode()
    assert not any(word in raw for word in SECRET_WORDS)
    assert "input_text" not in raw and "output_text" not in raw
    output = done[0].output_text
    assert output and output not in raw


async def test_lanes_and_http_turns_are_shown(proxy: Proxy) -> None:
    async with connect(proxy.ws) as ws:
        await send(ws, create(input=[user("hi")], stream_id="agent_a", store=False))
        assert (await until_terminal(ws))[-1]["type"] == "response.completed"
    status, _ = await post_responses(proxy, {"model": "sim", "input": "hello", "stream": True})
    assert status == 200
    async with aiohttp.ClientSession() as http, http.get(f"{proxy.served.base}/console/feed") as r:
        lane, posted = turns(await read_events(r, has_turns(2)))
    assert lane["lane"] == "agent_a" and lane["source"].startswith("conn_")
    assert posted["source"] == "http" and posted["lane"] is None
    assert posted["outcome"] == "completed" and posted["client_bytes"] > 0


async def test_an_http_turn_that_fails_is_one_error_and_a_bad_body_another(proxy: Proxy) -> None:
    missing = {"model": "sim", "input": "x", "previous_response_id": "resp_gone"}
    assert (await post_responses(proxy, missing))[0] == 400
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{proxy.http}/responses", data=b"{not json") as r:
            assert r.status == 400
        async with http.get(f"{proxy.served.base}/console/feed") as r:
            events = await read_events(r, lambda ev: any(e["type"] == "state" for e in ev))
    [state] = [e for e in events if e["type"] == "state"]
    assert [(e["where"], e["status"], e["code"]) for e in state["errors"]] == [
        ("http run 1", 400, "previous_response_not_found"),
        ("POST /v1/responses", 400, "invalid_json"),
    ]


async def test_websocket_messages_refused_before_a_run_are_recent_errors(proxy: Proxy) -> None:
    async with connect(proxy.ws) as ws:
        await ws.send("{not json")
        assert (await recv(ws))["error"]["code"] == "invalid_json"
        await send(ws, create(input=[user("hi")], temperature="hot"))
        refused = (await recv(ws))["error"]["code"]
        # a run that fails is listed once, as before
        await send(ws, create(input=[user("x")], previous_response_id="resp_gone"))
        assert (await until_terminal(ws))[-1]["type"] == "error"
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"{proxy.served.base}/console/feed") as r,
        ):
            events = await read_events(r, lambda ev: any(e["type"] == "state" for e in ev))
    [state] = [e for e in events if e["type"] == "state"]
    where = [(e["where"].split(" ")[1], e["status"], e["code"]) for e in state["errors"]]
    assert where == [
        ("message", 400, "invalid_json"),
        ("message", 400, refused),
        ("run", 400, "previous_response_not_found"),
    ]
    assert all(e["where"].startswith("conn_") for e in state["errors"])
    assert not any("message" in e for e in state["errors"])  # no text without show_content


async def test_with_show_content_the_feed_carries_the_text(
    sim: Sim,
    proxy_factory: Callable[..., Awaitable[Proxy]],
    openai_client: Callable[..., AsyncOpenAI],
) -> None:
    proxy = await proxy_factory(sim.url, console__show_content=True)
    done = await conversation(openai_client(proxy.http, api_key="sk-test"), SECRET_WORDS[:1])
    async with aiohttp.ClientSession() as http, http.get(f"{proxy.served.base}/console/feed") as r:
        [turn] = turns(await read_events(r, has_turns(1)))
    assert turn["input_text"] == f"please remember {SECRET_WORDS[0]}"
    assert turn["output_text"] == done[0].output_text


async def test_the_console_is_off_on_a_non_loopback_listener_by_default(
    sim: Sim, proxy_factory: Callable[..., Awaitable[Proxy]]
) -> None:
    proxy = await proxy_factory(sim.url, server__host="0.0.0.0")
    async with aiohttp.ClientSession() as http:
        for path in ("/console", "/console/console.js", "/console/feed"):
            async with http.get(f"{proxy.served.base}{path}") as r:
                assert r.status == 404, path
        assert proxy.served.runner.app[OPS].console is None


def test_turning_it_on_for_a_non_loopback_listener_needs_auth(sim: Sim) -> None:
    settings = proxy_settings(sim.url, server__host="0.0.0.0", console__enabled=True)
    with pytest.raises(ConfigError, match="needs proxy auth"):
        create_app(settings)


@pytest.mark.parametrize("host", ["0.0.0.0", "127.0.0.1"])
async def test_with_auth_the_page_opens_and_the_feed_needs_the_key(
    host: str, sim: Sim, proxy_factory: Callable[..., Awaitable[Proxy]]
) -> None:
    proxy = await proxy_factory(
        sim.url, server__host=host, console__enabled=True, auth__api_keys=("key-1",)
    )
    base = proxy.served.base
    async with aiohttp.ClientSession() as http, http.get(f"{base}/console") as r:
        # the page holds no data: no key needed to load it
        assert r.status == 200 and "<title>wsmode console</title>" in await r.text()
    assert (await feed_of(proxy))[0] == 401
    assert (await feed_of(proxy, {"Authorization": "Bearer wrong"}))[0] == 401
    status, raw = await feed_of(proxy, {"Authorization": "Bearer key-1"})
    assert status == 200
    events = orjson.loads(raw)
    assert events[0]["type"] == "hello"
    # the refused attempts are recent errors with their code, and the key is nowhere
    [state] = [e for e in events if e["type"] == "state"]
    codes = [(e["where"], e["status"], e["code"]) for e in state["errors"]]
    assert codes == [("GET /console/feed", 401, "invalid_api_key")] * 2
    assert b"key-1" not in raw and b"wrong" not in raw


async def test_the_origin_and_host_policy_holds_for_the_console(proxy: Proxy) -> None:
    base = proxy.served.base
    refused = [
        ("/console/feed", {"Origin": "http://evil.example"}),
        ("/console", {"Origin": "http://evil.example"}),
        ("/console", {"Sec-Fetch-Site": "cross-site"}),
        ("/console/feed", {"Host": "rebound.evil.example"}),  # DNS rebinding
        ("/console/console.js", {"Host": "rebound.evil.example"}),
    ]
    async with aiohttp.ClientSession() as http:
        for path, headers in refused:
            async with http.get(f"{base}{path}", headers=headers) as r:
                assert r.status == 403, (path, headers)
        async with http.get(f"{base}/console", headers={"Sec-Fetch-Site": "same-origin"}) as r:
            assert r.status == 200
            assert "frame-ancestors 'none'" in r.headers["Content-Security-Policy"]


async def test_pages_beyond_the_bound_get_503(
    sim: Sim, proxy_factory: Callable[..., Awaitable[Proxy]]
) -> None:
    proxy = await proxy_factory(sim.url, console__max_subscribers=1)
    url = f"{proxy.served.base}/console/feed"
    async with aiohttp.ClientSession() as http, http.get(url) as first:
        await read_events(first, lambda ev: len(ev) >= 1)
        async with http.get(url) as second:
            assert second.status == 503
            assert (await second.json())["error"]["code"] == "console_busy"


def stuck_page(port: int) -> socket.socket:
    """A console page that asks for the feed and then never reads: a socket with a small
    receive window."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall(f"GET /console/feed HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
    return sock


async def test_a_page_that_stops_reading_is_dropped_and_nothing_waits_for_it(
    sim: Sim,
    proxy_factory: Callable[..., Awaitable[Proxy]],
    openai_client: Callable[..., AsyncOpenAI],
) -> None:
    proxy = await proxy_factory(sim.url, console__subscriber_queue=8)
    console = proxy.served.runner.app[OPS].console
    assert console is not None
    seen: Events = []

    async def quick_page() -> None:
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"{proxy.served.base}/console/feed") as r,
        ):
            await read_events(r, lambda _: False, seen, timeout=120)

    reader = asyncio.create_task(quick_page())
    stuck = stuck_page(proxy.served.port)
    try:
        await until(lambda: len(console.subscribers) == 2)
        # a turn while the page is connected and not reading: nothing waits for it
        client = openai_client(proxy.http, api_key="sk-test")
        [resp] = await conversation(client, ("one",))
        await until(lambda: any(e.get("response_id") == short(resp.id) for e in seen))

        def flood() -> bool:  # large events until the stuck page's buffers and queue are full
            console.publish({"type": "padding", "pad": "x" * 65536})
            return console.dropped == 1

        await until(flood, timeout=30)
        assert console.subscribers and len(console.subscribers) == 1  # the quick page stays
        [resp] = await conversation(client, ("two",))
        await until(lambda: any(e.get("response_id") == short(resp.id) for e in seen))
        assert not reader.done()
        # the proxy closed the stuck page's socket: after what was buffered, the end
        stuck.setblocking(False)

        def ended() -> bool:
            try:
                while chunk := stuck.recv(1 << 20):
                    del chunk
            except BlockingIOError:
                return False
            return True

        await until(ended)
    finally:
        stuck.close()
        reader.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reader


async def test_a_drain_ends_the_feed(proxy: Proxy) -> None:
    ops = proxy.served.runner.app[OPS]
    async with aiohttp.ClientSession() as http, http.get(f"{proxy.served.base}/console/feed") as r:
        await read_events(r, lambda ev: len(ev) >= 2)
        ops.begin_drain()
        async with asyncio.timeout(seconds(10)):
            rest = await r.content.read()  # to the end of the stream
        # the feed ends, and the drain sent nothing: what is left is at most the state
        # snapshots of before it (one a second), none of them saying it drains
        left = [orjson.loads(block[6:]) for block in rest.split(b"\n\n") if block]
        assert all(ev["type"] == "state" and not ev["draining"] for ev in left), rest[:500]
        assert await ops.wait_drained(seconds(10))

"""A model call is sent once. A model server (or a balancer in front of it) that reads a
request and then closes or resets the connection without answering may have started on it:
the turn fails with `upstream_unavailable` and the request is not sent again. A pooled
keep-alive connection that the server closed before the request was written on it (llama.cpp
closes idle ones after a few seconds) costs nothing: the request goes on another connection.

The model server here is a raw asyncio TCP server speaking just enough HTTP/1.1, so that it
can close or reset at exactly the point each test needs; the proxy is the real one and its
clients are the `websockets` library and aiohttp."""

from __future__ import annotations

import asyncio
import itertools
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import orjson
import pytest
from websockets.asyncio.client import connect
from wsmode.sim.events import response_events
from wsmode.sim.model import plan
from wsmode.upstream import connector

from tests.support.helpers import Proxy, create, post_responses, send, until_sync, until_terminal

ProxyFactory = Callable[..., Awaitable[Proxy]]
# what the server does with the k-th request (from 1) of its n-th connection (from 1)
Behaviour = Callable[[int, int], str]  # "answer", "drop" (close unanswered), "reset"


def answer(body: dict[str, Any]) -> bytes:
    """A complete keep-alive HTTP answer: a well-formed Responses stream for `body`."""
    events = response_events(body, plan(body, seed=1, output_tokens=3, tool_calls_per_turn=0))
    sse = b"".join(
        b"event: " + ev["type"].encode() + b"\ndata: " + orjson.dumps(ev) + b"\n\n" for ev in events
    )
    head = f"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: {len(sse)}\r\n"
    return head.encode() + b"\r\n" + sse


class RawModel:
    """Reads each request whole (head and Content-Length body), records it, then does what
    `behave` says; answered connections stay open for the next request."""

    def __init__(self, behave: Behaviour, *, close_after_answer: bool = False) -> None:
        self.behave = behave
        self.close_after_answer = close_after_answer
        self.requests: list[tuple[int, str]] = []  # (connection, the input) of each request
        self.idle: dict[int, asyncio.StreamWriter] = {}  # connections waiting for a request
        self._conns = itertools.count(1)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        n = next(self._conns)
        try:
            for k in itertools.count(1):
                self.idle[n] = writer
                head = await reader.readuntil(b"\r\n\r\n")
                del self.idle[n]
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                body = orjson.loads(await reader.readexactly(length))
                self.requests.append((n, body["input"][-1]["content"]))  # the turn's text
                action = self.behave(n, k)
                if action == "reset":
                    writer.transport.abort()
                    return
                if action == "drop":
                    writer.close()
                    return
                writer.write(answer(body))
                await writer.drain()
                if self.close_after_answer:
                    writer.close()
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            self.idle.pop(n, None)
            writer.close()

    def shut_idle(self) -> None:
        """Close every idle connection at once: FIN sent now, not on the next loop turn."""
        for writer in self.idle.values():
            writer.get_extra_info("socket").shutdown(socket.SHUT_RDWR)


@asynccontextmanager
async def raw_model(behave: Behaviour, **options: Any) -> AsyncIterator[tuple[RawModel, str]]:
    model = RawModel(behave, **options)
    server = await asyncio.start_server(model.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield model, f"http://127.0.0.1:{port}/v1"
    finally:
        server.close()
        for writer in list(model.idle.values()):
            writer.close()
        await server.wait_closed()


async def proxy_for(proxy_factory: ProxyFactory, url: str) -> Proxy:
    return await proxy_factory(url, upstream__health_interval=0)


def replaced(proxy: Proxy) -> int:
    """Pooled connections the proxy found closed and did not use (upstream/connector.py)."""
    session = proxy.state.upstream.session
    assert session is not None and isinstance(session.connector, connector.CheckedConnector)
    return session.connector.replaced


async def ws_turns(proxy: Proxy, *inputs: str) -> list[dict[str, Any]]:
    """One turn per input on one WebSocket connection: each turn's last event."""
    last = []
    async with connect(proxy.ws) as ws:
        for text in inputs:
            await send(ws, create(input=text, store=False))
            last.append((await until_terminal(ws))[-1])
    return last


def not_resent(error: dict[str, Any]) -> None:
    assert error["type"] == "error" and error["status"] == 502, error
    assert error["error"]["code"] == "upstream_unavailable"
    message = error["error"]["message"]
    assert "closed the connection after the request was sent" in message
    assert "not sent again" in message


# ------------------------------------------------------------------ read, then no answer


async def test_a_request_read_and_dropped_unanswered_is_not_sent_again(
    proxy_factory: ProxyFactory,
) -> None:
    """The server reads the whole request, then closes without answering: the model got
    it once, and the client gets the error (the old code sent it a second time)."""
    async with raw_model(lambda n, k: "drop") as (model, url):
        proxy = await proxy_for(proxy_factory, url)
        [error] = await ws_turns(proxy, "one")
        assert model.requests == [(1, "one")]
        not_resent(error)
        status, doc = await post_responses(proxy, {"model": "sim", "input": "two"})
        assert status == 502 and doc["error"]["code"] == "upstream_unavailable"
        assert model.requests == [(1, "one"), (2, "two")]


async def test_a_request_on_a_reused_connection_that_is_read_then_reset_is_not_sent_again(
    proxy_factory: ProxyFactory,
) -> None:
    """The same on a keep-alive connection from the pool (where the old code took the failure
    for a stale connection and sent the turn again on a new one)."""
    async with raw_model(lambda n, k: "answer" if k == 1 else "reset") as (model, url):
        proxy = await proxy_for(proxy_factory, url)
        first, second = await ws_turns(proxy, "one", "two")
        assert first["type"] == "response.completed"
        assert model.requests == [(1, "one"), (1, "two")]  # "two" once, on the reused one
        not_resent(second)


# ------------------------------------------------------------------ closed while idle


async def test_a_keep_alive_connection_closed_right_after_the_answer_is_not_used(
    proxy_factory: ProxyFactory,
) -> None:
    """The server closes each connection right after its answer (it advertised keep-alive):
    every turn still completes, and each reached the model once."""
    async with raw_model(lambda n, k: "answer", close_after_answer=True) as (model, url):
        proxy = await proxy_for(proxy_factory, url)
        done = await ws_turns(proxy, "one", "two", "three")
        assert [ev["type"] for ev in done] == ["response.completed"] * 3
        assert [text for _, text in model.requests] == ["one", "two", "three"]
        assert [n for n, _ in model.requests] == [1, 2, 3]


async def test_a_keep_alive_connection_closed_as_the_pool_hands_it_out_is_replaced(
    proxy_factory: ProxyFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The llama.cpp case, made exact: the server closes its idle keep-alive connection at the
    instant the pool hands it to the next turn, before the event loop has read the FIN. The
    proxy sees the closed socket before writing, and the turn goes once, on a new
    connection."""
    check = connector.peer_closed
    checked: list[bool] = []

    async with raw_model(lambda n, k: "answer") as (model, url):

        def closing_first(transport: asyncio.BaseTransport | None) -> bool:
            if not checked:  # the first pooled connection handed out: the server closes it
                model.shut_idle()
                until_sync(lambda: check(transport), 2, message="the FIN never arrived")
            checked.append(check(transport))
            return checked[-1]

        monkeypatch.setattr(connector, "peer_closed", closing_first)
        proxy = await proxy_for(proxy_factory, url)
        done = await ws_turns(proxy, "one", "two", "three")
        assert [ev["type"] for ev in done] == ["response.completed"] * 3
        # "two" once, on a second connection; "three" reuses that one
        assert model.requests == [(1, "one"), (2, "two"), (2, "three")]
        assert checked == [True, False] and replaced(proxy) == 1

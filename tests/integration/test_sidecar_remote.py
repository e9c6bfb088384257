"""The sidecar against a scripted WebSocket-mode remote (a simulated remote server).

The remote records every upgrade and every `response.create` per socket, answers with the
simulated model's events, keeps the last response of each socket (as OpenAI's
connection-local cache does), and can be told to refuse the upgrade or to hit the
connection limit. It shows exactly what the sidecar put on the wire.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from wsmode.sim.events import response_events
from wsmode.sim.model import plan

from tests.support.helpers import Served, serve, user


async def send_event(ws: web.WebSocketResponse, ev: dict[str, Any]) -> None:
    await ws.send_str(orjson.dumps(ev).decode())


def events_for(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The simulated model's answer to whatever input arrived (the remote rebuilds nothing)."""
    p = plan({**body, "previous_response_id": None}, seed=0, output_tokens=3, tool_calls_per_turn=1)
    return list(response_events(body, p))


@dataclass
class Remote:
    refuse: int | None = None  # answer every upgrade with this status
    limit_at: int | None = None  # the Nth create on each socket: connection limit, then close
    upgrades: list[dict[str, str]] = field(default_factory=list)
    sockets: list[list[dict[str, Any]]] = field(default_factory=list)  # creates, per socket
    posts: list[dict[str, Any]] = field(default_factory=list)  # plain HTTP requests
    served: Served | None = None

    @property
    def url(self) -> str:
        assert self.served is not None
        return f"{self.served.base}/v1"

    def creates(self) -> list[dict[str, Any]]:
        return [c for sock in self.sockets for c in sock]

    async def ws(self, request: web.Request) -> web.StreamResponse:
        self.upgrades.append(dict(request.headers))
        if self.refuse is not None:
            return web.Response(status=self.refuse, text="no WebSocket mode here")
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        creates: list[dict[str, Any]] = []
        self.sockets.append(creates)
        last: str | None = None
        async for msg in ws:
            body = orjson.loads(msg.data)
            creates.append(body)
            if self.limit_at is not None and len(creates) == self.limit_at:
                await send_event(
                    ws,
                    {
                        "type": "error",
                        "status": 400,
                        "error": {
                            "type": "invalid_request_error",
                            "code": "websocket_connection_limit_reached",
                            "message": "Connection limit reached (60 minutes).",
                            "param": None,
                        },
                    },
                )
                await ws.close()
                break
            prev = body.get("previous_response_id")
            if prev is not None and prev != last:
                await send_event(
                    ws,
                    {
                        "type": "error",
                        "status": 400,
                        "error": {
                            "type": "invalid_request_error",
                            "code": "previous_response_not_found",
                            "message": f"Previous response with id '{prev}' not found.",
                            "param": "previous_response_id",
                        },
                    },
                )
                continue
            events = events_for(body)
            for ev in events:
                await send_event(ws, ev)
            last = events[-1]["response"]["id"]
        return ws

    async def post(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.posts.append({"body": body, "headers": dict(request.headers)})
        events = events_for(body)
        if body.get("stream"):
            sse = b"".join(
                b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n"
                for e in events
            )
            return web.Response(body=sse, content_type="text/event-stream")
        return web.Response(
            body=orjson.dumps(events[-1]["response"]), content_type="application/json"
        )


@pytest.fixture
async def remote_factory() -> AsyncIterator[Any]:
    started: list[Served] = []

    async def make(**kw: Any) -> Remote:
        remote = Remote(**kw)
        app = web.Application()
        app.router.add_get("/v1/responses", remote.ws)
        app.router.add_post("/v1/responses", remote.post)
        remote.served = await serve(app)
        started.append(remote.served)
        return remote

    yield make
    for s in started:
        await s.runner.cleanup()


TOOLS = [{"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}]


async def post(base: str, body: dict[str, Any], key: str = "sk-a") -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{base}/responses", json=body, headers={"Authorization": f"Bearer {key}"}) as r,
    ):
        raw = await r.read()
        if r.headers.get("Content-Type", "").startswith("text/event-stream"):
            return r.status, raw
        return r.status, orjson.loads(raw)


def body(history: list[Any], **extra: Any) -> dict[str, Any]:
    return {
        "model": "sim",
        "input": history,
        "tools": TOOLS,
        "tool_choice": "required",
        "instructions": "Be brief.",
        **extra,
    }


async def turns(base: str, n: int, key: str = "sk-a", **extra: Any) -> list[Any]:
    history: list[Any] = [user("go")]
    for _ in range(n):
        status, doc = await post(base, body(history, **extra), key)
        assert status == 200, doc
        call = doc["output"][0]
        history = [
            *history,
            *doc["output"],
            {"type": "function_call_output", "call_id": call["call_id"], "output": "ok"},
        ]
    return history


async def test_deltas_on_one_socket_with_the_clients_credentials(
    remote_factory: Any, sidecar_factory: Any
) -> None:
    remote = await remote_factory()
    sidecar = await sidecar_factory(remote.url)
    await turns(sidecar.http, 4)
    [creates] = remote.sockets
    assert [len(c["input"]) for c in creates] == [1, 1, 1, 1]
    assert "previous_response_id" not in creates[0]
    assert all(c["previous_response_id"] for c in creates[1:])
    assert [c["input"][0]["type"] for c in creates[1:]] == ["function_call_output"] * 3
    for c in creates:  # the turn's own settings, every time; nothing HTTP-only
        assert c["type"] == "response.create" and c["instructions"] == "Be brief."
        assert c["tools"] == TOOLS and "stream" not in c
    assert remote.upgrades[0]["Authorization"] == "Bearer sk-a"
    assert remote.posts == []


async def test_changed_settings_or_edited_history_send_the_full_request(
    remote_factory: Any, sidecar_factory: Any
) -> None:
    remote = await remote_factory()
    sidecar = await sidecar_factory(remote.url)
    history = await turns(sidecar.http, 1)
    # different instructions: the full history goes, no previous_response_id
    assert (await post(sidecar.http, body(history, instructions="Be long.")))[0] == 200
    # different tools
    assert (await post(sidecar.http, body(history, tools=[])))[0] == 200
    # the same settings but an edited earlier message
    edited = [user("GO"), *history[1:]]
    assert (await post(sidecar.http, body(edited)))[0] == 200
    full = remote.creates()[1:]
    assert len(full) == 3
    for c in full:
        assert "previous_response_id" not in c and len(c["input"]) == len(history)
    assert sidecar.state.stats["delta"] == 0


async def test_two_credentials_never_share_chains_or_sockets(
    remote_factory: Any, sidecar_factory: Any
) -> None:
    remote = await remote_factory()
    sidecar = await sidecar_factory(remote.url)
    history = await turns(sidecar.http, 1, key="sk-a")
    status, doc = await post(sidecar.http, body(history), key="sk-b")  # A's next turn, as B
    assert status == 200 and doc["status"] == "completed"
    assert len(remote.sockets) == 2
    [b_create] = remote.sockets[1]
    assert "previous_response_id" not in b_create and len(b_create["input"]) == len(history)
    assert [u["Authorization"] for u in remote.upgrades] == ["Bearer sk-a", "Bearer sk-b"]
    # and A itself still continues on its own socket
    status, _ = await post(sidecar.http, body(history), key="sk-a")
    assert status == 200 and remote.sockets[0][-1]["previous_response_id"]


async def test_connection_limit_reopens_and_sends_the_full_request(
    remote_factory: Any, sidecar_factory: Any
) -> None:
    remote = await remote_factory(limit_at=3)  # each socket dies on its third create
    sidecar = await sidecar_factory(remote.url)
    history = await turns(sidecar.http, 4)
    first, second = remote.sockets
    assert [("previous_response_id" in c, len(c["input"])) for c in first] == [
        (False, 1),
        (True, 1),
        (True, 1),  # refused: connection limit reached
    ]
    # on the new socket: the full request, then deltas again
    assert [("previous_response_id" in c, len(c["input"])) for c in second] == [
        (False, 5),
        (True, 1),
    ]
    assert len(history) == 9 and remote.posts == []
    assert sidecar.state.stats["retry_reopen"] == 1


async def test_connection_limit_twice_falls_back_to_http(
    remote_factory: Any, sidecar_factory: Any
) -> None:
    remote = await remote_factory(limit_at=1)  # every socket refuses its first create
    sidecar = await sidecar_factory(remote.url)
    status, doc = await post(sidecar.http, body([user("go")]))
    assert status == 200 and doc["status"] == "completed"
    assert len(remote.sockets) == 2 and len(remote.posts) == 1
    assert remote.posts[0]["body"] == body([user("go")])  # the client's request, unchanged
    assert remote.posts[0]["headers"]["Authorization"] == "Bearer sk-a"


@pytest.mark.parametrize("refusal", [404, 426])
async def test_refused_upgrade_means_plain_http_for_a_while(
    refusal: int, remote_factory: Any, sidecar_factory: Any
) -> None:
    remote = await remote_factory(refuse=refusal)
    sidecar = await sidecar_factory(remote.url, refusal_memory=600)
    await turns(sidecar.http, 3)
    status, raw = await post(sidecar.http, body([user("s")], stream=True))
    assert status == 200 and b"event: response.completed" in raw
    assert len(remote.upgrades) == 1  # remembered: no second attempt
    assert len(remote.posts) == 4 and remote.sockets == []
    assert [len(p["body"]["input"]) for p in remote.posts] == [1, 3, 5, 1]  # full, as sent


async def test_refusal_memory_zero_tries_websocket_mode_every_time(
    remote_factory: Any, sidecar_factory: Any
) -> None:
    remote = await remote_factory(refuse=426)
    sidecar = await sidecar_factory(remote.url, refusal_memory=0)
    await turns(sidecar.http, 2)
    assert len(remote.upgrades) == 2 and len(remote.posts) == 2


async def test_other_upgrade_failures_go_over_http_without_memory(
    remote_factory: Any, sidecar_factory: Any
) -> None:
    remote = await remote_factory(refuse=401)
    sidecar = await sidecar_factory(remote.url)
    await turns(sidecar.http, 2)
    assert len(remote.upgrades) == 2 and len(remote.posts) == 2
    assert not sidecar.state.pool.websocket_refused()


async def test_client_chained_request_is_forwarded_as_it_is_on_the_holding_socket(
    remote_factory: Any, sidecar_factory: Any
) -> None:
    remote = await remote_factory()
    sidecar = await sidecar_factory(remote.url)
    _, first = await post(sidecar.http, body([user("one")]))
    # a second socket, so that picking the one holding `first` matters
    assert (await post(sidecar.http, body([user("unrelated")], instructions="x")))[0] == 200
    chained = body([user("two")], previous_response_id=first["id"], stream=False, store=True)
    status, doc = await post(sidecar.http, chained)
    assert status == 200 and doc["previous_response_id"] == first["id"]
    # on the socket that holds `first`, exactly the client's request minus `stream`
    assert len(remote.sockets) == 2
    sent = remote.sockets[0][-1]
    assert sent == {
        "type": "response.create",
        **{k: v for k, v in chained.items() if k != "stream"},
    }


async def test_a_full_pool_reuses_the_credentials_idle_socket(
    remote_factory: Any, sidecar_factory: Any
) -> None:
    remote = await remote_factory()
    sidecar = await sidecar_factory(remote.url, max_connections=1)
    await turns(sidecar.http, 2)
    await turns(sidecar.http, 2, instructions="another conversation")
    assert len(remote.sockets) == 1 and remote.posts == []
    assert [len(c["input"]) for c in remote.sockets[0]] == [1, 1, 1, 1]


async def test_a_full_pool_closes_another_credentials_idle_socket(
    remote_factory: Any, sidecar_factory: Any
) -> None:
    remote = await remote_factory()
    sidecar = await sidecar_factory(remote.url, max_connections=1)
    await turns(sidecar.http, 1, key="sk-a")
    await turns(sidecar.http, 1, key="sk-b")
    assert [u["Authorization"] for u in remote.upgrades] == ["Bearer sk-a", "Bearer sk-b"]
    assert sidecar.state.pool.open_count == 1 and remote.posts == []

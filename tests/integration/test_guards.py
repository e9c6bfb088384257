"""Input guards ([guards], docs/guards.md) over real sockets: each sees only the turn's new
input, refuses before the model server is asked, and a refused continuation evicts its
parent. The moderation hook posts to the simulated model's /v1/moderations, which flags
text containing "forbidden"."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from websockets.asyncio.client import connect

from tests.support.helpers import (
    Proxy,
    Sim,
    create,
    free_port,
    post_responses,
    recv,
    sample,
    scrape,
    sdk_terminal,
    seconds,
    send,
    serve,
    until_terminal,
    user,
)

ProxyFactory = Callable[..., Awaitable[Proxy]]
SimFactory = Callable[..., Awaitable[Sim]]


def moderated(sim: Sim) -> dict[str, Any]:
    return {"guards__moderation_url": f"{sim.served.base}/v1/moderations"}


async def turn(ws: Any, text: str, prev: str | None = None, **fields: Any) -> dict[str, Any]:
    """Send one turn; its last event (terminal or error)."""
    if prev is not None:
        fields["previous_response_id"] = prev
    await send(ws, create(input=[user(text)], store=False, **fields))
    return (await until_terminal(ws))[-1]


async def assert_parent_evicted(ws: Any, prev: str) -> None:
    last = await turn(ws, "plain", prev)
    assert last["type"] == "error" and last["error"]["code"] == "previous_response_not_found"


async def test_new_input_size_is_limited_not_the_history(
    sim: Sim, proxy_factory: ProxyFactory
) -> None:
    proxy = await proxy_factory(sim.url, guards__max_new_input_bytes=2000)
    async with connect(proxy.ws) as ws:
        prev = None
        for _ in range(4):  # the history grows well past the limit: every turn is fine
            done = await turn(ws, "x" * 1500, prev)
            assert done["type"] == "response.completed", done
            prev = done["response"]["id"]
        sent = sim.bodies()[-1]["input"]
        assert len(sent) == 7 and sum(len(str(i)) for i in sent) > 6000  # history: ~6 KB
        err = await turn(ws, "y" * 3000, prev)
        assert err["status"] == 400
        assert err["error"]["type"] == "invalid_request_error"
        assert (err["error"]["code"], err["error"]["param"]) == ("input_too_large", "input")
        assert "at most 2000 bytes" in err["error"]["message"]
        assert len(sim.bodies()) == 4
        assert prev is not None
        await assert_parent_evicted(ws, prev)
    m = await scrape(proxy)
    assert sample(m, "wsmode_input_refusals_total", reason="input_too_large") == 1


async def test_deny_patterns(sim: Sim, proxy_factory: ProxyFactory) -> None:
    proxy = await proxy_factory(sim.url, guards__deny_patterns=(r"secret-\d+",))
    async with connect(proxy.ws) as ws:
        first = await turn(ws, "a secret is fine")
        assert first["type"] == "response.completed"
        tool_output = {"type": "function_call_output", "call_id": "c1", "output": "SECRET-42"}
        call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
        await send(ws, create(input=[user("run"), call, tool_output], stream_id="b"))
        err = await recv(ws)
        assert err["status"] == 400 and err["stream_id"] == "b"
        assert (err["error"]["code"], err["error"]["param"]) == ("invalid_prompt", "input")
    assert len(sim.bodies()) == 1
    status, body = await post_responses(proxy, {"model": "sim", "input": "tell secret-7"})
    assert status == 400 and body["error"]["code"] == "invalid_prompt"
    assert len(sim.bodies()) == 1
    # both refusals, over WebSocket and over HTTP, are counted
    m = await scrape(proxy)
    assert sample(m, "wsmode_input_refusals_total", reason="invalid_prompt") == 2


async def test_moderation_sees_only_new_text_and_blocks_a_flagged_turn(
    sim: Sim, proxy_factory: ProxyFactory
) -> None:
    proxy = await proxy_factory(sim.url, **moderated(sim))
    async with connect(proxy.ws) as ws:
        first = await turn(ws, "hello there")
        assert first["type"] == "response.completed", first
        prev = first["response"]["id"]
        second = await turn(ws, "and more", prev)
        assert second["type"] == "response.completed", second
        err = await turn(ws, "something Forbidden", second["response"]["id"])
        assert err["status"] == 400
        assert (err["error"]["code"], err["error"]["param"]) == ("invalid_prompt", "input")
        assert "harassment" in err["error"]["message"]
        assert len(sim.bodies()) == 2, "the flagged turn reached the model"
        await assert_parent_evicted(ws, second["response"]["id"])
    bodies = list(sim.state.moderations)
    assert [b["input"] for b in bodies[:3]] == [
        ["hello there"],
        ["and more"],
        ["something Forbidden"],
    ]  # the new text only, never the history
    assert bodies[0]["model"] == "omni-moderation-latest"


async def test_moderation_over_the_sdk_and_http(
    sim: Sim, proxy_factory: ProxyFactory, openai_client: Any
) -> None:
    proxy = await proxy_factory(sim.url, **moderated(sim))
    client = openai_client(proxy.http, api_key="sk-test")
    async with client.responses.connect() as conn:
        await conn.response.create(model="sim", input="a forbidden word", store=False)
        err = await sdk_terminal(conn)
        assert err.type == "error" and err.error.code == "invalid_prompt"
    status, body = await post_responses(proxy, {"model": "sim", "input": "forbidden!"})
    assert status == 400 and body["error"]["code"] == "invalid_prompt"
    status, body = await post_responses(proxy, {"model": "sim", "input": "fine"})
    assert status == 200 and body["status"] == "completed"
    assert len(sim.bodies()) == 1


async def test_a_warmup_cannot_slip_text_past_moderation(
    sim: Sim, proxy_factory: ProxyFactory
) -> None:
    """A `generate: false` turn goes to no model, so nothing moderates it then; its text is
    moderated with the next turn that does go to the model."""
    proxy = await proxy_factory(sim.url, **moderated(sim))
    async with connect(proxy.ws) as ws:
        warm = await turn(ws, "forbidden plan", generate=False)
        assert warm["type"] == "response.completed"
        err = await turn(ws, "go on", warm["response"]["id"])
        assert err["type"] == "error" and err["error"]["code"] == "invalid_prompt"
    assert sim.bodies() == []
    assert sim.state.moderations[-1]["input"] == ["forbidden plan", "go on"]


async def test_moderation_failure_fails_closed_or_open(
    sim: Sim, proxy_factory: ProxyFactory
) -> None:
    down = {"guards__moderation_url": f"http://127.0.0.1:{free_port()}/v1/moderations"}
    closed = await proxy_factory(sim.url, **down)
    async with connect(closed.ws) as ws:
        err = await turn(ws, "hello")
        assert err["type"] == "error" and err["status"] == 503
        assert err["error"]["code"] == "moderation_unavailable"
    assert sim.bodies() == []
    m = await scrape(closed)
    assert sample(m, "wsmode_input_refusals_total", reason="moderation_unavailable") == 1
    opened = await proxy_factory(sim.url, guards__moderation_fail_open=True, **down)
    async with connect(opened.ws) as ws:
        assert (await turn(ws, "hello"))["type"] == "response.completed"
    assert len(sim.bodies()) == 1


async def test_moderation_time_is_the_proxy_part_of_time_to_first_event(
    sim_factory: SimFactory, proxy_factory: ProxyFactory
) -> None:
    """Attribution, not speed: a moderation answer delayed by `delay` seconds shows in the
    `proxy` part of the time to first event (a lower bound), not in the `upstream` part."""
    delay = seconds(0.3)
    sim = await sim_factory(moderation_delay_ms=delay * 1000)
    proxy = await proxy_factory(sim.url, **moderated(sim))
    async with connect(proxy.ws) as ws:
        assert (await turn(ws, "hello"))["type"] == "response.completed"
    m = await scrape(proxy)
    assert sample(m, "wsmode_time_to_first_event_seconds_count", part="proxy") == 1
    assert sample(m, "wsmode_time_to_first_event_seconds_sum", part="proxy") >= delay
    up = sample(m, "wsmode_time_to_first_event_seconds_sum", part="upstream")
    total = sample(m, "wsmode_time_to_first_event_seconds_sum", part="total")
    assert total - up >= delay


async def test_moderation_never_follows_a_redirect(sim: Sim, proxy_factory: ProxyFactory) -> None:
    """The moderation endpoint answers 307 to the sim's: following it would send the new
    text (and the moderation key) elsewhere; it is a failed check instead (fail closed)."""

    async def moved(request: web.Request) -> web.Response:
        raise web.HTTPTemporaryRedirect(f"{sim.served.base}/v1/moderations")

    app = web.Application()
    app.router.add_post("/v1/moderations", moved)
    redirecting = await serve(app)
    try:
        proxy = await proxy_factory(
            sim.url, guards__moderation_url=f"{redirecting.base}/v1/moderations"
        )
        async with connect(proxy.ws) as ws:
            err = await turn(ws, "hello")
    finally:
        await redirecting.runner.cleanup()
    assert err["type"] == "error" and err["status"] == 503
    assert err["error"]["code"] == "moderation_unavailable"
    assert "307" in err["error"]["message"]
    assert list(sim.state.moderations) == [] and sim.bodies() == []

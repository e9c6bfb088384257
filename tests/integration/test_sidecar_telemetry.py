"""The sidecar traced (docs/telemetry.md "The sidecar"): an openai SDK client over plain HTTP
-> `wsmode sidecar` -> `wsmode serve` -> the simulated model, both proxies exporting to the
tests' OTLP/HTTP receiver (tests/support/otlp.py). Each HTTP request's `traceparent` is
continued by the sidecar's turn span; the sidecar hands its `response.create` span's context to
the server in the message's `client_metadata`, so the server's turn, on a socket the sidecar
reuses, is a child of that message, and the model server gets the server's request span: one
trace per turn, client -> sidecar -> wsmode -> model. Also: a turn that falls back to plain
HTTP carries the context in its headers; with the sidecar's tracing off the client's own
context is passed on; and off, the sidecar imports nothing of OpenTelemetry."""

from __future__ import annotations

import textwrap
from collections.abc import Awaitable, Callable
from typing import Any

from opentelemetry.proto.trace.v1.trace_pb2 import Span
from wsmode.ops.telemetry import tracing_of

from tests.support.helpers import Proxy, Sidecar, Sim, user
from tests.support.otlp import Received, assert_off_exports_nothing, received_until

TRACE_ID = "5b8efff798038103d269b633813fc60c"
CLIENT_SPANS = ("eee19b7ec3c1b174", "eee19b7ec3c1b175", "eee19b7ec3c1b176")

ProxyFactory = Callable[..., Awaitable[Proxy]]
SidecarFactory = Callable[..., Awaitable[Sidecar]]


def traced(receiver: Received) -> dict[str, Any]:
    return {"telemetry__enabled": True, "telemetry__endpoint": receiver.url}


def traceparent(parent: str) -> dict[str, str]:
    return {"traceparent": f"00-{TRACE_ID}-{parent}-01", "tracestate": "agent=1"}


async def agent(client: Any, turns: int) -> list[Any]:
    """An HTTP-only agent: every turn sends the whole history, each its own client span."""
    history: list[Any] = []
    done = []
    for n in range(turns):
        history.append(user(f"step {n}"))
        resp = await client.responses.create(
            model="sim", input=history, store=False, extra_headers=traceparent(CLIENT_SPANS[n])
        )
        assert resp.status == "completed"
        history += [item.model_dump(exclude_none=True) for item in resp.output]
        done.append(resp)
    return done


def header(request: dict[str, Any], name: str) -> str | None:
    return {k.lower(): v for k, v in request["headers"].items()}.get(name)


def by_start(spans: list[Span]) -> list[Span]:
    return sorted(spans, key=lambda s: s.start_time_unix_nano)


async def test_one_trace_runs_client_sidecar_wsmode_model(
    otlp: Received,
    sim: Sim,
    proxy_factory: ProxyFactory,
    sidecar_factory: SidecarFactory,
    openai_client: Any,
) -> None:
    proxy = await proxy_factory(sim.url, **traced(otlp))
    sidecar = await sidecar_factory(proxy.http, **traced(otlp))
    done = await agent(openai_client(sidecar.http, api_key="sk-test"), 3)

    def complete(got: Received) -> bool:  # three turns on each side, every request's span
        chats = got.named("chat ")
        return (
            len(chats) == 6
            and len(got.named("response.create")) == 3
            and (len(got.named("POST")) == 3)
        )

    await received_until(tracing_of(sidecar.served.runner.app), otlp, complete)
    await received_until(tracing_of(proxy.served.runner.app), otlp, complete)
    chats = otlp.named("chat ")
    ours = by_start([s for s in chats if otlp.service(s) == "wsmode-sidecar"])
    served = by_start([s for s in chats if otlp.service(s) == "wsmode"])
    assert len(ours) == len(served) == 3
    assert {s.trace_id.hex() for s in otlp.spans} == {TRACE_ID}  # one trace, end to end
    assert sidecar.state.pool.opened == 1  # every turn went on the one pooled socket
    for n, (mine, theirs, resp) in enumerate(zip(ours, served, done, strict=True)):
        # the sidecar's turn continues the HTTP request's own span
        assert mine.kind == Span.SPAN_KIND_SERVER and mine.name == "chat sim"
        assert mine.parent_span_id.hex() == CLIENT_SPANS[n]
        a = otlp.attrs(mine)
        assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.model"] == "sim"
        assert a["gen_ai.response.id"] == resp.id and a["gen_ai.response.model"] == "sim"
        assert a["gen_ai.usage.input_tokens"] > 0 and a["gen_ai.usage.output_tokens"] > 0
        assert a["gen_ai.response.finish_reasons"] == ["stop"]
        assert a["http.response.status_code"] == 200 and a["wsmode.outcome"] == "completed"
        assert a["wsmode.via"] == ("full" if n == 0 else "delta") and a["wsmode.retries"] == 0
        assert a["wsmode.bytes_saved"] == max(
            0, a["wsmode.client_bytes"] - a["wsmode.upstream_bytes"]
        )
        if n:
            assert a["wsmode.bytes_saved"] > 0  # a continuation: only the new items went
        # its one message on the socket, and the server's turn beneath that message
        (message,) = otlp.children(mine)
        m = otlp.attrs(message)
        assert message.kind == Span.SPAN_KIND_CLIENT and message.name == "response.create"
        assert m["wsmode.via"] == a["wsmode.via"] and m["wsmode.outcome"] == "completed"
        assert m["url.full"] == f"ws://127.0.0.1:{proxy.served.port}/v1/responses"
        assert m["wsmode.upstream_bytes"] == a["wsmode.upstream_bytes"]
        assert theirs.parent_span_id == message.span_id
        assert otlp.attrs(theirs)["gen_ai.response.id"] == resp.id
        # and the model server was handed the server's request span
        (request,) = otlp.children(theirs)
        handed = header(sim.state.requests[n], "traceparent")
        assert handed == f"00-{TRACE_ID}-{request.span_id.hex()}-01"
        assert header(sim.state.requests[n], "tracestate") == "agent=1"
    assert {r["service.name"] for r in otlp.resources} == {"wsmode", "wsmode-sidecar"}


async def test_a_turn_over_plain_http_carries_the_context_in_its_headers(
    otlp: Received, sim: Sim, sidecar_factory: SidecarFactory, openai_client: Any
) -> None:
    """The simulated model has no WebSocket mode: the sidecar relays the request over plain
    HTTP, its span's child is that request, and the model gets that child's context."""
    sidecar = await sidecar_factory(sim.url, **traced(otlp))
    (resp,) = await agent(openai_client(sidecar.http, api_key="sk-test"), 1)
    tracing = tracing_of(sidecar.served.runner.app)
    await received_until(tracing, otlp, lambda got: bool(got.named("chat ") and got.named("POST")))
    (turn,) = otlp.named("chat ")
    a = otlp.attrs(turn)
    assert turn.parent_span_id.hex() == CLIENT_SPANS[0]
    assert a["wsmode.via"] == "http" and a["wsmode.outcome"] == "relayed"
    assert a["http.response.status_code"] == 200
    assert a["wsmode.upstream_bytes"] == a["wsmode.client_bytes"] > 0
    (request,) = otlp.children(turn)
    r = otlp.attrs(request)
    assert request.kind == Span.SPAN_KIND_CLIENT and request.name == "POST"
    assert r["http.response.status_code"] == 200 and r["url.full"] == f"{sim.url}/responses"
    (http,) = sim.state.requests
    assert header(http, "traceparent") == f"00-{TRACE_ID}-{request.span_id.hex()}-01"
    assert http["body"]["input"][0]["content"] == "step 0" and resp.status == "completed"


async def test_with_its_tracing_off_the_sidecar_passes_the_client_context_on(
    otlp: Received,
    sim: Sim,
    proxy_factory: ProxyFactory,
    sidecar_factory: SidecarFactory,
    openai_client: Any,
) -> None:
    proxy = await proxy_factory(sim.url, **traced(otlp))
    sidecar = await sidecar_factory(proxy.http)  # tracing off (no OTEL_* variables here)
    assert tracing_of(sidecar.served.runner.app) is None
    await agent(openai_client(sidecar.http, api_key="sk-test"), 2)
    tracing = tracing_of(proxy.served.runner.app)
    await received_until(tracing, otlp, lambda got: len(got.named("chat ")) == 2)
    # each turn of the one socket is a child of its own HTTP request's span
    turns = by_start(otlp.named("chat "))
    assert [s.parent_span_id.hex() for s in turns] == list(CLIENT_SPANS[:2])
    assert {s.trace_id.hex() for s in turns} == {TRACE_ID}
    assert sidecar.state.pool.opened == 1


OFF = textwrap.dedent(
    """
    import asyncio, os, sys
    import aiohttp
    from aiohttp import web
    from wsmode.app import create_app
    from wsmode.config import load_settings
    from wsmode.sidecar.app import create_sidecar_app

    async def serve(app):
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return runner, runner.addresses[0][1]

    async def main():
        env = dict(os.environ)
        proxy, port = await serve(create_app(load_settings(None, env, {})))
        flat = {"sidecar.upstream": f"http://127.0.0.1:{port}/v1"}
        sidecar, side = await serve(create_sidecar_app(load_settings(None, env, flat)))
        body = {"model": "sim", "input": "hi", "store": False}
        headers = {"traceparent": "00-5b8efff798038103d269b633813fc60c-eee19b7ec3c1b174-01"}
        async with aiohttp.ClientSession() as http:
            for _ in range(2):
                async with http.post(f"http://127.0.0.1:{side}/v1/responses", json=body,
                                     headers=headers) as r:
                    assert r.status == 200, r.status
        await sidecar.cleanup()
        await proxy.cleanup()
        loaded = sorted(m for m in sys.modules if m.startswith("opentelemetry"))
        print("loaded:", loaded)
        assert not loaded

    asyncio.run(main())
    """
)


async def test_off_the_sidecar_imports_and_exports_nothing(otlp: Received) -> None:
    """The sidecar and the proxy with its built-in simulated model, in one process, both
    off by the setting though the standard variable names a receiver."""
    await assert_off_exports_nothing(OFF, otlp)

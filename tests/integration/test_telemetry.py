"""OpenTelemetry traces of turns, exported to an OTLP/HTTP receiver the test runs
(tests/support/otlp.py): the openai SDK over WebSocket mode and over plain HTTP, the client's
traceparent continued, the model server given the same trace; and with tracing off, no
opentelemetry import at all. The child spans (summaries, moderation) and the replicas are in
test_telemetry_children.py; the sidecar's spans in test_sidecar_telemetry.py."""

from __future__ import annotations

import textwrap
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from wsmode.ops.telemetry import tracing_of

from tests.support.helpers import Proxy, Sim, sdk_terminal
from tests.support.otlp import Received, assert_off_exports_nothing
from tests.support.otlp import exported as otlp_exported

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


async def exported(proxy: Proxy, got: Received, turns: int) -> list[Span]:
    """The turn spans, once the proxy's exporter has sent them."""
    return await otlp_exported(tracing_of(proxy.served.runner.app), got, "chat ", turns)


def check_turn(got: Received, span: Span, sim_headers: dict[str, str]) -> dict[str, Any]:
    a = got.attrs(span)
    assert span.kind == Span.SPAN_KIND_SERVER
    assert span.trace_id.hex() == TRACE_ID and span.parent_span_id.hex() == PARENT_ID
    assert span.name == "chat sim"
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.provider.name"] == "openai"
    assert a["gen_ai.request.model"] == a["gen_ai.response.model"] == "sim"
    assert a["gen_ai.response.id"].startswith("resp_")
    assert a["gen_ai.conversation.id"]
    assert a["gen_ai.usage.input_tokens"] > 0 and a["gen_ai.usage.output_tokens"] > 0
    assert a["gen_ai.response.finish_reasons"] == ["stop"]
    assert a["wsmode.outcome"] == "completed" and a["wsmode.replica"]
    assert a["wsmode.client_bytes"] > 0 and a["wsmode.upstream_bytes"] > 0
    assert a["wsmode.bytes_saved"] == max(0, a["wsmode.upstream_bytes"] - a["wsmode.client_bytes"])
    assert a["wsmode.time_to_first_chunk"] >= 0
    assert [e.name for e in span.events] == ["first_chunk"]
    assert "gen_ai.input.messages" not in a and "gen_ai.output.messages" not in a
    assert "error.type" not in a
    # its upstream request, and the trace context the model server got
    (child,) = [s for s in got.spans if s.parent_span_id == span.span_id]
    c = got.attrs(child)
    assert child.kind == Span.SPAN_KIND_CLIENT and child.name == "POST"
    assert child.trace_id == span.trace_id
    assert c["http.request.method"] == "POST" and c["http.response.status_code"] == 200
    assert c["server.address"] == "127.0.0.1" and c["server.port"] > 0
    assert c["url.full"].endswith("/v1/responses")
    version, trace_id, parent, _ = {k.lower(): v for k, v in sim_headers.items()}[
        "traceparent"
    ].split("-")
    assert (version, trace_id, parent) == ("00", TRACE_ID, child.span_id.hex())
    return a


async def test_websocket_turns_are_traced(
    otlp: Received,
    sim: Sim,
    proxy_factory: Callable[..., Awaitable[Proxy]],
    openai_client: Any,
) -> None:
    proxy = await proxy_factory(sim.url, telemetry__enabled=True, telemetry__endpoint=otlp.url)
    client = openai_client(proxy.http, api_key="sk-test")
    previous: str | None = None
    async with client.responses.connect(extra_headers={"traceparent": TRACEPARENT}) as conn:
        for text in ("Say hi", "more"):
            extra = {"previous_response_id": previous} if previous else {}
            await conn.response.create(model="sim", input=text, store=False, **extra)
            done = await sdk_terminal(conn)
            assert done.type == "response.completed"
            previous = done.response.id
    spans = await exported(proxy, otlp, 2)
    assert len(spans) == 2
    first, second = sorted(spans, key=lambda s: s.start_time_unix_nano)
    a1 = check_turn(otlp, first, sim.state.requests[0]["headers"])
    a2 = check_turn(otlp, second, sim.state.requests[1]["headers"])
    assert a2["gen_ai.response.id"] == previous
    # one conversation, and the second turn's history was the proxy's to send
    assert a1["gen_ai.conversation.id"] == a2["gen_ai.conversation.id"]
    assert a2["wsmode.bytes_saved"] > 0
    assert otlp.resources[0]["service.name"] == "wsmode"


async def test_a_message_s_own_trace_context_wins_over_the_handshake_s(
    otlp: Received, sim: Sim, proxy_factory: Callable[..., Awaitable[Proxy]], openai_client: Any
) -> None:
    """A WebSocket message has no headers: a turn may name its own parent in its
    `client_metadata` (Codex's keys, as the sidecar sends them); a turn without one is the
    handshake's child. Either way the model server gets none of the metadata."""
    proxy = await proxy_factory(sim.url, telemetry__enabled=True, telemetry__endpoint=otlp.url)
    client = openai_client(proxy.http, api_key="sk-test")
    own = "1111111111111111"
    metadata = {
        "ws_request_header_traceparent": f"00-{'ab' * 16}-{own}-01",
        "ws_request_header_tracestate": "vendor=x",
        "session": "kept for the client",
    }
    async with client.responses.connect(extra_headers={"traceparent": TRACEPARENT}) as conn:
        for extra in ({"client_metadata": metadata}, {}):  # the SDK's create has no such field
            create = {"type": "response.create", "model": "sim", "input": "hi", "store": False}
            await conn.send({**create, **extra})
            assert (await sdk_terminal(conn)).type == "response.completed"
    first, second = sorted(await exported(proxy, otlp, 2), key=lambda s: s.start_time_unix_nano)
    assert (first.trace_id.hex(), first.parent_span_id.hex()) == ("ab" * 16, own)
    assert first.trace_state == "vendor=x"
    assert (second.trace_id.hex(), second.parent_span_id.hex()) == (TRACE_ID, PARENT_ID)
    assert all("client_metadata" not in body for body in sim.bodies())
    handed = sim.state.requests[0]["headers"]
    assert {k.lower(): v for k, v in handed.items()}["traceparent"].split("-")[1] == "ab" * 16


async def test_http_turn_traced_from_the_standard_variables(
    otlp: Received,
    sim: Sim,
    proxy_factory: Callable[..., Awaitable[Proxy]],
    openai_client: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", otlp.url)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "proxy-under-test")
    proxy = await proxy_factory(sim.url)  # telemetry.enabled = "auto"
    client = openai_client(proxy.http, api_key="sk-test")
    done = await client.responses.create(
        model="sim", input="Say hi", store=False, extra_headers={"traceparent": TRACEPARENT}
    )
    assert done.status == "completed"
    (span,) = await exported(proxy, otlp, 1)
    a = check_turn(otlp, span, sim.state.requests[0]["headers"])
    assert a["gen_ai.response.id"] == done.id
    assert otlp.resources[0]["service.name"] == "proxy-under-test"


async def test_content_only_when_asked(
    otlp: Received, sim: Sim, proxy_factory: Callable[..., Awaitable[Proxy]], openai_client: Any
) -> None:
    proxy = await proxy_factory(
        sim.url,
        telemetry__enabled=True,
        telemetry__endpoint=otlp.url,
        telemetry__record_content=True,
    )
    client = openai_client(proxy.http, api_key="sk-test")
    done = await client.responses.create(model="sim", input="Say hi", store=False)
    (span,) = await exported(proxy, otlp, 1)
    a = otlp.attrs(span)
    assert "Say hi" in a["gen_ai.input.messages"]
    assert done.output_text[:10] in a["gen_ai.output.messages"]
    assert not span.parent_span_id  # no traceparent from the client: a new trace


async def test_failed_turn_has_its_error_type(
    otlp: Received, proxy_factory: Callable[..., Awaitable[Proxy]], openai_client: Any
) -> None:
    proxy = await proxy_factory(
        "http://127.0.0.1:9/v1", telemetry__enabled=True, telemetry__endpoint=otlp.url
    )
    client = openai_client(proxy.http, api_key="sk-test", max_retries=0)
    with pytest.raises(Exception):  # noqa: B017 - the SDK's error class for a 502
        await client.responses.create(model="sim", input="Say hi", store=False)
    (span,) = await exported(proxy, otlp, 1)
    a = otlp.attrs(span)
    assert a["error.type"] == "upstream_unavailable" and a["wsmode.outcome"] == "failed"
    assert span.status.code == span.status.STATUS_CODE_ERROR
    (child,) = [s for s in otlp.spans if s.parent_span_id == span.span_id]
    assert otlp.attrs(child)["error.type"] == "upstream_unavailable"


OFF = textwrap.dedent(
    """
    import asyncio, sys
    import aiohttp
    from aiohttp import web
    from wsmode.app import create_app
    from wsmode.config import load_settings

    async def main():
        settings = load_settings(None, dict(__import__("os").environ), {})
        runner = web.AppRunner(create_app(settings))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        body = {"model": "sim", "input": "hi", "store": False}
        async with aiohttp.ClientSession() as http:
            headers = {"traceparent": "TRACEPARENT"}
            async with http.post(f"http://127.0.0.1:{port}/v1/responses", json=body,
                                 headers=headers) as r:
                assert r.status == 200, r.status
            async with http.ws_connect(f"ws://127.0.0.1:{port}/v1/responses",
                                       headers=headers) as ws:
                await ws.send_json({"type": "response.create", **body})
                while (await ws.receive_json())["type"] != "response.completed":
                    pass
        await runner.cleanup()
        loaded = sorted(m for m in sys.modules if m.startswith("opentelemetry"))
        print("loaded:", loaded)
        assert not loaded

    asyncio.run(main())
    """
).replace("TRACEPARENT", TRACEPARENT)


async def test_off_imports_and_exports_nothing(otlp: Received) -> None:
    """Off by the setting, though the standard variable names a receiver: the proxy (and
    its built-in simulated model) serve an HTTP and a WebSocket turn, and no opentelemetry
    module was ever imported; the receiver got nothing."""
    await assert_off_exports_nothing(OFF, otlp)

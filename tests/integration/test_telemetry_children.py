"""The child spans of a traced turn beside its upstream request (docs/telemetry.md "Child
spans"): a compaction's summarising request and a moderation call, each its own span under
the turn; and a pool of two `wsmode sim` processes, where each turn says which replica served
it and how the pool placed it (`wsmode.replica`, `wsmode.affinity`), a chain moved off a
killed replica included. All exported to the tests' OTLP/HTTP receiver (tests/support/otlp.py)
and read back from the protobuf."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from websockets.asyncio.client import ClientConnection, connect
from wsmode.core.context.compaction import SUMMARY_INSTRUCTIONS
from wsmode.ops.telemetry import tracing_of

from tests.support.helpers import (
    Proxy,
    Sim,
    SimProcess,
    create,
    send,
    sim_processes,
    until_terminal,
    user,
)
from tests.support.otlp import Received, received_until

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_ID = "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
WINDOW = 1600
CM = [{"type": "compaction", "compact_threshold": 1000}]
MAX_TURNS = 12  # a conversation this long crosses the threshold well before its end

ProxyFactory = Callable[..., Awaitable[Proxy]]
SimFactory = Callable[..., Awaitable[Sim]]


def traced(receiver: Received, **more: Any) -> dict[str, Any]:
    return {"telemetry__enabled": True, "telemetry__endpoint": receiver.url, **more}


async def turn(ws: ClientConnection, text: str, prev: str | None = None, **fields: Any) -> Any:
    """One turn; its last event (terminal or error)."""
    if prev is not None:
        fields["previous_response_id"] = prev
    await send(ws, create(input=[user(text)], store=False, **fields))
    return (await until_terminal(ws))[-1]


def fact(i: int) -> str:
    return f"fact-{i} the user notes that item {i} matters " + "and more detail " * 35


def turns_of(got: Received) -> list[Span]:
    return sorted(got.named("chat "), key=lambda s: s.start_time_unix_nano)


def header(request: dict[str, Any], name: str) -> str | None:
    return {k.lower(): v for k, v in request["headers"].items()}.get(name)


async def test_a_compaction_summary_is_a_child_span_with_its_own_request(
    otlp: Received, sim_factory: SimFactory, proxy_factory: ProxyFactory
) -> None:
    sim = await sim_factory(context_window=WINDOW)
    proxy = await proxy_factory(sim.url, upstream__context_window=WINDOW, **traced(otlp))
    prev: str | None = None
    compacted = 0
    async with connect(proxy.ws, additional_headers={"traceparent": TRACEPARENT}) as ws:
        for i in range(MAX_TURNS):
            done = await turn(ws, fact(i), prev, context_management=CM)
            assert done["type"] == "response.completed", done
            prev = done["response"]["id"]
            if done["response"]["output"][0]["type"] == "compaction":
                compacted = i + 1
                break
    assert compacted, "no turn was compacted"
    summaries = [
        r for r in sim.state.requests if r["body"].get("instructions") == SUMMARY_INSTRUCTIONS
    ]
    assert summaries

    def complete(got: Received) -> bool:
        spans = got.named("compaction summary")
        return (
            len(turns_of(got)) >= compacted
            and bool(spans)
            and all(got.children(s) for s in spans)
            and all(got.children(t) for t in turns_of(got))
        )

    await received_until(tracing_of(proxy.served.runner.app), otlp, complete)
    spans = otlp.named("compaction summary")  # one per summarising request
    assert len(spans) == len(summaries)
    parent = turns_of(otlp)[compacted - 1]  # the turn that was compacted
    assert parent.name == "chat sim" and parent.kind == Span.SPAN_KIND_SERVER
    assert parent.parent_span_id.hex() == PARENT_ID  # the turn's parent is the client's
    # beside the summaries, the turn's own request
    assert sorted(s.name for s in otlp.children(parent)) == [
        "POST",
        *["compaction summary"] * len(spans),
    ]
    handed = {header(r, "traceparent") for r in summaries}
    for summary in spans:
        assert summary.parent_span_id == parent.span_id
        assert summary.kind == Span.SPAN_KIND_INTERNAL and summary.trace_id.hex() == TRACE_ID
        a = otlp.attrs(summary)
        assert a["wsmode.compaction"] == "summary" and a["gen_ai.operation.name"] == "chat"
        assert a["gen_ai.provider.name"] == "openai" and "error.type" not in a
        (request,) = otlp.children(summary)  # beneath it, the summarising request
        r = otlp.attrs(request)
        assert request.kind == Span.SPAN_KIND_CLIENT and request.name == "POST"
        assert r["http.response.status_code"] == 200 and r["url.full"].endswith("/v1/responses")
        assert summary.start_time_unix_nano <= request.start_time_unix_nano
        assert request.end_time_unix_nano <= summary.end_time_unix_nano
        # the model server was handed the summarising request's span as its parent
        assert f"00-{TRACE_ID}-{request.span_id.hex()}-01" in handed
    # the other turns have no summary
    for other in turns_of(otlp)[: compacted - 1]:
        assert [s.name for s in otlp.children(other)] == ["POST"]


async def test_a_moderation_call_is_a_child_span_and_a_flagged_turn_has_no_request(
    otlp: Received, sim: Sim, proxy_factory: ProxyFactory
) -> None:
    proxy = await proxy_factory(
        sim.url, guards__moderation_url=f"{sim.served.base}/v1/moderations", **traced(otlp)
    )
    async with connect(proxy.ws, additional_headers={"traceparent": TRACEPARENT}) as ws:
        fine = await turn(ws, "hello there")
        assert fine["type"] == "response.completed", fine
        flagged = await turn(ws, "something forbidden", fine["response"]["id"])
        assert flagged["type"] == "error" and flagged["error"]["code"] == "invalid_prompt"
        moderation_headers = {k.lower() for k in sim.state.last_headers}  # the last request
    assert len(sim.state.moderations) == 2 and len(sim.bodies()) == 1

    def complete(got: Received) -> bool:
        return (
            len(turns_of(got)) == 2
            and len(got.named("moderation")) == 2
            and len(got.named("POST")) == 1
        )

    await received_until(tracing_of(proxy.served.runner.app), otlp, complete)
    first, second = turns_of(otlp)
    checked, request = sorted(otlp.children(first), key=lambda s: s.start_time_unix_nano)
    # the check runs before the model request, which waits for its answer
    assert (checked.name, request.name) == ("moderation", "POST")
    assert checked.end_time_unix_nano <= request.start_time_unix_nano
    assert checked.kind == Span.SPAN_KIND_CLIENT and checked.trace_id.hex() == TRACE_ID
    assert otlp.attrs(checked)["wsmode.guard"] == "moderation"
    # the flagged turn: checked, refused, and the model server never asked
    (only,) = otlp.children(second)
    assert only.name == "moderation"
    a = otlp.attrs(second)
    assert a["wsmode.outcome"] == "rejected" and a["error.type"] == "invalid_prompt"
    assert "gen_ai.response.id" not in a and "wsmode.replica" not in a
    # the model server is handed the trace; the moderation service, another one, is not
    assert header(sim.state.requests[0], "traceparent") is not None
    assert "content-type" in moderation_headers and "traceparent" not in moderation_headers


@pytest.fixture
def sims() -> Iterator[list[SimProcess]]:
    with sim_processes(2) as started:
        yield started


async def test_two_replicas_each_turn_names_its_replica_and_its_placement(
    otlp: Received, sims: list[SimProcess], proxy_factory: ProxyFactory
) -> None:
    for s in sims:
        await s.ready()
    proxy = await proxy_factory(
        "",
        upstream__urls=tuple(s.url for s in sims),
        upstream__health_interval=0,  # passive ejection only
        upstream__eject_after_failures=1,
        **traced(otlp),
    )
    ports = {s.name: s.port for s in sims}
    async with connect(proxy.ws, additional_headers={"traceparent": TRACEPARENT}) as ws:
        first = await turn(ws, "one")
        second = await turn(ws, "two", first["response"]["id"])
        assert second["type"] == "response.completed", second
        tracing = tracing_of(proxy.served.runner.app)
        await received_until(tracing, otlp, lambda got: len(got.named("POST")) == 2)
        home = otlp.attrs(turns_of(otlp)[0])["wsmode.replica"]
        (other,) = [s for s in sims if s.name != home]
        next(s for s in sims if s.name == home).stop(kill=True)  # dies mid-conversation
        third = await turn(ws, "three", second["response"]["id"])
        assert third["type"] == "response.completed", third
    await received_until(tracing, otlp, lambda got: len(got.named("POST")) == 4)
    spans = turns_of(otlp)
    assert len(spans) == 3 and {s.trace_id.hex() for s in spans} == {TRACE_ID}
    shown = [otlp.attrs(s) for s in spans]
    assert [(a["wsmode.replica"], a["wsmode.affinity"]) for a in shown] == [
        (home, "new"),  # a new chain, placed by its key
        (home, "hit"),  # on the replica that holds its history
        (other.name, "moved"),  # its replica gone: the next one, once
    ]
    assert len({a["gen_ai.conversation.id"] for a in shown}) == 1
    # each request span names the replica it went to; the moved turn tried the dead one first
    for span, a in zip(spans[:2], shown[:2], strict=True):
        (request,) = otlp.children(span)
        assert otlp.attrs(request)["server.port"] == ports[a["wsmode.replica"]]
    tried = sorted(otlp.children(spans[2]), key=lambda s: s.start_time_unix_nano)
    dead, served = (otlp.attrs(s) for s in tried)
    assert dead["server.port"] == ports[home] and dead["error.type"] == "upstream_unavailable"
    assert "http.response.status_code" not in dead
    assert served["server.port"] == other.port and served["http.response.status_code"] == 200

"""An OTLP/HTTP trace receiver for the tests (the `otlp` fixture serves it on 127.0.0.1):
it decodes each export's protobuf (`opentelemetry-proto`) and keeps the spans, so a test
reads them as a collector would: names, kinds, parents, attributes. And `exported`, the spans
of an app, once its exporter has sent them."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from tests.support.helpers import seconds, until


def value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


@dataclass
class Received:
    spans: list[Span] = field(default_factory=list)
    resources: list[dict[str, Any]] = field(default_factory=list)
    url: str = ""
    # each export's resource and its spans
    _by_resource: list[tuple[dict[str, Any], list[Span]]] = field(default_factory=list)

    def attrs(self, span: Span) -> dict[str, Any]:
        return {a.key: value(a.value) for a in span.attributes}

    def named(self, prefix: str) -> list[Span]:
        return [s for s in self.spans if s.name.startswith(prefix)]

    def children(self, span: Span) -> list[Span]:
        return [s for s in self.spans if s.parent_span_id == span.span_id]

    def service(self, span: Span) -> str:
        """The `service.name` of the resource that exported `span`."""
        for resource, spans in self._by_resource:
            if any(s.span_id == span.span_id for s in spans):
                return str(resource.get("service.name"))
        raise AssertionError("not received")

    def app(self) -> web.Application:
        async def traces(request: web.Request) -> web.Response:
            export = ExportTraceServiceRequest.FromString(await request.read())
            for rs in export.resource_spans:
                resource = {a.key: value(a.value) for a in rs.resource.attributes}
                self.resources.append(resource)
                spans = [s for ss in rs.scope_spans for s in ss.spans]
                self._by_resource.append((resource, spans))
                self.spans.extend(spans)
            return web.Response(content_type="application/x-protobuf", body=b"")

        app = web.Application()
        app.router.add_post("/v1/traces", traces)
        return app


async def exported(
    tracing: Any, got: Received, prefix: str, count: int, timeout: float = 10
) -> list[Span]:
    """The spans named `prefix...`, once `tracing` (its app's, on) has flushed and the
    receiver holds `count` of them."""
    assert tracing is not None, "tracing is on"
    await asyncio.to_thread(tracing.flush)
    await until(lambda: len(got.named(prefix)) >= count, timeout)
    return got.named(prefix)


async def received_until(
    tracing: Any, got: Received, check: Callable[[Received], bool], timeout: float = 10
) -> Received:
    """Flush `tracing` (its app's, on) until what the receiver holds passes `check`: spans
    that end after the turn's (an upstream request drained after the answer) come in a
    later export."""
    assert tracing is not None, "tracing is on"

    async def held() -> bool:
        await asyncio.to_thread(tracing.flush)
        return check(got)

    await until(held, timeout, every=0.05, message="the spans never arrived")
    return got


async def assert_off_exports_nothing(script: str, otlp: Received) -> None:
    """Run `script` (which prints `loaded: [...]`, the opentelemetry modules it imported) in
    a fresh interpreter with tracing off by the setting, though the standard variable names
    `otlp` as the receiver: nothing imported, nothing received."""
    env = {
        **os.environ,
        "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.url.removesuffix("/v1/traces"),
        "WSMODE_TELEMETRY_ENABLED": "false",
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), seconds(60))
    assert proc.returncode == 0, err.decode()[-2000:]
    assert b"loaded: []" in out
    assert otlp.spans == []

"""Turning tracing on for an app, and handing each client its tracing; no OpenTelemetry
import unless tracing is on (`[telemetry]`, or the standard OTEL_* variables:
docs/telemetry.md).

`install` adds the provider's start and shutdown to the app's life; the fronts ask
`client_tracing` once per WebSocket connection or HTTP request, and the sidecar
`sidecar_turn` once per `POST /v1/responses`: with tracing off, one dictionary lookup that
finds nothing. The spans are ops/otel_spans.py's (ops/otel_sidecar.py's for the sidecar).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from aiohttp import web

from ..telemetry import context
from ..telemetry.context import message_context as message_context
from ..telemetry.settings import TelemetrySettings, tracing_on

if TYPE_CHECKING:
    from .otel_sidecar import SidecarTurn
    from .otel_spans import ClientTracing, Tracing


@dataclass
class TracingSlot:
    """The app's tracing once it runs (made on start-up, not at import or in `create_app`)."""

    tracing: Tracing | None = None


TRACING = web.AppKey("wsmode_tracing", TracingSlot)


def install(
    app: web.Application,
    settings: TelemetrySettings,
    env: Mapping[str, str] | None = None,
    service: str = "wsmode",
) -> bool:
    """Trace this app's turns when the settings or the environment say so. `service`: the
    `service.name` spans carry when OTEL_SERVICE_NAME (or the resource attributes) names
    none."""
    if not tracing_on(settings, os.environ if env is None else env):
        return False
    slot = app[TRACING] = TracingSlot()
    app.cleanup_ctx.append(partial(_lifecycle, settings, slot, service))
    return True


async def _lifecycle(
    settings: TelemetrySettings, slot: TracingSlot, service: str, app: web.Application
) -> AsyncIterator[None]:
    from .otel_spans import Tracing  # the one import of the SDK: only with tracing on

    slot.tracing = Tracing(settings, service)
    context.ON[0] = True
    try:
        yield
    finally:
        tracing, slot.tracing = slot.tracing, None
        # the last batch goes out from the SDK's thread; the loop does not wait on it inline
        await asyncio.to_thread(tracing.shutdown)


def client_tracing(request: web.Request, dialect: str) -> ClientTracing | None:
    """The tracing of this client's turns, continuing its `traceparent`; None when off."""
    slot = request.app.get(TRACING)
    if slot is None or slot.tracing is None:
        return None
    return slot.tracing.client(request.headers, dialect)


def sidecar_turn(request: web.Request, model: str | None) -> SidecarTurn | None:
    """The span of one `POST /v1/responses` through the sidecar, continuing the HTTP
    client's `traceparent`; None when off."""
    slot = request.app.get(TRACING)
    if slot is None or slot.tracing is None:
        return None
    from .otel_sidecar import SidecarTurn  # loaded with the SDK: only with tracing on

    return SidecarTurn(slot.tracing, request.headers, model)


def tracing_of(app: web.Application) -> Tracing | None:
    slot = app.get(TRACING)
    return None if slot is None else slot.tracing

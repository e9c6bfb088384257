"""The summarising request of a compaction: one upstream request whose events stay here.

The core plans it (`Summarise`), this module runs it: POST, decode the SSE stream with the
dialect's own translator, and return the output items and usage. Nothing reaches the
client; the session gets the result back (`summary_done` / `summary_failed`). Shared by the
WebSocket front, the HTTP front and `POST /v1/responses/compact`. `upstream_action` runs
either kind of upstream request a session asks for (a `pump` or a summary).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from proxy.core.context import Summarise, SummaryResult
from proxy.core.dialects import Dialect
from proxy.core.errors import UpstreamError
from proxy.core.session import Session, StartUpstream
from proxy.core.sse import SSEDecoder, SSEEventTooLarge
from proxy.pump import Execute, pump
from proxy.tracking import RunTrace
from proxy.upstream_http import UpstreamClient

log = logging.getLogger("wsmode.compaction")


async def run_summary(
    upstream: UpstreamClient,
    dialect: Dialect,
    action: Summarise,
    headers: Mapping[str, str],
    max_event_bytes: int,
) -> SummaryResult:
    """Raises UpstreamError when the upstream fails or ends without a terminal event."""
    decoder = SSEDecoder(max_event_bytes)
    stream = dialect.translator({}, {"model": "", "store": False})
    try:
        async with upstream.stream(action.path, b"".join(action.body), headers) as chunks:
            async for chunk in chunks:
                for event in decoder.feed(chunk):
                    stream.feed(event)
                    if stream.outcome is not None:
                        break
                if stream.outcome is not None:
                    break
            else:
                stream.eof()
    except SSEEventTooLarge as exc:
        raise UpstreamError(str(exc), started=True, code="upstream_event_too_large") from None
    assert stream.outcome is not None
    usage = (stream.response or {}).get("usage")
    return SummaryResult(stream.outcome, stream.output, usage if isinstance(usage, dict) else None)


async def upstream_action(
    upstream: UpstreamClient,
    session: Session,
    action: StartUpstream | Summarise,
    headers: Mapping[str, str],
    max_event_bytes: int,
    execute: Execute,
    label: str,
    trace: RunTrace | None = None,
) -> None:
    """Run either kind of upstream request a session asks for (`trace`: a response's)."""
    if isinstance(action, Summarise):
        await summarise(upstream, session, action, headers, max_event_bytes, execute, label)
    else:
        await pump(upstream, session, action, headers, max_event_bytes, execute, label, trace)


async def summarise(
    upstream: UpstreamClient,
    session: Session,
    action: Summarise,
    headers: Mapping[str, str],
    max_event_bytes: int,
    execute: Execute,
    label: str,
) -> None:
    """Run a session's `Summarise` action and execute what the session does next."""
    try:
        result = await run_summary(
            upstream, session.policy.dialect, action, headers, max_event_bytes
        )
    except UpstreamError as err:
        log.warning("%s compaction failed (%s): %s", label, err.status, err.message)
        await execute(session.summary_failed(action.run_id, err))
        return
    await execute(session.summary_done(action.run_id, result))

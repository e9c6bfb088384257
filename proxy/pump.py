"""One upstream request: POST, decode the SSE stream, hand each event to the session.

Shared by the WebSocket front and the HTTP front. `execute` runs the session's actions; if
it raises (the client vanished mid-write, or stopped reading for too long), the exception
propagates and leaving the upstream stream's context closes the upstream connection, which
stops generation there. `execute` awaits each write, so while a client is not reading the
upstream is not read either: backpressure reaches the model server instead of our memory.
An optional `RunTrace` records timings and sizes for metrics and usage accounting.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping

from proxy.core.errors import UpstreamError
from proxy.core.session import Action, CancelUpstream, Send, Session, StartUpstream
from proxy.core.sse import SSEDecoder, SSEEventTooLarge
from proxy.tracking import RunTrace
from proxy.upstream_http import UpstreamClient, request_body

log = logging.getLogger("wsmode.upstream")

Execute = Callable[[list[Action]], Awaitable[None]]


class _Abandon(Exception):
    """The session stopped this run itself (a steer, a cancel): close, do not drain."""


async def pump(
    upstream: UpstreamClient,
    session: Session,
    start: StartUpstream,
    headers: Mapping[str, str],
    max_event_bytes: int,
    execute: Execute,
    label: str,
    trace: RunTrace | None = None,
) -> None:
    run_id = start.run_id
    decoder = SSEDecoder(max_event_bytes)
    debug = log.isEnabledFor(logging.DEBUG)  # per-event lines only when asked for
    on_sent = trace.sent if trace is not None else None
    try:
        async with upstream.stream(
            start.path, request_body(start.body), headers, on_sent=on_sent
        ) as chunks:
            async for chunk in chunks:
                if trace is not None:
                    trace.chunk(len(chunk))
                # the events of one chunk are executed together: their frames go out in
                # one write (client_ws), not one write and one syscall each
                actions: list[Action] = []
                for event in decoder.feed(chunk):
                    if debug:  # the type and size, never the payload
                        log.debug(
                            "%s upstream event %s (%d bytes)", label, event.event, len(event.data)
                        )
                    actions += session.upstream_event(run_id, event)
                    if not session.is_active(run_id):
                        break
                if trace is not None and trace.first_sent is None and _sends(actions):
                    trace.delivered()  # the first event is handed to the client's writer now
                await execute(actions)
                if not session.is_active(run_id):
                    if any(isinstance(a, CancelUpstream) and a.run_id == run_id for a in actions):
                        raise _Abandon  # leaving the stream early closes the upstream
                    return  # a terminal event: the rest ([DONE]) is drained for reuse
            await execute(session.upstream_eof(run_id))
    except _Abandon:
        pass
    except UpstreamError as err:
        log.warning("%s upstream failure (%s): %s", label, err.status, err.message)
        if trace is not None:
            trace.failed(err)
        await execute(session.upstream_failed(run_id, err))
    except SSEEventTooLarge as exc:
        too_large = UpstreamError(str(exc), started=True, code="upstream_event_too_large")
        log.warning("%s upstream failure: %s", label, too_large.message)
        if trace is not None:
            trace.failed(too_large)
        await execute(session.upstream_failed(run_id, too_large))


def _sends(actions: list[Action]) -> bool:
    return any(isinstance(a, Send) for a in actions)

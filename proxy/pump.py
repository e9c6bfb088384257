"""One upstream request: POST, decode the SSE stream, hand each event to the session.

Shared by the WebSocket front and the HTTP front. `execute` runs the session's actions; if
it raises (the client vanished mid-write), the exception propagates and leaving the
upstream stream's context closes the upstream connection, which stops generation there.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping

from proxy.core.errors import UpstreamError
from proxy.core.session import Action, CancelUpstream, Session, StartUpstream
from proxy.core.sse import SSEDecoder, SSEEventTooLarge
from proxy.upstream_http import UpstreamClient

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
) -> None:
    run_id = start.run_id
    decoder = SSEDecoder(max_event_bytes)
    try:
        async with upstream.stream(start.path, b"".join(start.body), headers) as chunks:
            async for chunk in chunks:
                for event in decoder.feed(chunk):
                    actions = session.upstream_event(run_id, event)
                    await execute(actions)
                    if not session.is_active(run_id):
                        if any(
                            isinstance(a, CancelUpstream) and a.run_id == run_id for a in actions
                        ):
                            raise _Abandon  # leaving the stream early closes the upstream
                        return  # a terminal event: the rest ([DONE]) is drained for reuse
            await execute(session.upstream_eof(run_id))
    except _Abandon:
        pass
    except UpstreamError as err:
        log.warning("%s upstream failure (%s): %s", label, err.status, err.message)
        await execute(session.upstream_failed(run_id, err))
    except SSEEventTooLarge as exc:
        too_large = UpstreamError(str(exc), started=True, code="upstream_event_too_large")
        log.warning("%s upstream failure: %s", label, too_large.message)
        await execute(session.upstream_failed(run_id, too_large))

"""The one runner of the upstream requests a session asks for: a response or a summary.

A front makes one `Channel` per connection (or HTTP request): the upstream pool, the
client's headers that go upstream, the event size bound and a label for the logs.
`Channel.run` takes either kind of request a session returns (`StartUpstream`,
`Summarise`); the WebSocket front, the HTTP front and `POST /v1/responses/compact` all use it.

A response (`Channel.respond`): POST, decode the SSE stream, hand each event to the session.
`execute` runs the session's actions; if it raises (the client vanished mid-write, or stopped
reading for too long), the exception propagates and leaving the upstream stream's context
closes the upstream connection, which stops generation there. `execute` awaits each write, so
while a client is not reading the upstream is not read either: backpressure reaches the model
server instead of our memory. An optional `Trace` (ops/tracking.py's `RunTrace`) records
timings and sizes for metrics and usage accounting.

Cancellation has one rule. The runner never looks at the actions: after each batch it asks
the session whether it still wants the run (`Session.is_active`) and, when not, leaves the
stream after draining its rest (`[DONE]`), so the pooled connection can be reused. Only the
executor acts on `CancelUpstream`: for another run it cancels that run's task; for the run
whose batch it is executing it raises `Abandon` once the whole batch is executed, and the
runner leaves the stream without draining, which closes the upstream request.

With input guards that moderate (proxy/core/guards.py), `respond` first awaits the moderation
hook (proxy/upstream/moderation.py) with the new text the session put on `StartUpstream`, and
a refusal goes back to the session (`Session.input_refused`) instead of the model request.

A summary (`Channel.summary`), the summarising request of a compaction: its events stay here.
The core plans it, this module runs it with the dialect's own translator and returns the
output items and usage; nothing reaches the client, and the session gets the result back
(`summary_done` / `summary_failed`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from ..core.actions import Action, Send, StartUpstream, Summarise
from ..core.context.manager import SummaryResult
from ..core.dialects import Dialect
from ..core.errors import UpstreamError
from ..core.session import Session
from ..core.sse import SSEDecoder, SSEEvent, SSEEventTooLarge
from .client import request_body
from .moderation import Moderator
from .pool import UpstreamPool

log = logging.getLogger("wsmode.upstream")


class Trace(Protocol):
    """What the runner reports about one response (ops/tracking.py's `RunTrace` is one): a
    protocol, so that `upstream/` and `ops/` do not import each other."""

    first_sent: float | None

    def sent(self) -> None: ...
    def chunk(self, nbytes: int) -> None: ...
    def delivered(self) -> None: ...
    def failed(self, err: UpstreamError) -> None: ...


compaction_log = logging.getLogger("wsmode.compaction")

Execute = Callable[[list[Action]], Awaitable[None]]


class Abandon(Exception):
    """Raised by an executor, after executing a batch, when the batch cancelled the run whose
    events it carried (`CancelUpstream`: a steer's boundary, a cancel, a stalled client):
    the runner leaves the stream at once and closes the upstream request, without draining."""


@dataclass(frozen=True, slots=True)
class Channel:
    """Where one front's upstream requests go."""

    pool: UpstreamPool  # the replicas, and which one a request goes to
    headers: Mapping[str, str]  # the client's headers forwarded upstream (FORWARDED_HEADERS)
    max_event_bytes: int  # upstream.max_event_bytes
    label: str  # "connection conn_...", "http 127.0.0.1": who the log lines are about
    moderator: Moderator | None = None  # the input guards' moderation hook ([guards])

    async def run(
        self,
        session: Session,
        action: StartUpstream | Summarise,
        execute: Execute,
        trace: Trace | None = None,
    ) -> None:
        """Run either kind of upstream request a session asks for (`trace`: a response's)."""
        if isinstance(action, Summarise):
            await self._summarise(session, action, execute)
        else:
            await self.respond(session, action, execute, trace)

    async def respond(
        self, session: Session, start: StartUpstream, execute: Execute, trace: Trace | None
    ) -> None:
        run_id = start.run_id
        if start.moderate is not None and self.moderator is not None:
            # before the model request: a flagged turn never reaches the model, and the
            # wait counts as the proxy's part of the time to first event
            refusal = await self.moderator.check(start.moderate, self.label)
            if refusal is not None:
                await execute(session.input_refused(run_id, refusal))
                return
        decoder = SSEDecoder(self.max_event_bytes)
        debug = log.isEnabledFor(logging.DEBUG)  # per-event lines only when asked for
        on_sent = trace.sent if trace is not None else None
        body = request_body(start.body)
        try:
            async with self.pool.stream(start.path, body, self.headers, start.route, on_sent) as (
                replica,
                chunks,
            ):
                session.routed(run_id, replica.name)  # its response records where it ran
                async for chunk in chunks:
                    if trace is not None:
                        trace.chunk(len(chunk))
                    # the events of one chunk are executed together: their frames go out in
                    # one write (ws_front), not one write and one syscall each
                    actions: list[Action] = []
                    for event in _events(decoder, chunk):
                        if debug:  # the type and size, never the payload
                            log.debug(
                                "%s upstream event %s (%d bytes)",
                                self.label,
                                event.event,
                                len(event.data),
                            )
                        actions += session.upstream_event(run_id, event)
                        if not session.is_active(run_id):
                            break
                    if trace is not None and trace.first_sent is None and _sends(actions):
                        trace.delivered()  # the first event is handed to the client's writer
                    await execute(actions)  # raises Abandon if they cancelled this run
                    if not session.is_active(run_id):
                        return  # it ended: the rest ([DONE]) is drained for reuse
                await execute(session.upstream_eof(run_id))
        except Abandon:
            pass  # leaving the stream early closed the upstream request
        except UpstreamError as err:
            log.warning("%s upstream failure (%s): %s", self.label, err.status, err.message)
            if trace is not None:
                trace.failed(err)
            await execute(session.upstream_failed(run_id, err))

    async def summary(self, dialect: Dialect, action: Summarise) -> SummaryResult:
        """Raises UpstreamError when the upstream fails or ends without a terminal event."""
        decoder = SSEDecoder(self.max_event_bytes)
        stream = dialect.translator({}, {"model": "", "store": False})
        body = b"".join(action.body)
        async with self.pool.stream(action.path, body, self.headers) as (_, chunks):
            async for chunk in chunks:
                for event in _events(decoder, chunk):
                    stream.feed(event)
                    if stream.outcome is not None:
                        break
                if stream.outcome is not None:
                    break
            else:
                stream.eof()
        assert stream.outcome is not None
        usage = (stream.response or {}).get("usage")
        return SummaryResult(
            stream.outcome, stream.output, usage if isinstance(usage, dict) else None
        )

    async def _summarise(self, session: Session, action: Summarise, execute: Execute) -> None:
        """Run a session's `Summarise` action and execute what the session does next."""
        try:
            result = await self.summary(session.policy.dialect, action)
        except UpstreamError as err:
            compaction_log.warning(
                "%s compaction failed (%s): %s", self.label, err.status, err.message
            )
            await execute(session.summary_failed(action.run_id, err))
            return
        await execute(session.summary_done(action.run_id, result))


def _events(decoder: SSEDecoder, chunk: bytes) -> list[SSEEvent]:
    """The chunk's complete events; an event over the size bound is the upstream's fault."""
    try:
        return decoder.feed(chunk)
    except SSEEventTooLarge as exc:
        raise UpstreamError(str(exc), started=True, code="upstream_event_too_large") from None


def _sends(actions: list[Action]) -> bool:
    return any(isinstance(a, Send) for a in actions)

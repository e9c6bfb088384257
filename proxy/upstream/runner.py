"""The upstream requests a session asks for, run and reported: a response, or a summary.

A front makes one `Runner` per connection (or HTTP request): the upstream pool, the client's
headers that go upstream, the event size bound and a label for the logs.

A response (`Runner.call`): an `UpstreamCall` iterated with `async for` yields what happened,
as the session's own events (proxy/core/events.py): `Routed` (the replica that took it), one
`UpstreamChunk` per raw chunk of its body, then `UpstreamEnded` or `UpstreamFailed`; with input
guards that moderate (proxy/core/guards.py), a refusal (`InputRefused`) instead of the model
request. The runner decides nothing: the executor (proxy/executor.py) hands each event to the
session and leaves the loop when the run ended or was cancelled. Leaving normally drains what
follows the terminal event (`[DONE]`) so the pooled connection is reused; after `abandon()`
(a cancel, a steer's boundary, a stalled client) or an exception, leaving closes the upstream
connection at once, which stops generation there. The executor awaits each write before it
reads the next event, so while a client is not reading the upstream is not read either:
backpressure reaches the model server instead of our memory.

A summary (`Runner.summary`), the summarising request of a compaction: its events stay here,
read with the dialect's own translator, and its output items and usage are returned; nothing
reaches the client.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol

from ..core.actions import StartUpstream, Summarise
from ..core.context.manager import SummaryResult
from ..core.dialects import Dialect
from ..core.errors import UpstreamError
from ..core.events import (
    InputRefused,
    PromptTokenized,
    Routed,
    UpstreamChunk,
    UpstreamEnded,
    UpstreamFailed,
)
from ..core.sse import SSEDecoder
from ..core.tokens.dialect import ROOT, TokenPrompt
from ..telemetry.context import OUTGOING, TurnHook
from .client import request_body
from .moderation import Moderator
from .pool import Replica, UpstreamPool

log = logging.getLogger("wsmode.upstream")

Report = Routed | PromptTokenized | UpstreamChunk | UpstreamEnded | UpstreamFailed | InputRefused


class Trace(Protocol):
    """What the runner reports about one response's timings and sizes (ops/tracking.py's
    `RunTrace` is one): a protocol, so that `upstream/` and `ops/` do not import each other."""

    def sent(self) -> None: ...
    def built(self, nbytes: int) -> None: ...
    def chunk(self, nbytes: int) -> None: ...
    @property
    def span(self) -> TurnHook | None:
        """The turn's span when tracing is on (telemetry/context.py)."""


class _Abandoned(Exception):
    """Leaving an abandoned call: closes the upstream connection instead of draining it."""


@dataclass(frozen=True, slots=True)
class Runner:
    """Where one front's upstream requests go."""

    pool: UpstreamPool  # the replicas, and which one a request goes to
    headers: Mapping[str, str]  # the client's headers forwarded upstream (FORWARDED_HEADERS)
    max_event_bytes: int  # upstream.max_event_bytes
    label: str  # "connection conn_...", "http 127.0.0.1": who the log lines are about
    moderator: Moderator | None = None  # the input guards' moderation hook ([guards])

    def call(self, start: StartUpstream, trace: Trace | None = None) -> UpstreamCall:
        return UpstreamCall(self, start, trace)

    async def summary(
        self, dialect: Dialect, action: Summarise, span: TurnHook | None = None
    ) -> SummaryResult:
        """Raises UpstreamError when the upstream fails or ends without a terminal event.
        `span`: the turn's, when traced; the summary is its child."""
        if span is None:
            return await self._summary(dialect, action)
        with span.summary() as outgoing:
            token = OUTGOING.set(outgoing)
            try:
                return await self._summary(dialect, action)
            finally:
                OUTGOING.reset(token)

    async def _summary(self, dialect: Dialect, action: Summarise) -> SummaryResult:
        decoder = SSEDecoder(self.max_event_bytes)
        stream = dialect.translator({}, {"model": "", "store": False})
        body = b"".join(action.body)
        async with self.pool.stream(action.path, body, self.headers, action.route) as (_, chunks):
            async for chunk in chunks:
                for event in decoder.feed(chunk):  # an event past the bound: UpstreamError
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


class UpstreamCall:
    """One run's upstream request, reported as the session's events (`async with` it, then
    `async for` over it)."""

    def __init__(self, runner: Runner, start: StartUpstream, trace: Trace | None) -> None:
        self.runner = runner
        self.start = start
        self.trace = trace
        self._request: AbstractAsyncContextManager[tuple[Replica, AsyncIterator[bytes]]] | None
        self._request = None  # the pool's request, once it was made: left in __aexit__
        self._reports: AsyncIterator[Report] | None = None
        self._abandoned = False

    def abandon(self) -> None:
        """Leaving will close the upstream request instead of draining it."""
        self._abandoned = True

    async def __aenter__(self) -> UpstreamCall:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        reports, self._reports = self._reports, None
        if reports is not None:
            await reports.aclose()  # type: ignore[attr-defined]
        if kind is None and self._abandoned:
            kind, exc = _Abandoned, _Abandoned()
        request, self._request = self._request, None
        if request is not None:
            await request.__aexit__(kind, exc, tb)

    def __aiter__(self) -> AsyncIterator[Report]:
        self._reports = self._run()
        return self._reports

    async def _run(self) -> AsyncIterator[Report]:
        runner, start, trace = self.runner, self.start, self.trace
        run_id = start.run_id
        span = trace.span if trace is not None else None  # tracing: the turn's span
        if start.moderate is not None and runner.moderator is not None:
            # before the model request: a flagged turn never reaches the model, and the
            # wait counts as the proxy's part of the time to first event
            with nullcontext() if span is None else span.moderation():
                refusal = await runner.moderator.check(start.moderate, runner.label)
            if refusal is not None:
                yield InputRefused(start, refusal)
                return
        if start.tokens is None:
            body = request_body(start.body)
        else:  # the token path: the ids of the text not kept first (core/tokens/dialect.py)
            try:
                ids = start.tokens.new_ids(await self._tokenize(start.tokens))
            except UpstreamError as err:
                yield self._failed(err)
                return
            if (too_long := start.tokens.over_window(ids)) is not None:
                yield InputRefused(start, too_long)  # the server is not asked
                return
            yield PromptTokenized(run_id, ids)
            body = start.tokens.body(ids)
            if trace is not None:
                trace.built(len(body))
        on_sent = trace.sent if trace is not None else None
        request = runner.pool.stream(start.path, body, runner.headers, start.route, on_sent)
        # traced: the request's span is the turn's child (set only while it is made: the
        # generator yields to the executor, which must not see it)
        token = OUTGOING.set(span) if span is not None else None
        try:
            replica, chunks = await request.__aenter__()
            self._request = request
        except UpstreamError as err:
            failure: UpstreamError | None = err
        else:
            failure = None
        finally:
            if token is not None:
                OUTGOING.reset(token)
        if failure is not None:
            yield self._failed(failure)
            return
        yield Routed(start, replica.name)
        try:
            async for chunk in chunks:
                if trace is not None:
                    trace.chunk(len(chunk))
                yield UpstreamChunk(run_id, chunk)
        except UpstreamError as err:
            yield self._failed(err)
            return
        yield UpstreamEnded(run_id)

    async def _tokenize(self, prompt: TokenPrompt) -> list[bytes | None]:
        """The server's answers to tokenising the prompt's gaps, in order (None: a gap
        without text). Any replica will do: they serve one model."""
        path = ROOT + prompt.engine.tokenize_path
        answers: list[bytes | None] = []
        for body in prompt.tokenize_bodies():
            if body is None:
                answers.append(None)
                continue
            answer = bytearray()
            async with self.runner.pool.stream(path, body, self.runner.headers) as (_, chunks):
                async for chunk in chunks:
                    answer += chunk
                    if len(answer) > self.runner.max_event_bytes:
                        raise UpstreamError(
                            "upstream's tokenize answer is larger than upstream.max_event_bytes",
                            code="upstream_event_too_large",
                        )
            answers.append(bytes(answer))
        return answers

    def _failed(self, err: UpstreamError) -> UpstreamFailed:
        log.warning("%s upstream failure (%s): %s", self.runner.label, err.status, err.message)
        return UpstreamFailed(self.start.run_id, err)


__all__ = ["Report", "Runner", "Trace", "UpstreamCall"]

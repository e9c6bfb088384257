"""The one executor of a session's actions, for the WebSocket and the HTTP front alike.

Theory of operation
-------------------
A front owns one `Session` (proxy/core/session.py) and one `Executor`. Everything that happens
reaches the session through `Executor.handle` as a typed event (proxy/core/events.py); the
actions that come back are carried out here, in order, by one exhaustive `match`
(proxy/core/actions.py). What differs between the fronts is a handful of hooks (`Front`): how
frames reach the client, how a run's upstream request is started and cancelled, and closing.

- `Send` and `Relay`: consecutive frames go to the front together (`Front.send`), so one
  upstream chunk's frames go out in as few writes as the front's bounds allow.
- `StartUpstream` / `Summarise` / `LoadStored`: the front starts the work (`Front.start`: a task
  of the connection, or the HTTP handler's next step), which runs here: `run` feeds the upstream
  runner's events (proxy/upstream/runner.py) to the session one by one and leaves the stream
  once the batch of actions they caused ended the run (drained, for reuse) or cancelled it
  (closed, which stops generation); `summarise` and `load` hand their answer back as
  `SummaryDone`/`SummaryFailed` and `StoredLoaded`.
- `SaveStored`: awaited in place in a run's own work (its upstream request, its summary, its
  store read), then answered with `StoredSaved`: the run's terminal event follows only once the
  store answered. A save a client message caused (a `generate: false` warm-up ends at once) is
  started as the run's work instead (`Front.start`), so the reader never waits on the store.
- `CancelUpstream`: another run's work is cancelled (`Front.cancel`); for the run whose events
  are being executed, the stream is left once the batch is done.
- `RunCreated`, `Finished` and the upstream's timings go to the run tracker (ops/tracking.py),
  which observes them for metrics, usage records and the console.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Protocol, assert_never

from .core.actions import (
    Action,
    CancelUpstream,
    Close,
    CountTokens,
    Finished,
    LoadStored,
    Relay,
    RunCreated,
    SaveStored,
    Send,
    StartUpstream,
    Summarise,
)
from .core.context.tokens import TokenJob
from .core.errors import UpstreamError
from .core.events import (
    Event,
    StoredLoaded,
    StoredSaved,
    SummaryDone,
    SummaryFailed,
    TokensCounted,
    UpstreamChunk,
    UpstreamFailed,
)
from .core.session import Session
from .core.store import AsyncStore, StoreUnavailable
from .ops.tracking import RunTrace, RunTracker
from .upstream.runner import Report, Runner
from .upstream.tokenizer import TokenizeWorker

compaction_log = logging.getLogger("wsmode.compaction")


def first_event_end(chunk: bytes) -> int:
    """Where the first server-sent event of `chunk` ends (past its blank line, LF line ends),
    or 0 when no whole event is followed by more bytes. Any cut is safe: the session's SSE
    decoder takes chunks split anywhere. This one only lets a client's first event be
    written before the rest of its chunk is translated."""
    end = chunk.find(b"\n\n") + 2
    return end if 1 < end < len(chunk) else 0


class Leave(enum.IntEnum):
    """What a batch of actions means for the upstream stream whose events caused it; of two,
    the larger wins (a run cancelled and ended in one batch is closed)."""

    STAY = 0  # read on
    DRAIN = 1  # the run ended: read what follows its terminal event, for reuse
    CLOSE = 2  # the run was cancelled: close the upstream request now


class Front(Protocol):
    """What a front supplies to the executor."""

    async def send(self, sends: list[Send | bytes], run_id: int | None) -> None:
        """Write events to the client in order (a `Send`, or a relayed frame's bytes); for
        a run's events (`run_id`), may raise the front's own exception when the client
        stopped reading."""

    def start(self, run_id: int, work: Callable[[], Awaitable[None]]) -> None:
        """Start a run's upstream work (a request, a summary, a store read)."""

    def cancel(self, run_id: int) -> None:
        """Stop another run's upstream work, if it is still running."""

    async def close(self, code: int, reason: str) -> None:
        """Close the connection (a WebSocket's lifetime); never asked of an HTTP exchange."""

    def leaving(self) -> bool:
        """The front wants the stream being read left now (the HTTP drain's cut)."""


class Executor:
    """Carries out one session's actions through one front's hooks."""

    def __init__(
        self,
        session: Session,
        front: Front,
        runner: Runner,
        tracker: RunTracker,
        store: AsyncStore | None,
        tokenizer: TokenizeWorker | None,
    ) -> None:
        self.session = session
        self.front = front
        self.runner = runner
        self.tracker = tracker
        self.store = store
        self.tokenizer = tokenizer
        self.responses = 0  # runs finished
        self._relaying: RunTrace | None = None  # the trace of the run whose chunk is executed

    async def handle(self, event: Event, run_id: int | None = None) -> Leave:
        """Hand `event` to the session and execute what it returns."""
        return await self.execute(self.session.handle(event), run_id)

    async def client(self, event: Event, nbytes: int) -> None:
        """A client message of `nbytes`: the runs it creates are traced from now."""
        received = time.monotonic()
        self.tracker.message(nbytes)
        actions = self.session.handle(event)
        self.tracker.refusals(actions)
        await self.execute(actions, None, received, nbytes, reader=True)

    async def execute(
        self,
        actions: list[Action],
        run_id: int | None = None,
        received: float | None = None,
        nbytes: int = 0,
        *,
        reader: bool = False,
    ) -> Leave:
        """Execute the actions in order. `run_id`: the run whose upstream events caused them;
        what they mean for its stream is returned. `reader`: a client message caused them
        (the front's reader waits on this call)."""
        leave = Leave.STAY
        frames: list[Send | bytes] = []  # consecutive frames go out together
        for action in actions:
            if isinstance(action, Send):
                frames.append(action)
                continue
            if isinstance(action, Relay):
                frames += action.frames
                continue
            if frames:
                await self._send(frames, run_id)
                frames = []
            match action:
                case StartUpstream():
                    self.front.start(action.run_id, partial(self.run, action))
                case Summarise():
                    self.front.start(action.run_id, partial(self.summarise, action))
                case LoadStored():
                    self.front.start(action.run_id, partial(self.load, action))
                case CancelUpstream():
                    if action.run_id == run_id:
                        leave = Leave.CLOSE
                    else:
                        self.front.cancel(action.run_id)
                case Finished():
                    self.responses += 1
                    self.tracker.finished(action)
                    if action.run_id == run_id:
                        leave = max(leave, Leave.DRAIN)
                case RunCreated():
                    self.tracker.created(action, received, nbytes)
                case SaveStored() if reader:
                    self.front.start(action.run_id, partial(self.save, action))
                case SaveStored():
                    leave = max(leave, await self._save(action, run_id))
                case CountTokens():
                    if self.tokenizer is not None:
                        counted = partial(self._counted, action)
                        self.tokenizer.submit(action.jobs, self.runner.headers, counted)
                case Close():
                    await self.front.close(action.code, action.reason)
                case _:
                    assert_never(action)
        if frames:
            await self._send(frames, run_id)
        return leave

    async def _send(self, frames: list[Send | bytes], run_id: int | None) -> None:
        trace = self._relaying
        if trace is not None and trace.first_sent is None:
            trace.delivered()  # the upstream's first event is handed to the client's writer
        await self.front.send(frames, run_id)

    async def _save(self, action: SaveStored, run_id: int | None) -> Leave:
        """Store a response, then tell the session, which sends its terminal event."""
        assert self.store is not None
        result = await self.store.save(action.stored, action.owner)
        return await self.handle(StoredSaved(action, result), run_id)

    async def _counted(self, request: CountTokens, job: TokenJob, counts: list[int]) -> None:
        """The tokenizer's answer to one job of `request` (it runs in the tokenizer's task)."""
        await self.handle(TokensCounted(request, job, tuple(counts)))

    # ---- the work a front starts

    async def run(self, start: StartUpstream) -> None:
        """One upstream request: its events to the session, until the run no longer needs
        them."""
        run_id = start.run_id
        trace = self.tracker.start(start)
        first = True  # no chunk of the answer read yet
        async with self.runner.call(start, trace) as call:
            async for report in call:
                if isinstance(report, UpstreamFailed):
                    trace.failed(report.error)
                if first and isinstance(report, UpstreamChunk):
                    # the first event goes to the client before the rest of its chunk is
                    # translated (an upstream that answers at once sends the whole answer
                    # in one chunk): the client's time to first event is one event's work
                    first = False
                    if cut := first_event_end(report.data):
                        head = UpstreamChunk(run_id, report.data[:cut])
                        leave = await self._report(head, run_id, trace)
                        if leave is not Leave.STAY or self.front.leaving():
                            break
                        report = UpstreamChunk(run_id, report.data[cut:])
                leave = await self._report(report, run_id, trace)
                if leave is not Leave.STAY or self.front.leaving():
                    break
            else:
                return
            if leave is Leave.CLOSE or self.front.leaving():
                call.abandon()

    async def _report(self, report: Report, run_id: int, trace: RunTrace) -> Leave:
        """One event of a run's upstream request to the session, and its actions executed."""
        # the time to first event is the upstream's events', not an error's
        self._relaying = trace if isinstance(report, UpstreamChunk) else None
        try:
            return await self.handle(report, run_id)
        finally:
            self._relaying = None

    async def summarise(self, action: Summarise) -> None:
        """A compaction's summarising request; its result back to the session."""
        try:
            span = self.tracker.span(action.run_id)  # None with tracing off
            result = await self.runner.summary(self.session.policy.dialect, action, span)
        except UpstreamError as err:
            compaction_log.warning(
                "%s compaction failed (%s): %s", self.runner.label, err.status, err.message
            )
            await self.handle(SummaryFailed(action, err))
            return
        await self.handle(SummaryDone(action, result))

    async def save(self, action: SaveStored) -> None:
        """A save started as the run's own work (one a client message caused): the store's
        answer, then the run's terminal event, from this task."""
        await self._save(action, action.run_id)

    async def load(self, action: LoadStored) -> None:
        """Read a run's parent from the store, then hand the answer to the session."""
        assert self.store is not None
        try:
            stored = await self.store.load(action.response_id, action.owner)
        except StoreUnavailable:
            await self.handle(StoredLoaded(action, None, unavailable=True))
            return
        await self.handle(StoredLoaded(action, stored))


__all__ = ["Executor", "Front", "Leave"]

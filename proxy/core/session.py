"""One connection's protocol state: lanes, FIFO, warmups, caching, steering, failures.

Theory of operation
-------------------
The session has one entry, `handle(event) -> actions`: the fronts turn what happened into a
typed event (proxy/core/events.py) and execute the actions that come back
(proxy/core/actions.py) with the one executor (proxy/executor.py). Nothing here waits
or touches a socket, and the fronts make no protocol decision of their own. A plain HTTP
request is a session of its own that takes one `HttpCreate`.

A `response.create` is admitted on arrival (proxy/core/admission.py: validated, its bytes
counted against the connection's and the process's bounds) and becomes a `Run` queued on its
lane (`RunCreated` tells the executor). Lanes are FIFO and never overlap; different lanes run
concurrently up to `max_active` runs per connection, further creates wait (docs/protocol.md
"Lanes"). After every event the lane scheduler (`_start_ready_runs`) starts what can start: a run
starts when it reaches the head of its lane and a slot is free; only then is
`previous_response_id` resolved (the connection cache first, then the store), because the
parent may be the response that ran just before it. The store is never called from here:
the run waits in LOADING while the executor carries out a `LoadStored` and answers with
`StoredLoaded`, and a response to be stored waits in SAVING for its `StoredSaved`
(proxy/core/runs.py). A fork whose parent is still in flight on another lane waits at the head
of its lane until that run ends. A parent that a queued run refers to is pinned in the cache
until the run starts (docs/protocol.md "Forks").

A run's states and their legal moves are the table in proxy/core/runs.py; every run ends in
`_end`, the one path that frees its lane, settles its steers and reports its `Finished`.

A started run's request is planned by proxy/core/plan.py (with a `ContextManager`,
proxy/core/context/manager.py, its input is prepared first); a run whose context asks for a
compaction first waits in COMPACTING while the executor runs the `Summarise` actions
(proxy/core/compacting.py). Its upstream's raw chunks come back as `UpstreamChunk` events,
decoded by the run's SSE decoder and translated by its dialect: one call per chunk.

Steering (proxy/core/steering.py) stops a STREAMING run at its next item boundary and queues
the successor at the head of the lane. After `LifetimeOver` nothing new starts, and the
connection closes once no run is in flight; after `DrainBegun` creates are refused (503
`server_draining`) and the runs already there finish.

What is cached and stored, and what a failure evicts, is proxy/core/recorder.py's account
(docs/protocol.md "Continuing and eviction"). Errors the client caused, and cancels, never
change the cache, with one exception: new input refused when the run starts (a tool output
that answers no call of the conversation, an input guard: core/guards.py) fails the
continuation as OpenAI's would, and evicts the parent likewise.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, assert_never

from . import frames, ids, wire
from .actions import Action, CancelUpstream, Close, Outcome
from .admission import Admission
from .api_objects import lifecycle_event, response_object
from .compacting import Compacting
from .context.manager import ContextManager
from .conversation import ResponseCache
from .driver import RunDriver
from .errors import ClientError, ClientTooSlow, ServerDraining, ServerShuttingDown
from .events import (
    ClientGone,
    ClientMessage,
    ClientStalled,
    DrainBegun,
    DrainOver,
    Event,
    HttpCreate,
    InputRefused,
    LifetimeOver,
    PromptTokenized,
    Routed,
    StoredLoaded,
    StoredSaved,
    SummaryDone,
    SummaryFailed,
    TokensCounted,
    UpstreamChunk,
    UpstreamEnded,
    UpstreamFailed,
)
from .guards import Guards
from .memory import MemoryBudget
from .plan import Planner
from .policy import SessionLimits, UpstreamPolicy
from .recorder import Recorder
from .request import check_stream_id
from .runs import IN_FLIGHT, Run, RunState, cancel_target, streaming
from .steering import Steering, at_boundary
from .tokens.dialect import TokenDialect


@dataclass
class Session(RunDriver):
    cache: ResponseCache
    policy: UpstreamPolicy
    limits: SessionLimits = field(default_factory=SessionLimits)
    clock: Callable[[], float] = lambda: 0.0
    new_id: Callable[[str], str] = ids.new_id
    owner: str = "anonymous"  # the credential scope for the store and compaction items
    context: ContextManager | None = None  # compaction, truncation, token counts
    guards: Guards | None = None  # checks of each turn's new input (core/guards.py)
    memory: MemoryBudget | None = None  # the process budget that queued creates count against
    # what a new chain whose client names no key is keyed on, with the owner: the WebSocket
    # connection's id; None (HTTP): the conversation's start (core/routing.py)
    chain_key: str | None = None
    stores: bool = False  # there is a response store (in this process or Redis)
    max_event_bytes: int = 16 * 1024 * 1024  # one upstream SSE event at most (upstream.*)

    def __post_init__(self) -> None:
        self._ids = itertools.count(1)
        self._queue: deque[Run] = deque()
        self._runs: dict[int, Run] = {}  # every run not yet DONE
        self._busy_lanes: set[str | None] = set()
        check = partial(self.context.validate, owner=self.owner) if self.context else None
        self.admission = Admission(self.limits, self.memory, check)
        self.planner = Planner(self.context, self.chain_key, self.owner)
        self.recorder = Recorder(
            self.cache,
            self.owner,
            self.context,
            stores=self.stores,
            token_path=isinstance(self.policy.dialect, TokenDialect),
        )
        self.steering = Steering(
            self.cache,
            enabled=self.limits.steering,
            max_pending=self.limits.max_pending_steers,
            new_id=self.new_id,
            next_run_id=self._ids.__next__,
        )
        self.compacting = Compacting(self)
        self.expiring = False  # the connection lifetime is over: finish, then close
        self.draining = False  # the server drains: no new creates
        self.closed = False

    @property
    def queue(self) -> deque[Run]:
        """The runs waiting to start, oldest first."""
        return self._queue

    def _queue_successor(self, run: Run) -> list[Action]:
        """Queue a steer's automatic successor first in its lane (docs/protocol.md
        "response.steer")."""
        self._runs[run.id] = run
        self._queue.appendleft(run)
        return [run.created()]

    # ------------------------------------------------------------ the one entry

    def handle(self, event: Event) -> list[Action]:
        """What the session does about `event`; then whatever can start now starts."""
        match event:
            case UpstreamChunk():
                out = self._chunk(event.run_id, event.data)
            case ClientMessage():
                out = self._message(event.data)
            case HttpCreate():
                out = self._create(event.body, event.nbytes, socket=False)
            case UpstreamEnded():
                out = self._eof(event.run_id)
            case UpstreamFailed():
                out = self._upstream_failed(event.run_id, event.error)
            case Routed():
                run = self._runs.get(event.start.run_id)
                if run is not None:  # its response records where it ran
                    run.replica = event.replica
                return []
            case PromptTokenized():
                run = self._runs.get(event.run_id)
                if run is not None and run.tokens is not None:  # its token turn keeps them
                    run.tokens.prompt_ids = event.ids
                return []
            case InputRefused():
                out = self._input_refused(event.start.run_id, event.error)
            case StoredLoaded():
                out = self._parent_loaded(event)
            case StoredSaved():
                out = self._saved(event)
            case SummaryDone():
                out = self.compacting.done(self._live(event.request.run_id), event.result)
            case SummaryFailed():
                out = self.compacting.failed(self._live(event.request.run_id), event.error)
            case TokensCounted():
                if self.context is not None:  # the counts serve every later turn
                    self.context.record_counts(event.job.target, event.counts)
                return []
            case ClientStalled():
                out = self._stalled(event.run_id, event.timeout)
            case ClientGone():
                return self._gone()
            case DrainBegun():
                self.draining = True
                return []
            case DrainOver():
                out = self._drain_over()
            case LifetimeOver():
                self.expiring = True
                out = []
            case _:
                assert_never(event)
        if self._queue:
            out += self._start_ready_runs()
        if self.expiring:
            out += self._maybe_close()
        return out

    @property
    def active_count(self) -> int:
        return sum(1 for r in self._runs.values() if r.state is not RunState.QUEUED)

    @property
    def queued_count(self) -> int:
        return len(self._queue)

    @property
    def queued_bytes(self) -> int:
        return self.admission.queued_bytes

    def _live(self, run_id: int) -> Run | None:
        return self._runs.get(run_id)

    # ------------------------------------------------------------ the client

    def _message(self, data: str | bytes) -> list[Action]:
        """One text frame from the client."""
        try:
            msg = wire.loads(data)
        except wire.JSONDecodeError:
            return frames.reject(ClientError("The message is not valid JSON.", code="invalid_json"))
        if not isinstance(msg, dict):
            err = ClientError("Each message must be one JSON object.", code="invalid_json")
            return frames.reject(err)
        kind = msg.get("type")
        if kind == "response.create":
            return self._create(msg, len(data))
        if kind == "response.steer":
            return self._steer(msg)
        if kind == "response.cancel":
            return self._cancel(msg)
        if isinstance(kind, str):
            text = f"Unknown event type '{kind[:100]}'. Send 'response.create'."
        else:
            text = "The message has no 'type'."
        return frames.reject(ClientError(text, code="unknown_event_type", param="type"))

    def _create(self, body: dict[str, Any], nbytes: int, *, socket: bool = True) -> list[Action]:
        """A create (a WebSocket message, or an HTTP body); `nbytes`, the size of its message,
        counts against the queued-bytes bounds while it waits."""
        if self.draining:
            return frames.reject(ServerDraining())
        lane: str | None = None
        try:
            lane = self.admission.lane_of(body) if socket else None
            self.admission.check_lane(lane)
            req = self.admission.admit(body, nbytes, len(self._queue), socket=socket)
        except ClientError as err:
            # an invalid stream_id is never echoed (docs/protocol.md "Errors"); a valid one is
            return frames.reject(err, lane if err.code != "invalid_stream_id" else None)
        run = Run(next(self._ids), req)
        if req.previous_response_id and self.cache.pin(req.previous_response_id):
            run.pinned = req.previous_response_id
        self._runs[run.id] = run
        self._queue.append(run)
        self.admission.charge(run.id, nbytes)
        return [run.created()]

    def _stalled(self, run_id: int, timeout: float) -> list[Action]:
        """A write of the run's events stayed blocked: the client stopped reading. The response
        is cancelled upstream and fails with `client_too_slow` (the events queue behind what
        the client has not read); its lane is free again."""
        run = self._runs.get(run_id)
        if run is None:
            return []
        return [CancelUpstream(run.id), *self._fail(run, ClientTooSlow(timeout))]

    def _gone(self) -> list[Action]:
        """The socket closed: abandon everything, cache included (docs/protocol.md "After a
        reconnect"). The runs end silently: nobody is left to receive an event, and queued
        steer input exists only on this connection (docs/protocol.md "response.steer" step 5)."""
        self.closed = True
        runs = list(self._runs.values())
        out: list[Action] = [CancelUpstream(r.id) for r in runs if r.state in IN_FLIGHT]
        for run in runs:
            self._end(run, Outcome.CANCELLED, silent=True)
        self._queue.clear()
        self.steering.clear()
        self.cache.clear()
        return out

    def _drain_over(self) -> list[Action]:
        """The drain's grace is over and the front is about to close: every run still queued
        or in flight is cancelled upstream and fails with 503 `server_shutting_down` (a
        `response.failed` first for one the client saw created), so that no response ends
        without a terminal event. Queued runs never start."""
        self.draining = True
        self._queue.clear()  # nothing starts while the runs below end
        out: list[Action] = []
        for run in list(self._runs.values()):
            if run.state in IN_FLIGHT:
                out.append(CancelUpstream(run.id))
            if run.pinned is not None:
                self.cache.unpin(run.pinned)
                run.pinned = None
            out += self._fail(run, ServerShuttingDown())
        return out

    def _maybe_close(self) -> list[Action]:
        """After `LifetimeOver`, once no response is in flight: send
        `websocket_connection_limit_reached` and close with 1001, never mid-response."""
        if self.closed or self.active_count:
            return []
        self.closed = True
        err = ClientError(
            "This WebSocket connection reached its lifetime limit; open a new connection to "
            "continue.",
            code="websocket_connection_limit_reached",
        )
        return [frames.error(err, None), Close(1001, "connection lifetime reached")]

    # ------------------------------------------------------------ the lane scheduler

    def _start_ready_runs(self) -> list[Action]:
        """Start queued runs whose lane is idle, oldest first, while slots last. Starting a
        run can end it at once (a warmup, a missing parent), which frees its lane again, so
        the scan restarts after every start until nothing more can start."""
        out: list[Action] = []
        while (
            not self.expiring
            and not self.closed
            and self._queue
            and self.active_count < self.limits.max_active_per_connection
        ):
            waiting: set[str | None] = set()  # lanes whose head waits for its parent
            for run in self._queue:  # the first queued run of an idle lane is its head
                lane = run.req.lane
                if lane in self._busy_lanes or lane in waiting:
                    continue
                if not self._awaits_parent(run):
                    break
                waiting.add(lane)
            else:
                break
            self._queue.remove(run)
            out += self._resolve_parent(run)
        return out

    def _awaits_parent(self, run: Run) -> bool:
        """A fork from a response still in flight on another lane waits until that run ends,
        as a continuation on the parent's own lane waits behind it (docs/protocol.md "Forks");
        it then starts from the cached parent, or gets the `previous_response_not_found` a
        same-lane continuation would get if the parent failed or was cancelled."""
        rid = run.req.previous_response_id
        if not rid or rid in self.cache:
            return False
        return any(
            r.stream is not None and r.stream.response_id == rid and r.state in IN_FLIGHT
            for r in self._runs.values()
        )

    # ------------------------------------------------------------ steering and cancel

    def _steer(self, msg: dict[str, Any]) -> list[Action]:
        target = msg.get("previous_response_id")
        run = streaming(self._runs.values(), target) if isinstance(target, str) else None
        out, accepted = self.steering.steer(msg, run, self._runs.values())
        if accepted and run is not None and at_boundary(run):
            out += self._interrupt(run)
        return out

    def _cancel(self, msg: dict[str, Any]) -> list[Action]:
        """`response.cancel` (a wsmode extension; docs/protocol.md "response.cancel"): stop an
        in-flight response. It ends with `response.incomplete` whose status is `cancelled`
        (and no `incomplete_details`: the API's reasons do not include a cancel); the cache is
        untouched (the parent stays, the cancelled response is not cached)."""
        lane: str | None = None
        try:
            lane = check_stream_id(msg.get("stream_id"))
            run = cancel_target(self._runs.values(), msg.get("response_id"), lane)
        except ClientError as err:
            return frames.reject(err, lane if err.code != "invalid_stream_id" else None)
        stream = run.stream
        if stream is not None and stream.response is not None:
            resp = {**stream.response, "output": stream.finished_items()}
            seq = run.next_seq()
        else:  # nothing was sent yet for it: the terminal event is all the client sees
            resp = response_object(
                response_id=self.new_id("resp"),
                request=run.req.body,
                status="cancelled",
                created_at=int(self.clock()),
            )
            seq = 0
        resp.update(status="cancelled", incomplete_details=None, usage=None)
        ev = lifecycle_event("response.incomplete", resp, seq)
        n = len(resp.get("output", ()))
        return [
            CancelUpstream(run.id),
            frames.event(ev, run.req.lane),
            *self._end(run, Outcome.CANCELLED, resp["id"], output_items=n, response=resp),
        ]


__all__ = ["Session"]

"""One connection's protocol state: lanes, FIFO, warmups, caching, steering, failures.

Theory of operation
-------------------
The adapter feeds happenings in (`client_message`, `create`, `upstream_event`,
`upstream_failed`, `upstream_eof`, `summary_done`/`summary_failed`, `client_stalled`,
`begin_drain`, `lifetime_over`, `client_gone`) and executes the actions that come back
(proxy/core/actions.py). Nothing here waits or touches a socket, and the adapter makes no
protocol decision of its own. The HTTP front runs one create through a session of its own.

A `response.create` is validated on arrival (docs/protocol.md "response.create") and becomes a `Run`
queued on its lane (`RunCreated` tells the adapter). Lanes are FIFO and never overlap; different
lanes run concurrently up to `max_active` runs per connection, further creates wait
(docs/protocol.md "Lanes"); the bytes of the waiting creates count against the connection's bound
and the process `MemoryBudget` (proxy/core/memory.py), and a create past either gets
`too_many_queued_requests`. A run starts when it reaches the head of its lane and a slot is free;
only then is `previous_response_id` resolved (connection cache first, then the store), because the
parent may be the response that ran just before it. A remote store (Redis, docs/store.md)
is never called from here: the run waits in LOADING while the adapter executes a
`LoadStored` and hands the answer back (`stored_loaded`), and a stored response is written
by a `SaveStored` placed before its terminal event. A fork whose parent is still in flight
on another lane waits at the head of its lane until that run ends. A parent that a queued
run refers to is pinned in the cache until the run starts (docs/protocol.md "Forks").

A run's states and their legal moves are the table in proxy/core/runs.py; every run ends in
`_end`, the one path that frees its lane, settles its steers, reports its `Outcome` and
starts what can start next.

With a `ContextManager` (proxy/core/context/manager.py) a run's upstream input is prepared
at start (compaction items expanded, the window fitted); when `context_management` asks for
it the run first waits in COMPACTING while the adapter runs the `Summarise` actions, and its
stream then begins with the compaction item. A `compaction_trigger` run generates nothing:
its stream is the proxy's own (proxy/core/context/trigger.py) and ends with the compaction
item once the summary is complete. Runs that could continue with the upstream's own
`previous_response_id` are prepared too when there is something to manage, and sent in
full if preparing changed anything.

Steering (proxy/core/steering.py) stops a STREAMING run at its next item boundary and queues
the successor at the head of the lane. After `lifetime_over` nothing new starts, and the
connection closes once no run is in flight; after `begin_drain` creates are refused (503
`server_draining`) and the runs already there finish.

Each `StartUpstream` carries a `Route`: the replica that served the run's parent and its
chain's key (core/routing.py); the adapter reports the replica it used (`routed`), and the
cached response records both, so every turn of a chain follows it (upstream/pool.py).

On a terminal `completed` or `incomplete` the run's whole item list (parent items, new input,
output) is cached under the response id. On any failure of a continuation the parent is
evicted when it belongs to the same lane, and kept for a cross-lane fork (docs/protocol.md
"Continuing and eviction"). Errors the client caused, and cancels, never change the cache, with one
exception: new input refused when the run starts (a tool output that answers no call of the
conversation, an input guard: core/guards.py) fails the continuation as OpenAI's would, and evicts
the parent likewise.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from . import ids, wire
from .actions import (
    Action,
    CancelUpstream,
    Close,
    CountTokens,
    Finished,
    LoadStored,
    Outcome,
    Route,
    RunCreated,
    SaveStored,
    Send,
    StartUpstream,
)
from .api_objects import failed_error, lifecycle_event, response_object, zero_usage
from .context.compaction import compaction_of, has_trigger
from .context.managed_stream import ManagedStream
from .context.manager import ContextManager, SummaryResult, compaction_failed
from .context.trigger import CompactionStream
from .conversation import (
    CHECKED_OUTPUTS,
    EMPTY,
    NO_CALLS,
    CachedResponse,
    ResponseCache,
    Segment,
    index_calls,
    orphan_output,
)
from .errors import (
    ClientError,
    ClientTooSlow,
    ProxyError,
    ServerDraining,
    ServerShuttingDown,
    UpstreamError,
    no_tool_call,
    previous_response_not_found,
    reused_response_id,
    stored_response_unavailable,
)
from .guards import Guards
from .memory import MemoryBudget
from .policy import SessionLimits, UpstreamPolicy
from .request import check_stream_id, parse_create
from .routing import cached_tokens, client_key, content_key, slot_of
from .runs import Run, RunState, cancel_target, streaming
from .sse import SSEEvent
from .steering import Steering, at_boundary, steered_response
from .store import ResponseStore, StoredResponse

_IN_FLIGHT = (RunState.LOADING, RunState.COMPACTING, RunState.UPSTREAM, RunState.STREAMING)
# outcomes whose run delivered what it carried (a steer's input included)
_DELIVERED = frozenset({Outcome.COMPLETED, Outcome.INCOMPLETE, Outcome.WARMUP, Outcome.STEERED})
# set in a cached response's settings when the upstream never saw it (the proxy wrote it):
# it cannot be continued with the upstream's own previous_response_id
_PROXY_MADE = "wsmode_proxy_made"


@dataclass
class Session:
    cache: ResponseCache
    policy: UpstreamPolicy
    limits: SessionLimits = field(default_factory=SessionLimits)
    clock: Callable[[], float] = lambda: 0.0
    new_id: Callable[[str], str] = ids.new_id
    store: ResponseStore | None = None  # responses that outlive the socket (store != false)
    owner: str = "anonymous"  # the credential scope for `store` and compaction items
    context: ContextManager | None = None  # compaction, truncation, token counts
    guards: Guards | None = None  # checks of each turn's new input (core/guards.py)
    memory: MemoryBudget | None = None  # the process budget that queued creates count against
    # the key of a new chain whose client names none: the WebSocket connection's id; None
    # (HTTP): a hash of the conversation's start (core/routing.py)
    chain_key: str | None = None
    # the store is remote (Redis; `store` is None then): its reads and writes are actions
    # the adapter awaits (LoadStored, SaveStored), never calls made from here
    remote_store: bool = False

    def __post_init__(self) -> None:
        self._ids = itertools.count(1)
        self._queue: deque[Run] = deque()
        self._runs: dict[int, Run] = {}  # every run not yet DONE
        self._busy_lanes: set[str | None] = set()
        self._lanes: set[str] = set()  # named lanes ever used on this connection
        self._scheduling = False  # `_schedule` is running (a start can end a run)
        self._waiting_bytes: dict[int, int] = {}  # run id -> bytes of its create, while queued
        self.queued_bytes = 0
        self.steering = Steering(
            self.cache,
            enabled=self.limits.steering,
            max_pending=self.limits.max_pending_steers,
            new_id=self.new_id,
            next_run_id=self._ids.__next__,
        )
        self.expiring = False  # the connection lifetime is over: finish, then close
        self.draining = False  # the server drains: no new creates
        self.closed = False

    # ------------------------------------------------------------ inputs

    def client_message(self, data: str | bytes) -> list[Action]:
        """One text frame from the client."""
        try:
            msg = wire.loads(data)
        except wire.JSONDecodeError:
            return self._reject(ClientError("The message is not valid JSON.", code="invalid_json"))
        if not isinstance(msg, dict):
            return self._reject(
                ClientError("Each message must be one JSON object.", code="invalid_json")
            )
        kind = msg.get("type")
        if kind == "response.create":
            return self.create(msg, len(data))
        if kind == "response.steer":
            return self._steer(msg)
        if kind == "response.cancel":
            return self._cancel(msg)
        if isinstance(kind, str):
            text = f"Unknown event type '{kind[:100]}'. Send 'response.create'."
        else:
            text = "The message has no 'type'."
        return self._reject(ClientError(text, code="unknown_event_type", param="type"))

    def upstream_event(self, run_id: int, event: SSEEvent) -> list[Action]:
        run = self._runs.get(run_id)
        if run is None or run.stream is None:
            return []
        try:
            frames = run.stream.feed(event)
        except UpstreamError as err:
            return self._fail(run, err)
        rid = run.stream.response_id
        if rid is not None and rid != run.response_id:  # the upstream named it (once a run)
            seen, run.response_id = run.response_id, rid
            if self._taken(run, rid):
                return self._fail(run, reused_response_id(rid), announce=seen is not None)
        if run.state is not RunState.STREAMING:  # once per run, not per event
            run.move(RunState.STREAMING)
        out: list[Action] = [Send(run.lane_frame(f)) for f in frames]
        if run.stream.outcome is not None:
            return self._finish_stream(run, out)
        if run.steers and at_boundary(run):
            out += self._interrupt(run)
        return out

    def upstream_failed(self, run_id: int, err: UpstreamError) -> list[Action]:
        """The upstream request failed: an HTTP error status, a connect error, a stall, a cut."""
        run = self._runs.get(run_id)
        if run is None:
            return []
        # upstream.api = "auto": a 404/405 on /responses switches to Chat and resends
        stream = run.stream
        if isinstance(stream, ManagedStream):
            stream = stream.inner  # the dialect's own translator tells where it was sent
        if not err.started and stream and self.policy.dialect.retry_elsewhere(err.status, stream):
            try:
                return [self._start_upstream(run)]
            except ClientError as bad:
                frame = self._error_frame(bad, run.req.lane)
                return [Send(frame), *self._end(run, Outcome.REJECTED)]
        if (
            run.native
            and not err.started
            and err.code == "previous_response_not_found"
            and run.parent is not None
        ):
            # The upstream lost its own state: rebuild the full request, once (issue 2.4).
            run.native = False
            return [self._start_upstream(run)]
        return self._fail(run, err)

    def upstream_eof(self, run_id: int) -> list[Action]:
        run = self._runs.get(run_id)
        if run is None or run.stream is None:
            return []
        try:
            frames = run.stream.eof()
        except UpstreamError as err:
            return self._fail(run, err)
        out: list[Action] = [Send(run.lane_frame(f)) for f in frames]
        if run.stream.outcome is not None:
            return self._finish_stream(run, out)
        return out

    def client_stalled(self, run_id: int, timeout: float) -> list[Action]:
        """A write of `run_id`'s events stayed blocked for `timeout` seconds: the client
        stopped reading. The response is cancelled upstream and fails with `client_too_slow`
        (the events queue behind what the client has not read); its lane is free again."""
        run = self._runs.get(run_id)
        if run is None:
            return []
        return [CancelUpstream(run.id), *self._fail(run, ClientTooSlow(timeout))]

    def begin_drain(self) -> None:
        """The server drains: every later `response.create` is refused (503
        `server_draining`); the runs already queued or in flight carry on."""
        self.draining = True

    def drain_over(self) -> list[Action]:
        """The drain's grace is over and the adapter is about to close: every run still
        queued or in flight is cancelled upstream and fails with 503 `server_shutting_down`
        (a `response.failed` first for one the client saw created), so that no response
        ends without a terminal event. Queued runs never start."""
        self.draining = True
        self._queue.clear()  # nothing starts while the runs below end
        out: list[Action] = []
        for run in list(self._runs.values()):
            if run.state in _IN_FLIGHT:
                out.append(CancelUpstream(run.id))
            if run.pinned is not None:
                self.cache.unpin(run.pinned)
                run.pinned = None
            out += self._fail(run, ServerShuttingDown())
        return out

    def client_gone(self) -> list[Action]:
        """The socket closed: abandon everything, cache included (docs/protocol.md "After a
        reconnect").

        The runs end silently: nobody is left to receive an event, and queued steer input
        exists only on this connection (docs/protocol.md "response.steer" step 5)."""
        self.closed = True
        runs = list(self._runs.values())
        out: list[Action] = [CancelUpstream(r.id) for r in runs if r.state in _IN_FLIGHT]
        for run in runs:
            self._end(run, Outcome.CANCELLED, silent=True)
        self._queue.clear()
        self.steering.clear()
        self.cache.clear()
        return out

    def lifetime_over(self) -> list[Action]:
        """The connection's lifetime is up (docs/protocol.md "Limits"): start nothing new; once no
        response is in flight, send `websocket_connection_limit_reached` and close with 1001. Never
        in the middle of a response."""
        self.expiring = True
        return self._maybe_close()

    def routed(self, run_id: int, replica: str) -> None:
        """The adapter sent the run's request to `replica` (upstream/pool.py): the response
        records it, so the chain's next turn goes there too."""
        run = self._runs.get(run_id)
        if run is not None:
            run.replica = replica

    def is_active(self, run_id: int) -> bool:
        """The session still wants `run_id` (queued or in flight): the runner stops reading
        an upstream stream once this is false."""
        return run_id in self._runs

    @property
    def active_count(self) -> int:
        return sum(1 for r in self._runs.values() if r.state is not RunState.QUEUED)

    @property
    def queued_count(self) -> int:
        return len(self._queue)

    # ------------------------------------------------------------ creates

    def create(self, msg: dict[str, Any], nbytes: int = 0) -> list[Action]:
        """A `response.create` already parsed (the HTTP front hands its body in directly);
        `nbytes`, the size of its message, counts against the queued-bytes bounds while it
        waits."""
        if self.draining:
            return self._reject(ServerDraining())
        lane: str | None = None
        try:
            lane = check_stream_id(msg.get("stream_id"))
            new_lane = lane is not None and lane not in self._lanes
            if new_lane and len(self._lanes) >= self.limits.max_lanes_per_connection:
                raise ClientError(
                    "This connection already uses "
                    f"{self.limits.max_lanes_per_connection} stream_ids.",
                    code="websocket_stream_limit_reached",
                    param="stream_id",
                )
            req = parse_create(msg)
            if self.context is not None:
                self.context.validate(req, self.owner)
            if len(self._queue) >= self.limits.max_queued_per_connection:
                raise ClientError(
                    f"Too many queued requests on this connection (limit "
                    f"{self.limits.max_queued_per_connection}); wait for responses to finish.",
                    code="too_many_queued_requests",
                    status=429,
                    type="rate_limit_error",
                )
            self._check_queued_bytes(nbytes)
        except ClientError as err:
            # an invalid stream_id is never echoed (docs/protocol.md "Errors"); a valid one always
            # is
            echo = lane if err.code != "invalid_stream_id" else None
            return self._reject(err, echo)
        if lane is not None:
            self._lanes.add(lane)
        run = Run(next(self._ids), req)
        if req.previous_response_id and self.cache.pin(req.previous_response_id):
            run.pinned = req.previous_response_id
        self._runs[run.id] = run
        self._queue.append(run)
        self._charge(run, nbytes)
        return [_created(run), *self._schedule()]

    def _check_queued_bytes(self, nbytes: int) -> None:
        """429 `too_many_queued_requests` when a create of `nbytes` would take this
        connection's queued bytes, or the process budget, past its bound."""
        cap = self.limits.max_queued_bytes_per_connection
        if self.queued_bytes + nbytes > cap:
            text = f"this connection's queued requests would exceed {cap} bytes"
        elif self.memory is not None and not self.memory.can_queue(nbytes):
            self.memory.refused += 1
            text = "the server's memory budget for waiting requests is used up"
        else:
            return
        raise ClientError(
            f"Too many queued requests: {text}; wait for responses to finish.",
            code="too_many_queued_requests",
            status=429,
            type="rate_limit_error",
        )

    def _charge(self, run: Run, nbytes: int) -> None:
        self._waiting_bytes[run.id] = nbytes
        self.queued_bytes += nbytes
        if self.memory is not None:
            self.memory.queued += nbytes

    def _discharge(self, run: Run) -> None:
        """The run left the queue (it starts, or ends): its create's bytes no longer wait."""
        nbytes = self._waiting_bytes.pop(run.id, 0)
        self.queued_bytes -= nbytes
        if self.memory is not None:
            self.memory.queued -= nbytes

    def _spawn(self, run: Run) -> list[Action]:
        """Queue a steer's automatic successor first in its lane (docs/protocol.md
        "response.steer")."""
        self._runs[run.id] = run
        self._queue.appendleft(run)
        return [_created(run)]

    def _schedule(self) -> list[Action]:
        """Start queued runs whose lane is idle, oldest first, while slots last.

        Starting a run can end it at once (a warmup, a missing parent), which frees its lane
        again, so the scan restarts after every start until nothing more can start. A run
        that ends inside this loop calls back here through `_end`; that call returns at once
        and this loop carries on."""
        if self._scheduling:
            return []
        self._scheduling = True
        out: list[Action] = []
        try:
            while (
                not self.expiring
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
                out += self._start(run)
        finally:
            self._scheduling = False
        return out

    def _awaits_parent(self, run: Run) -> bool:
        """A fork from a response still in flight on another lane waits until that run
        ends, as a continuation on the parent's own lane waits behind it (docs/protocol.md "Forks");
        it then starts from the cached parent, or gets the `previous_response_not_found` a
        same-lane continuation would get if the parent failed or was cancelled."""
        rid = run.req.previous_response_id
        if not rid or rid in self.cache:
            return False
        return any(
            r.stream is not None and r.stream.response_id == rid and r.state in _IN_FLIGHT
            for r in self._runs.values()
        )

    def _start(self, run: Run) -> list[Action]:
        self._discharge(run)
        req = run.req
        if run.pinned is not None:
            self.cache.unpin(run.pinned)
            run.pinned = None
        if req.previous_response_id:
            run.parent = self._lookup(req.previous_response_id)
            if run.parent is None and self.remote_store:
                # read it from the remote store; the run holds its lane and slot meanwhile
                run.move(RunState.LOADING)
                self._busy_lanes.add(req.lane)
                return [LoadStored(run.id, req.previous_response_id, self.owner)]
            if run.parent is None:
                err = previous_response_not_found(req.previous_response_id)
                return [Send(self._error_frame(err, req.lane)), *self._end(run, Outcome.REJECTED)]
        return self._begin(run)

    def stored_loaded(
        self, run_id: int, stored: StoredResponse | None, *, unavailable: bool = False
    ) -> list[Action]:
        """The answer to a `LoadStored`: the stored parent, or None when it is not stored
        for this credential or (`unavailable`) the store could not answer in time; both
        end the run with the documented `previous_response_not_found`."""
        run = self._runs.get(run_id)
        if run is None or run.state is not RunState.LOADING:
            return []  # cancelled, or the client left, while the store was read
        rid = run.req.previous_response_id
        assert rid is not None
        if stored is None:
            err = stored_response_unavailable(rid) if unavailable else None
            err = err or previous_response_not_found(rid)
            return [Send(self._error_frame(err, run.req.lane)), *self._end(run, Outcome.REJECTED)]
        run.parent = stored.entry
        return self._begin(run)

    def _begin(self, run: Run) -> list[Action]:
        """A run whose parent (if it names one) is found: check, then start it."""
        if run.parent is not None:
            self.steering.apply_waiting(run)
        req = run.req
        refused = self._check_input(run)
        # a failed continuation: the parent goes (docs/protocol.md "Continuing and eviction")
        if refused is not None:
            self._evict_parent(run)
            why = refused.code or "no_tool_call"
            frame = self._error_frame(refused, req.lane)
            return [Send(frame), *self._end(run, Outcome.REJECTED, refused=why)]
        if not req.generate:
            return self._warmup(run)
        if self.context is not None and has_trigger(req.input_items):
            return self._compact_now(run)
        run.native = (
            self.policy.native_previous_response_id
            and run.parent is not None
            and run.parent.settings.get("store") is not False
            and not run.parent.settings.get(_PROXY_MADE)
        )
        out: list[Action] = []
        # a native run is managed too when it could need it: then it is sent in full
        # unless nothing was compacted, truncated or expanded (ContextManager.native_ok)
        if self.context is not None and (not run.native or self.context.manages(req)):
            try:
                run.context = self.context.prepare(run.parent, req, self.owner)
            except ClientError as err:  # the window is exceeded, ...
                return [Send(self._error_frame(err, req.lane)), *self._end(run, Outcome.REJECTED)]
            if run.context.jobs:
                out.append(CountTokens(run.context.jobs))
            run.native = run.native and self.context.native_ok(run.context)
        self._busy_lanes.add(req.lane)
        if run.context is not None and run.context.cut is not None:
            assert self.context is not None
            run.move(RunState.COMPACTING)
            dialect = self.policy.dialect
            return [*out, self.context.summary_action(run.id, run.context, req.model, dialect)]
        try:
            start = self._start_upstream(run)
        except ClientError as err:  # the dialect cannot express it (chat: strict_tools, ...)
            return [Send(self._error_frame(err, req.lane)), *self._end(run, Outcome.REJECTED)]
        return [*out, start]

    def _compact_now(self, run: Run) -> list[Action]:
        """A `compaction_trigger` (docs/protocol.md "Compaction", proxy/core/context/trigger.py):
        the response is the compaction of the conversation so far, written here; the trigger and the
        compaction never reach the upstream, only the summarising requests do."""
        assert self.context is not None
        req = run.req
        try:
            run.context = self.context.plan_trigger(run.parent, req, self.owner)
        except ClientError as err:  # nothing to compact
            return [Send(self._error_frame(err, req.lane)), *self._end(run, Outcome.REJECTED)]
        self._busy_lanes.add(req.lane)
        stream = CompactionStream(
            self.new_id("resp"),
            self.new_id("cmp"),
            req.body,
            int(self.clock()),
            progress=self.context.settings.compaction.progress_events,
        )
        run.stream = stream
        out: list[Action] = [Send(run.lane_frame(f)) for f in stream.opening()]
        if run.context.cut is None:
            return out + self._compacted_now(run, stream)
        run.move(RunState.COMPACTING)
        return [*out, *self._next_summary(run, stream)]

    def _next_summary(self, run: Run, stream: CompactionStream) -> list[Action]:
        """A trigger's next summarising request, announced by the progress event. The
        request's instructions are summarised with the conversation (as for /compact)."""
        assert self.context is not None and run.context is not None
        instructions = run.req.settings.get("instructions")
        action = self.context.summary_action(
            run.id,
            run.context,
            run.req.model,
            self.policy.dialect,
            instructions if isinstance(instructions, str) else None,
        )
        return [*(Send(run.lane_frame(f)) for f in stream.compacting()), action]

    def _compacted_now(self, run: Run, stream: CompactionStream) -> list[Action]:
        """A trigger's summary is complete: seal the item, finish and cache the response."""
        assert self.context is not None and run.context is not None
        item, usage = self.context.trigger_item(run.context, self.owner, stream.item_id)
        out: list[Action] = [
            Send(run.lane_frame(f)) for f in stream.finish(item, usage, int(self.clock()))
        ]
        rid = stream.response_id
        assert rid is not None and stream.response is not None
        writes = self._remember(run, rid, [wire.dumps_kept(item)], stream.response)
        return [*writes, *out, *self._end(run, Outcome.COMPLETED, rid, usage)]

    def summary_done(self, run_id: int, result: SummaryResult) -> list[Action]:
        """The summarising request of a compaction finished: generate from the compacted
        context, the stream starting with the compaction item (or, for a
        `compaction_trigger`, answer the compaction item alone)."""
        run = self._runs.get(run_id)
        if run is None or run.state is not RunState.COMPACTING:
            return []
        assert self.context is not None and run.context is not None
        trigger = run.stream if isinstance(run.stream, CompactionStream) else None
        try:
            if self.context.absorb_summary(run.context, result):  # the next chunk
                if trigger is not None:
                    return self._next_summary(run, trigger)
                dialect = self.policy.dialect
                return [self.context.summary_action(run.id, run.context, run.req.model, dialect)]
            if trigger is not None:
                return self._compacted_now(run, trigger)
            run.context = self.context.compacted(run.context, self.owner, self.new_id("cmp"))
            return [self._start_upstream(run)]
        except UpstreamError as err:
            return self._fail(run, err)
        except ClientError as err:  # the compacted context does not fit, or cannot be sent
            return [Send(self._error_frame(err, run.req.lane)), *self._end(run, Outcome.REJECTED)]

    def summary_failed(self, run_id: int, err: UpstreamError) -> list[Action]:
        run = self._runs.get(run_id)
        if run is None or run.state is not RunState.COMPACTING:
            return []
        return self._fail(run, compaction_failed(err))

    def _check_input(self, run: Run) -> ClientError | None:
        """Checks of the new input: every function or custom tool call output answers a call
        of the conversation or of the input before it (OpenAI's 400), from the parent's call
        index; then the input guards. The cost is the new input's, not the history's."""
        parent = run.parent or EMPTY
        items, opaque = self._visible(run.req.input_items)
        if not opaque and not parent.opaque:
            found = orphan_output(parent.calls, items)
            if found is not None:
                return no_tool_call(CHECKED_OUTPUTS[found[1]], found[2])
        if self.guards is not None:
            refusal, run.moderation = self.guards.run(run.req.input_items)
            if refusal is None and parent.unmoderated and self.guards.moderation:
                run.moderation = (*parent.unmoderated, *(run.moderation or ()))
            return refusal
        return None

    def input_refused(self, run_id: int, err: ProxyError) -> list[Action]:
        """The runner's moderation refused the run's new input (a `ClientError`), or could
        not answer and fails closed: before any upstream request, so no event was sent."""
        run = self._runs.get(run_id)
        if run is None:
            return []
        # a failed continuation (docs/protocol.md "Continuing and eviction")
        self._evict_parent(run)
        outcome = Outcome.REJECTED if isinstance(err, ClientError) else Outcome.FAILED
        why = err.code or "moderation"
        return [Send(self._error_frame(err, run.req.lane)), *self._end(run, outcome, refused=why)]

    def _visible(self, items: tuple[bytes, ...]) -> tuple[tuple[bytes, ...], bool]:
        """The new input as the call index sees it: compaction items expanded when they are
        this proxy's own; `True` if one holds what the proxy cannot see (the upstream's)."""
        if not any(compaction_of(item) is not None for item in items):
            return items, False
        if self.context is None:
            return items, True
        return self.context.expanded(items, self.owner), False

    def _taken(self, run: Run, rid: str) -> bool:
        """`rid` already names another response of this connection (cached, stored or in
        flight): an upstream that reuses ids must not make one conversation overwrite
        another, so that response fails instead (README "Errors"). A remote store is not
        asked here (no call from the core): it refuses to overwrite an id it holds."""
        if rid in self.cache or any(
            r.response_id == rid for r in self._runs.values() if r is not run
        ):
            return True
        return self.store is not None and self.store.get(rid, self.owner) is not None

    def _lookup(self, rid: str) -> CachedResponse | None:
        """docs/protocol.md "Continuing and eviction": the connection cache first, then the store
        (stored responses only)."""
        entry = self.cache.get(rid)
        if entry is None and self.store is not None:
            stored = self.store.get(rid, self.owner)
            entry = stored.entry if stored is not None else None
        return entry

    def _start_upstream(self, run: Run) -> StartUpstream:
        req, dialect = run.req, self.policy.dialect
        patch = {"previous_response_id": req.previous_response_id, "store": req.store}
        run.chain = self._chain_of(run)
        session_key = self.policy.session_key_in_body and client_key(req.settings) is None
        if session_key:  # the proxy's own key goes upstream; the client's answer shows none
            patch["prompt_cache_key"] = None
        run.stream = dialect.translator(patch, req.body)
        # an upstream that keeps state must store what the client stores, so that the next
        # turn can continue natively; a stateless one needs to store nothing
        store = req.store if self.policy.native_previous_response_id else self.policy.store
        extra: dict[str, Any] = {"stream": True, "store": store}
        settings = req.settings
        if run.native:
            assert run.parent is not None
            extra["previous_response_id"] = run.parent.id
            items = list(req.input_items)
            if run.context is not None:  # context_management is the proxy's, not sent
                settings = run.context.settings
        elif run.context is not None:  # prepared by the ContextManager
            assert self.context is not None
            prep = run.context
            run.stream = ManagedStream(
                run.stream,
                estimate_usage=partial(self.context.usage, prep),
                first_item=prep.compaction,
                extra_usage=prep.summary_usage,
            )
            settings, items = prep.settings, prep.items
        else:
            parent = run.parent or EMPTY
            items = [*parent.items(), *req.input_items]
        if session_key:
            extra["prompt_cache_key"] = run.chain
        if self.policy.llamacpp_slots:
            extra["id_slot"] = slot_of(run.chain, self.policy.llamacpp_slots)
        body = dialect.body(settings, extra, items)
        route = Route(run.parent.replica if run.parent else None, run.chain)
        start = StartUpstream(run.id, body, dialect.path, run.moderation, route)
        run.moderation = None  # once: not again after a native fallback or auto's switch
        run.move(RunState.UPSTREAM)  # again after a native fallback or auto's switch
        return start

    def _chain_of(self, run: Run) -> str:
        """The key of the run's chain (core/routing.py): inherited from its parent, else
        the client's prompt_cache_key, the connection's id or a hash of the start."""
        if run.parent is not None and run.parent.chain:
            return run.parent.chain
        req = run.req
        return (
            client_key(req.settings) or self.chain_key or content_key(req.settings, req.input_items)
        )

    def _warmup(self, run: Run) -> list[Action]:
        """`generate: false` (docs/protocol.md "response.create"): created + completed, no upstream
        call; the input is cached under the new id so the next turn chains from it."""
        req = run.req
        now = int(self.clock())
        rid = self.new_id("resp")
        resp = response_object(
            response_id=rid, request=req.body, status="in_progress", created_at=now
        )
        created = lifecycle_event("response.created", resp, 0)
        done_resp = {**resp, "status": "completed", "usage": zero_usage(), "completed_at": now}
        completed = lifecycle_event("response.completed", done_resp, 1)
        return [
            *self._remember(run, rid, [], done_resp),
            Send(self._event_frame(created, req.lane)),
            Send(self._event_frame(completed, req.lane)),
            *self._end(run, Outcome.WARMUP, rid, zero_usage()),
        ]

    # ------------------------------------------------------------ endings

    def _finish_stream(self, run: Run, frames: list[Action]) -> list[Action]:
        """The run's terminal event arrived (its frames are `frames`): cache and store the
        response, then send them (a remote store's write goes first: docs/store.md)."""
        stream = run.stream
        assert stream is not None and stream.outcome is not None
        rid = stream.response_id
        usage = (stream.response or {}).get("usage")
        out: list[Action] = []
        if stream.outcome in ("completed", "incomplete") and rid:
            output = [wire.dumps_kept(item) for item in stream.output]
            frames = [*self._remember(run, rid, output, stream.response or {}), *frames]
            # it ended before a boundary came (docs/protocol.md "response.steer" steps 2 and 4)
            if run.steers:
                sends, successor = self.steering.after_end(run, rid, self._queue)
                out += sends
                if successor is not None:
                    out += self._spawn(successor)
        else:
            self._evict_parent(run)
        outcome = Outcome(stream.outcome)
        usage = usage if isinstance(usage, dict) else None
        end = self._end(run, outcome, rid, usage, output_items=len(stream.output))
        return [*frames, *out, *end]

    def _fail(self, run: Run, err: ProxyError, *, announce: bool = True) -> list[Action]:
        """A failure of the upstream (or of the client's reading): tell the client in the
        protocol's terms, evict, move on.

        If the client already saw `response.created`, it is owed a terminal event, so a
        `response.failed` precedes the `error` (docs/protocol.md "Errors", "Chat Completions
        upstreams"). `announce=False`: the event that failed the run was its first response object,
        never forwarded."""
        out: list[Action] = []
        stream = run.stream
        seq: int | None = None
        if stream is not None and stream.response is not None and announce:
            seq = run.next_seq()
            failed = {
                **stream.response,
                "status": "failed",
                "error": failed_error(err.code, err.message, err.status),
            }
            ev = lifecycle_event("response.failed", failed, seq)
            out.append(Send(self._event_frame(ev, run.req.lane)))
            seq += 1
        out.append(Send(self._error_frame(err, run.req.lane, seq)))
        self._evict_parent(run)
        rid = stream.response_id if stream is not None else None
        return out + self._end(run, Outcome.FAILED, rid)

    def _interrupt(self, run: Run) -> list[Action]:
        """A steer reached an item boundary (docs/protocol.md "response.steer" step 2): end
        `incomplete` (reason `steered`) with the finished items, cache that, and queue the
        successor."""
        stream = run.stream
        assert stream is not None and stream.response is not None and stream.response_id
        rid, items = stream.response_id, stream.finished_items()
        resp = steered_response(stream.response, items)
        ev = lifecycle_event("response.incomplete", resp, run.next_seq())
        writes = self._remember(run, rid, [wire.dumps(i) for i in items], resp)
        steers, run.steers = run.steers, []
        return [
            *writes,
            Send(self._event_frame(ev, run.req.lane)),
            CancelUpstream(run.id),
            *self._spawn(self.steering.successor(run, rid, steers)),
            *self._end(run, Outcome.STEERED, rid, output_items=len(items)),
        ]

    def _end(
        self,
        run: Run,
        outcome: Outcome,
        response_id: str | None = None,
        usage: dict[str, Any] | None = None,
        *,
        silent: bool = False,
        refused: str | None = None,
        output_items: int = 0,
    ) -> list[Action]:
        """The one end of every run: DONE, forgotten, its lane free; then the
        `response.steer.failed` owed to its steers (docs/protocol.md "response.steer": an
        undelivered successor's steers fail with `successor_creation_failed`, steers still pending
        on it with `response_not_active`), its `Finished`, and whatever can start now. `silent` (the
        client is gone) skips everything that speaks to the client."""
        run.move(RunState.DONE)
        del self._runs[run.id]
        self._discharge(run)
        # a run that never started ends inside `_schedule`, whose lane was idle: no-op then
        self._busy_lanes.discard(run.req.lane)
        if silent:
            return []
        out = self.steering.settle(run, outcome in _DELIVERED)
        cached = cached_tokens(usage)
        out.append(
            Finished(
                run.id,
                response_id,
                outcome,
                usage,
                refused,
                run.replica,
                cached,
                output_items=output_items,
            )
        )
        return out + self._schedule() + self._maybe_close()

    def _maybe_close(self) -> list[Action]:
        if not self.expiring or self.closed or self.active_count:
            return []
        self.closed = True
        err = ClientError(
            "This WebSocket connection reached its lifetime limit; open a new connection to "
            "continue.",
            code="websocket_connection_limit_reached",
        )
        return [Send(self._error_frame(err, None)), Close(1001, "connection lifetime reached")]

    def _remember(
        self, run: Run, rid: str, output: list[bytes], response: dict[str, Any]
    ) -> list[Action]:
        """Cache the finished response, and store it when it asks to be: in place for an
        in-process store, else the `SaveStored` to execute before its terminal event."""
        # after a compaction the conversation continues from the compaction item, which
        # stands for everything before it: the parent's segments are no longer needed
        compacted = run.context is not None and run.context.compaction is not None
        parent = run.parent or EMPTY
        settings = {**run.req.settings, "store": run.req.store}
        if isinstance(run.stream, CompactionStream):
            settings[_PROXY_MADE] = True
        added = Segment((*run.req.input_items, *output))
        seen, opaque = self._visible(run.req.input_items)
        expanded = None if seen is run.req.input_items else (*seen, *output)
        entry = parent.child(
            rid,
            run.req.lane,
            added,
            settings,
            compacted=compacted,
            opaque=opaque,
            seen=expanded,
            unmoderated=run.moderation or (),  # left only by a warmup: it went nowhere
            replica=run.replica,
            chain=run.chain or self._chain_of(run),
        )
        self.cache.put(entry)
        for queued in self._queue:  # a create that waited for this response: pin it too
            if queued.pinned is None and queued.req.previous_response_id == rid:
                queued.pinned = rid if self.cache.pin(rid) else None
        if not run.req.store or (self.store is None and not self.remote_store):
            return []
        stored = StoredResponse(entry, wire.dumps(response), entry.item_count - len(output))
        if self.store is not None:
            self.store.put(stored, self.owner)
            return []
        # a remote store keeps this turn's own segment, pointing at its parent's entry: only
        # if the parent was stored and the history was not compacted (docs/store.md)
        if not compacted and run.parent is not None and run.parent.settings.get("store"):
            calls = index_calls(NO_CALLS, added.items if expanded is None else expanded)
            stored = replace(stored, parent=run.parent.id, added_calls=tuple(calls))
        return [SaveStored(run.id, stored, self.owner)]

    def _evict_parent(self, run: Run) -> None:
        """docs/protocol.md "Continuing and eviction": a failed same-lane continuation evicts its
        parent; a fork keeps it."""
        if run.parent is not None and run.parent.lane == run.req.lane:
            self.cache.evict(run.parent.id)

    # ------------------------------------------------------------ steering

    def _steer(self, msg: dict[str, Any]) -> list[Action]:
        target = msg.get("previous_response_id")
        run = streaming(self._runs.values(), target) if isinstance(target, str) else None
        out, accepted = self.steering.steer(msg, run, self._runs.values())
        if accepted and run is not None and at_boundary(run):
            out += self._interrupt(run)
        return out

    # ------------------------------------------------------------ cancel (extension)

    def _cancel(self, msg: dict[str, Any]) -> list[Action]:
        """`response.cancel` (a wsmode extension; docs/protocol.md "response.cancel"): stop an
        in-flight response. It ends with `response.incomplete` whose status is `cancelled` (and no
        `incomplete_details`: the API's reasons do not include a cancel); the cache is
        untouched (the parent stays, the cancelled response is not cached)."""
        lane: str | None = None
        try:
            lane = check_stream_id(msg.get("stream_id"))
            run = cancel_target(self._runs.values(), msg.get("response_id"), lane)
        except ClientError as err:
            return self._reject(err, lane if err.code != "invalid_stream_id" else None)
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
        return [
            CancelUpstream(run.id),
            Send(self._event_frame(ev, run.req.lane)),
            *self._end(
                run, Outcome.CANCELLED, resp["id"], output_items=len(resp.get("output", ()))
            ),
        ]

    # ------------------------------------------------------------ frames

    def _reject(self, err: ProxyError, lane: str | None = None) -> list[Action]:
        return [Send(self._error_frame(err, lane))]

    def _error_frame(self, err: ProxyError, lane: str | None, seq: int | None = None) -> bytes:
        return wire.dumps(err.event(stream_id=lane, sequence_number=seq))

    def _event_frame(self, ev: dict[str, Any], lane: str | None) -> bytes:
        if lane is not None:
            ev["stream_id"] = lane
        return wire.dumps(ev)


def _created(run: Run) -> RunCreated:
    """A run exists: its lane, its parent and its new input go with it (for the console)."""
    req = run.req
    return RunCreated(run.id, req.lane, req.previous_response_id, req.input_items)


__all__ = ["Session"]

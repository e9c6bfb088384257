"""One connection's protocol state: lanes, FIFO, warmups, caching, steering, failures.

Theory of operation
-------------------
The adapter feeds happenings in (`client_message`, `create`, `upstream_event`,
`upstream_failed`, `upstream_eof`, `summary_done`/`summary_failed`, `lifetime_over`,
`client_gone`) and executes the actions that come back (`Send`, `StartUpstream`,
`Summarise`, `CountTokens`, `CancelUpstream`, `Close`, `Finished`). Nothing here waits or
touches a socket. The HTTP front runs one create through a session of its own.

A `response.create` is validated on arrival (PROTOCOL 2.1) and becomes a `Run` queued on its
lane. Lanes are FIFO and never overlap; different lanes run concurrently up to
`max_active` runs per connection, further creates wait (4.3). A run starts when it reaches
the head of its lane and a slot is free; only then is `previous_response_id` resolved
(connection cache first, then the store), because the parent may be the response that ran
just before it. A parent that a queued run refers to is pinned in the cache until the run
starts (4.4).

Run states (transitions in `_start`, `summary_done`, `upstream_event`, `_finish_stream`,
`_fail`, `_interrupt`, `_cancel_run` and `_end`):

    QUEUED --start--> UPSTREAM --first event--> STREAMING --terminal--> DONE
       |    |            |  (native fallback or auto's   |  (a steer at an item
       |    |            |   switch to Chat: again once)  |   boundary, a cancel)
       |    +--> COMPACTING --summary_done--> UPSTREAM    +-------------------> DONE
       +--warmup / not found / rejected -----------------------------------> DONE

With a `ContextManager` (proxy/core/context/manager.py) a run's upstream input is prepared at start:
compaction items expanded, the window fitted, and, when `context_management` asks for it,
the conversation compacted first: the run waits in COMPACTING while the adapter runs the
`Summarise` actions (one per chunk of the older part), and its stream then begins with the
compaction item.

Steering (proxy/core/steering.py) stops a STREAMING run at its next item boundary and queues
the successor at the head of the lane; events the proxy inserts into a stream shift the
upstream's sequence numbers (`seq_offset`). After `lifetime_over` nothing new starts, and
the connection closes once no run is in flight.

On a terminal `completed` or `incomplete` the run's whole item list (parent items, new input,
output) is cached under the response id. On any failure of a continuation the parent is
evicted when it belongs to the same lane, and kept for a cross-lane fork (4.2). Errors the
client caused, and cancels, never change the cache.
"""

from __future__ import annotations

import enum
import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from . import ids, wire
from .api_objects import lifecycle_event, response_object, zero_usage
from .context.managed_stream import ManagedStream
from .context.manager import (
    ContextManager,
    CountTokens,
    Prepared,
    Summarise,
    SummaryResult,
    compaction_failed,
)
from .conversation import EMPTY, CachedResponse, ResponseCache, Segment
from .dialects import Dialect, StreamTranslator
from .errors import (
    ClientError,
    ProxyError,
    UpstreamError,
    invalid,
    previous_response_not_found,
)
from .request import CreateRequest, check_stream_id, parse_create
from .sse import SSEEvent
from .steering import (
    Steer,
    SteerRejected,
    accepted_event,
    failed_event,
    parse_steer,
    pending_event,
    required_input,
)
from .store import ResponseStore, StoredResponse

_STREAM_ID_KEY = b'"stream_id"'


# ---------------------------------------------------------------- actions


@dataclass(slots=True)  # not frozen: one is made per event, and frozen init costs twice
class Send:
    frame: bytes  # one JSON object, sent as one text frame


@dataclass(frozen=True, slots=True)
class StartUpstream:
    run_id: int
    body: list[bytes]  # pieces of the JSON body, concatenated by the adapter
    path: str  # appended to the upstream base URL


@dataclass(frozen=True, slots=True)
class CancelUpstream:
    run_id: int


@dataclass(frozen=True, slots=True)
class Close:
    code: int
    reason: str


@dataclass(frozen=True, slots=True)
class Finished:
    """A run ended; for logs, metrics and usage accounting. `outcome` is one of
    completed, incomplete, failed, rejected, cancelled, warmup."""

    run_id: int
    response_id: str | None
    outcome: str
    usage: dict[str, Any] | None = None


Action = Send | StartUpstream | CancelUpstream | Close | Finished | Summarise | CountTokens


# ---------------------------------------------------------------- state


class RunState(enum.Enum):
    QUEUED = "queued"
    COMPACTING = "compacting"  # the summarising request of a compaction is running
    UPSTREAM = "upstream"  # request sent, no event yet
    STREAMING = "streaming"
    DONE = "done"


@dataclass(eq=False)
class Run:
    id: int
    req: CreateRequest
    state: RunState = RunState.QUEUED
    pinned: str | None = None  # parent id pinned in the cache while queued
    parent: CachedResponse | None = None
    native: bool = False  # sent with the upstream's own previous_response_id
    stream: StreamTranslator | None = None
    steers: list[Steer] = field(default_factory=list)  # accepted, not yet applied
    applies: list[Steer] = field(default_factory=list)  # steers whose input this run carries
    seq_offset: int = 0  # events the proxy inserted into this response's stream
    context: Prepared | None = None  # the prepared upstream input (ContextManager)


@dataclass(frozen=True, slots=True)
class SessionLimits:
    """A connection's limits, and the config's [limits] section as it is (proxy/config.py
    imports it; field names are the config keys)."""

    max_active_per_connection: int = 16  # in-flight responses (PROTOCOL 4.3)
    max_lanes_per_connection: int = 32  # distinct named stream_ids
    max_queued_per_connection: int = 256  # creates waiting
    steering: bool = True  # emulate response.steer (PROTOCOL 2.2)
    max_pending_steers: int = 8  # steers queued on one response (too_many_pending_steers)


@dataclass(frozen=True, slots=True)
class UpstreamPolicy:
    dialect: Dialect
    store: bool = False  # the `store` sent upstream on rebuilt requests
    native_previous_response_id: bool = False


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

    def __post_init__(self) -> None:
        self._ids = itertools.count(1)
        self._queue: deque[Run] = deque()
        self._runs: dict[int, Run] = {}  # every run not yet DONE
        self._busy_lanes: set[str | None] = set()
        self._lanes: set[str] = set()  # named lanes ever used on this connection
        self._waiting: dict[str, list[Steer]] = {}  # response id -> steers awaiting a create
        self.expiring = False  # the connection lifetime is over: finish, then close
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
            return self.create(msg)
        if kind == "response.steer":
            return self._steer(msg)
        if kind == "response.cancel":
            return self._cancel(msg)
        if not isinstance(kind, str):
            return self._reject(
                ClientError("The message has no 'type'.", code="unknown_event_type", param="type")
            )
        return self._reject(
            ClientError(
                f"Unknown event type '{kind[:100]}'. Send 'response.create'.",
                code="unknown_event_type",
                param="type",
            )
        )

    def upstream_event(self, run_id: int, event: SSEEvent) -> list[Action]:
        run = self._runs.get(run_id)
        if run is None or run.stream is None:
            return []
        try:
            frames = run.stream.feed(event)
        except UpstreamError as err:
            return self._fail(run, err)
        run.state = RunState.STREAMING
        out: list[Action] = [Send(self._lane_frame(run, f)) for f in frames]
        if run.stream.outcome is not None:
            out += self._finish_stream(run)
        elif run.steers and self._at_boundary(run):
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
                return [Send(frame), Finished(run.id, None, "rejected"), *self._end(run)]
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
        out: list[Action] = [Send(self._lane_frame(run, f)) for f in frames]
        if run.stream.outcome is not None:
            out += self._finish_stream(run)
        return out

    def client_gone(self) -> list[Action]:
        """The socket closed: abandon everything, cache included (PROTOCOL 4.5)."""
        self.closed = True
        out: list[Action] = [
            CancelUpstream(r.id)
            for r in self._runs.values()
            if r.state in (RunState.COMPACTING, RunState.UPSTREAM, RunState.STREAMING)
        ]
        self._runs.clear()
        self._queue.clear()
        self._busy_lanes.clear()
        self._waiting.clear()  # queued steer input exists only on this connection (2.2)
        self.cache.clear()
        return out

    def lifetime_over(self) -> list[Action]:
        """The connection's lifetime is up (PROTOCOL 6): start nothing new; once no response
        is in flight, send `websocket_connection_limit_reached` and close with 1001. Never
        in the middle of a response."""
        self.expiring = True
        return self._maybe_close()

    def is_active(self, run_id: int) -> bool:
        return run_id in self._runs

    def run_ids(self) -> set[int]:
        """Ids of the runs queued or in flight (adapters trace new runs with it)."""
        return set(self._runs)

    @property
    def active_count(self) -> int:
        return sum(1 for r in self._runs.values() if r.state is not RunState.QUEUED)

    @property
    def queued_count(self) -> int:
        return len(self._queue)

    # ------------------------------------------------------------ creates

    def create(self, msg: dict[str, Any]) -> list[Action]:
        """A `response.create` already parsed (the HTTP front hands its body in directly)."""
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
        except ClientError as err:
            # an invalid stream_id is never echoed (PROTOCOL 5.1); a valid one always is
            echo = lane if err.code != "invalid_stream_id" else None
            return self._reject(err, echo)
        if lane is not None:
            self._lanes.add(lane)
        run = Run(next(self._ids), req)
        if req.previous_response_id and self.cache.pin(req.previous_response_id):
            run.pinned = req.previous_response_id
        self._runs[run.id] = run
        self._queue.append(run)
        return self._schedule()

    def _schedule(self) -> list[Action]:
        """Start queued runs whose lane is idle, oldest first, while slots last.

        Starting a run can finish it at once (a warmup, a missing parent), which frees its
        lane again, so the scan restarts after every start until nothing more can start."""
        out: list[Action] = []
        while (
            not self.expiring
            and self._queue
            and self.active_count < self.limits.max_active_per_connection
        ):
            for run in self._queue:  # the first queued run of an idle lane is that lane's head
                if run.req.lane not in self._busy_lanes:
                    break
            else:
                break
            self._queue.remove(run)
            out += self._start(run)
        return out

    def _start(self, run: Run) -> list[Action]:
        req = run.req
        if run.pinned is not None:
            self.cache.unpin(run.pinned)
            run.pinned = None
        if req.previous_response_id:
            run.parent = self._lookup(req.previous_response_id)
            if run.parent is None:
                del self._runs[run.id]
                err = previous_response_not_found(req.previous_response_id)
                return [
                    Send(self._error_frame(err, req.lane)),
                    *self._steers_failed(run.applies, "successor_creation_failed"),
                    Finished(run.id, None, "rejected"),
                ]
            self._apply_waiting_steers(run)
            req = run.req
        if not req.generate:
            return self._warmup(run)
        run.native = (
            self.policy.native_previous_response_id
            and run.parent is not None
            and run.parent.settings.get("store") is not False
        )
        out: list[Action] = []
        if self.context is not None and not run.native:
            try:
                run.context = self.context.prepare(run.parent, req, self.owner)
            except ClientError as err:
                del self._runs[run.id]
                return [Send(self._error_frame(err, req.lane)), Finished(run.id, None, "rejected")]
            if run.context.jobs:
                out.append(CountTokens(run.context.jobs))
        if run.context is not None and run.context.cut is not None:
            assert self.context is not None
            self._busy_lanes.add(req.lane)
            run.state = RunState.COMPACTING
            dialect = self.policy.dialect
            return [*out, self.context.summary_action(run.id, run.context, req.model, dialect)]
        try:
            start = self._start_upstream(run)
        except ClientError as err:  # the dialect cannot express it (chat: strict_tools, ...)
            del self._runs[run.id]
            return [Send(self._error_frame(err, req.lane)), Finished(run.id, None, "rejected")]
        self._busy_lanes.add(req.lane)
        return [*out, start]

    def summary_done(self, run_id: int, result: SummaryResult) -> list[Action]:
        """The summarising request of a compaction finished: generate from the compacted
        context, the stream starting with the compaction item."""
        run = self._runs.get(run_id)
        if run is None or run.state is not RunState.COMPACTING:
            return []
        assert self.context is not None and run.context is not None
        try:
            if self.context.absorb_summary(run.context, result):  # the next chunk
                dialect = self.policy.dialect
                return [self.context.summary_action(run.id, run.context, run.req.model, dialect)]
            run.context = self.context.compacted(run.context, self.owner, self.new_id("cmp"))
            return [self._start_upstream(run)]
        except UpstreamError as err:
            return self._fail(run, err)
        except ClientError as err:  # the compacted context does not fit, or cannot be sent
            return [
                Send(self._error_frame(err, run.req.lane)),
                Finished(run.id, None, "rejected"),
                *self._end(run),
            ]

    def summary_failed(self, run_id: int, err: UpstreamError) -> list[Action]:
        run = self._runs.get(run_id)
        if run is None or run.state is not RunState.COMPACTING:
            return []
        return self._fail(run, compaction_failed(err))

    def _lookup(self, rid: str) -> CachedResponse | None:
        """PROTOCOL 4.2: the connection cache first, then the store (stored responses only)."""
        entry = self.cache.get(rid)
        if entry is None and self.store is not None:
            stored = self.store.get(rid, self.owner)
            entry = stored.entry if stored is not None else None
        return entry

    def _start_upstream(self, run: Run) -> StartUpstream:
        req, dialect = run.req, self.policy.dialect
        patch = {"previous_response_id": req.previous_response_id, "store": req.store}
        run.stream = dialect.translator(patch, req.body)
        run.state = RunState.UPSTREAM
        # an upstream that keeps state must store what the client stores, so that the next
        # turn can continue natively; a stateless one needs to store nothing
        store = req.store if self.policy.native_previous_response_id else self.policy.store
        extra: dict[str, Any] = {"stream": True, "store": store}
        settings = req.settings
        if run.native:
            assert run.parent is not None
            extra["previous_response_id"] = run.parent.id
            items = list(req.input_items)
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
        return StartUpstream(run.id, dialect.body(settings, extra, items), dialect.path)

    def _warmup(self, run: Run) -> list[Action]:
        """`generate: false` (PROTOCOL 2.1): created + completed, no upstream call; the input
        is cached under the new id so the next turn chains from it."""
        req = run.req
        now = int(self.clock())
        rid = self.new_id("resp")
        resp = response_object(
            response_id=rid, request=req.body, status="in_progress", created_at=now
        )
        created = lifecycle_event("response.created", resp, 0)
        done_resp = {**resp, "status": "completed", "usage": zero_usage(), "completed_at": now}
        completed = lifecycle_event("response.completed", done_resp, 1)
        self._remember(run, rid, [], done_resp)
        del self._runs[run.id]
        return [
            Send(self._event_frame(created, req.lane)),
            Send(self._event_frame(completed, req.lane)),
            Finished(run.id, rid, "warmup", zero_usage()),
        ]

    # ------------------------------------------------------------ endings

    def _finish_stream(self, run: Run) -> list[Action]:
        stream = run.stream
        assert stream is not None and stream.outcome is not None
        rid = stream.response_id
        usage = (stream.response or {}).get("usage")
        out: list[Action] = []
        if stream.outcome in ("completed", "incomplete") and rid:
            output = [wire.dumps_kept(item) for item in stream.output]
            self._remember(run, rid, output, stream.response or {})
            if run.steers:
                out += self._after_steered_end(run, rid)
        else:
            self._evict_parent(run)
            out += self._steers_failed(run.steers, "response_not_active")
        return [
            *out,
            Finished(run.id, rid, stream.outcome, usage if isinstance(usage, dict) else None),
            *self._end(run),
        ]

    def _fail(self, run: Run, err: UpstreamError) -> list[Action]:
        """An upstream failure: tell the client in the protocol's terms, evict, move on.

        If the client already saw `response.created`, it is owed a terminal event, so a
        `response.failed` precedes the `error` (PROTOCOL 5.1, 8.4)."""
        out: list[Action] = []
        stream = run.stream
        seq: int | None = None
        if stream is not None and stream.response is not None:
            seq = self._next_seq(run)
            failed = {
                **stream.response,
                "status": "failed",
                "error": {"code": err.code or "server_error", "message": err.message},
            }
            ev = lifecycle_event("response.failed", failed, seq)
            out.append(Send(self._event_frame(ev, run.req.lane)))
            seq += 1
        out.append(Send(self._error_frame(err, run.req.lane, seq)))
        if stream is None or stream.response is None:
            out += self._steers_failed(run.applies, "successor_creation_failed")
        out += self._steers_failed(run.steers, "response_not_active")
        self._evict_parent(run)
        rid = stream.response_id if stream is not None else None
        out.append(Finished(run.id, rid, "failed"))
        return out + self._end(run)

    def _end(self, run: Run) -> list[Action]:
        run.state = RunState.DONE
        self._runs.pop(run.id, None)
        self._busy_lanes.discard(run.req.lane)
        return self._schedule() + self._maybe_close()

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

    def _remember(self, run: Run, rid: str, output: list[bytes], response: dict[str, Any]) -> None:
        # after a compaction the conversation continues from the compaction item, which
        # stands for everything before it: the parent's segments are no longer needed
        compacted = run.context is not None and run.context.compaction is not None
        parent = EMPTY if compacted else (run.parent or EMPTY)
        settings = {**run.req.settings, "store": run.req.store}
        added = Segment((*run.req.input_items, *output))
        entry = parent.child(rid, run.req.lane, added, settings)
        self.cache.put(entry)
        if run.req.store and self.store is not None:
            inputs = entry.item_count - len(output)
            self.store.put(StoredResponse(entry, wire.dumps(response), inputs), self.owner)

    def _evict_parent(self, run: Run) -> None:
        """PROTOCOL 4.2: a failed same-lane continuation evicts its parent; a fork keeps it."""
        if run.parent is not None and run.parent.lane == run.req.lane:
            self.cache.evict(run.parent.id)

    # ------------------------------------------------------------ steering (2.2)

    def _steer(self, msg: dict[str, Any]) -> list[Action]:
        target = msg.get("previous_response_id")
        run = self._streaming(target) if isinstance(target, str) else None
        lane = run.req.lane if run is not None else None
        try:
            req = parse_steer(msg)
            if run is None:
                known = self.cache.peek(req.target) is not None or req.target in self._waiting
                if known:
                    raise SteerRejected(
                        "response_already_completed", f"Response '{req.target}' has finished."
                    )
                if any(
                    r.stream and r.stream.response_id == req.target for r in self._runs.values()
                ):
                    raise SteerRejected(
                        "response_not_active",
                        f"Response '{req.target}' no longer accepts steering.",
                    )
                raise SteerRejected(
                    "response_not_found",
                    f"Response '{req.target}' is not running on this connection.",
                )
            settings = run.req.settings
            if (
                not self.limits.steering
                or settings.get("context_management")
                or settings.get("conversation")
            ):
                raise SteerRejected(
                    "steering_not_supported",
                    "This response cannot be steered (steering is off, or it uses compaction "
                    "or a conversation).",
                )
            waiting = sum(len(v) for v in self._waiting.values())
            cap = self.limits.max_pending_steers
            if len(run.steers) >= cap or waiting >= cap * 8:
                raise SteerRejected("too_many_pending_steers", "Too much steering input is queued.")
        except SteerRejected as err:
            ev = failed_event(
                err.code,
                err.message,
                target=target,
                raw_input=msg.get("input"),
                lane=lane,
                seq=self._next_seq(run) if run is not None else 0,
            )
            if run is not None:
                run.seq_offset += 1
            return [Send(wire.dumps(ev))]
        steer = Steer(self.new_id("steer"), req, run.req.lane)
        run.steers.append(steer)
        seq = self._next_seq(run)
        run.seq_offset += 1
        out: list[Action] = [Send(wire.dumps(accepted_event(steer, seq)))]
        if self._at_boundary(run):
            out += self._interrupt(run)
        return out

    def _streaming(self, response_id: str) -> Run | None:
        for run in self._runs.values():
            stream = run.stream
            if run.state is RunState.STREAMING and stream and stream.response_id == response_id:
                return run
        return None

    def _at_boundary(self, run: Run) -> bool:
        """Between output items, and no function call emitted (then the response must end
        for the client's tool output, and the steer waits: PROTOCOL 2.2 step 4)."""
        stream = run.stream
        if stream is None or stream.response is None or stream.open_items:
            return False
        return not any(
            isinstance(i, dict) and i.get("type") == "function_call"
            for i in stream.finished_items()
        )

    def _interrupt(self, run: Run) -> list[Action]:
        """Stop at the boundary: end `incomplete` (reason `steered`) with the finished items,
        cache that, and start the successor with the steer input."""
        stream = run.stream
        assert stream is not None and stream.response is not None and stream.response_id
        rid = stream.response_id
        items = stream.finished_items()
        resp = {
            **stream.response,
            "status": "incomplete",
            "incomplete_details": {"reason": "steered"},
            "output": items,
            "usage": None,
        }
        ev = lifecycle_event("response.incomplete", resp, self._next_seq(run))
        self._remember(run, rid, [wire.dumps(i) for i in items], resp)
        self._queue_successor(run, rid, run.steers)
        run.steers = []
        return [
            Send(self._event_frame(ev, run.req.lane)),
            CancelUpstream(run.id),
            Finished(run.id, rid, "steered"),
            *self._end(run),
        ]

    def _after_steered_end(self, run: Run, rid: str) -> list[Action]:
        """The response ended before a boundary. Client tool output needed: the steers wait
        (`response.steer.pending`, unless the client's create is already queued); otherwise
        the automatic successor starts."""
        assert run.stream is not None
        steers, run.steers = run.steers, []
        stubs = required_input(run.stream.output)
        if not stubs:
            self._queue_successor(run, rid, steers)
            return []
        self._waiting.setdefault(rid, []).extend(steers)
        queued = any(
            q.req.previous_response_id == rid and q.req.lane == run.req.lane for q in self._queue
        )
        if queued:
            return []
        out: list[Action] = []
        for steer in steers:
            out.append(Send(wire.dumps(pending_event(steer, stubs, self._next_seq(run)))))
            run.seq_offset += 1
        return out

    def _queue_successor(self, run: Run, rid: str, steers: list[Steer]) -> None:
        """The automatic successor inherits the parent's settings (PROTOCOL 2.2 step 3) and
        goes first in its lane."""
        body = {**run.req.body, "previous_response_id": rid, "input": []}
        body.pop("generate", None)
        req = parse_create(body)
        items = tuple(item for steer in steers for item in steer.request.items)
        successor = Run(next(self._ids), replace(req, input_items=items), applies=list(steers))
        if self.cache.pin(rid):
            successor.pinned = rid
        self._runs[successor.id] = successor
        self._queue.appendleft(successor)

    def _apply_waiting_steers(self, run: Run) -> None:
        """The client's explicit create after `response.steer.pending`: the queued steer
        input goes first, in submission order; the request keeps its own settings."""
        rid = run.req.previous_response_id
        steers = self._waiting.get(rid or "")
        if not steers or steers[0].lane != run.req.lane:
            return
        del self._waiting[rid or ""]
        items = tuple(item for steer in steers for item in steer.request.items)
        run.req = replace(run.req, input_items=items + run.req.input_items)
        run.applies = steers

    def _steers_failed(self, steers: list[Steer], code: str) -> list[Action]:
        message = {
            "successor_creation_failed": "Could not start the follow-up response; resend this "
            "input with response.create.",
            "response_not_active": "The response ended before the steering input was applied; "
            "resend it with response.create.",
        }[code]
        return [
            Send(
                wire.dumps(
                    failed_event(
                        code,
                        message,
                        target=s.request.target,
                        raw_input=s.request.raw_input,
                        steer_id=s.id,
                        lane=s.lane,
                    )
                )
            )
            for s in steers
        ]

    # ------------------------------------------------------------ cancel (extension)

    def _cancel(self, msg: dict[str, Any]) -> list[Action]:
        """`response.cancel` (a wsmode extension; PROTOCOL 2.4, 10.1): stop an in-flight
        response. It ends with `response.incomplete` whose status is `cancelled`; the cache
        is untouched (the parent stays, the cancelled response is not cached)."""
        lane: str | None = None
        try:
            lane = check_stream_id(msg.get("stream_id"))
            rid = msg.get("response_id")
            if rid is not None and not isinstance(rid, str):
                raise ClientError(
                    "'response_id' must be a string.", code="invalid_type", param="response_id"
                )
            if rid:
                run = self._streaming(rid)
            else:
                run = next(
                    (
                        r
                        for r in self._runs.values()
                        if r.req.lane == lane and r.state is not RunState.QUEUED
                    ),
                    None,
                )
            if run is None:
                what = f"Response '{rid}' is" if rid else "No response is"
                raise ClientError(
                    f"{what} not in progress on this connection.",
                    code="response_not_found",
                    param="response_id" if rid else None,
                )
        except ClientError as err:
            return self._reject(err, lane if err.code != "invalid_stream_id" else None)
        return self._cancel_run(run)

    def _cancel_run(self, run: Run) -> list[Action]:
        stream = run.stream
        if stream is not None and stream.response is not None:
            resp = {**stream.response, "output": stream.finished_items()}
            seq = self._next_seq(run)
        else:  # nothing was sent yet for it: the terminal event is all the client sees
            resp = response_object(
                response_id=self.new_id("resp"),
                request=run.req.body,
                status="cancelled",
                created_at=int(self.clock()),
            )
            seq = 0
        resp.update(status="cancelled", incomplete_details={"reason": "cancelled"}, usage=None)
        ev = lifecycle_event("response.incomplete", resp, seq)
        return [
            CancelUpstream(run.id),
            Send(self._event_frame(ev, run.req.lane)),
            *self._steers_failed(run.steers, "response_not_active"),
            *self._steers_failed(
                run.applies if stream is None or stream.response is None else [],
                "successor_creation_failed",
            ),
            Finished(run.id, resp["id"], "cancelled"),
            *self._end(run),
        ]

    # ------------------------------------------------------------ frames

    def _reject(self, err: ClientError, lane: str | None = None) -> list[Action]:
        return [Send(self._error_frame(err, lane))]

    def _error_frame(self, err: ProxyError, lane: str | None, seq: int | None = None) -> bytes:
        return wire.dumps(err.event(stream_id=lane, sequence_number=seq))

    def _event_frame(self, ev: dict[str, Any], lane: str | None) -> bytes:
        if lane is not None:
            ev["stream_id"] = lane
        return wire.dumps(ev)

    def _lane_frame(self, run: Run, frame: bytes) -> bytes:
        if run.seq_offset:  # the proxy inserted steer events: shift the upstream's numbers
            ev = wire.loads(frame)
            if isinstance(ev.get("sequence_number"), int):
                ev["sequence_number"] += run.seq_offset
            frame = wire.dumps(ev)
        lane = run.req.lane
        if lane is None:
            return frame
        return wire.with_field(frame, _STREAM_ID_KEY, wire.dumps(lane))

    def _next_seq(self, run: Run) -> int:
        """The sequence number of the next event the proxy writes into `run`'s stream."""
        assert run.stream is not None
        return run.stream.last_seq + run.seq_offset + 1


__all__ = [
    "Action",
    "CancelUpstream",
    "Close",
    "Finished",
    "Send",
    "Session",
    "SessionLimits",
    "StartUpstream",
    "UpstreamPolicy",
    "invalid",
]

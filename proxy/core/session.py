"""One WebSocket connection's protocol state: lanes, FIFO, warmups, caching, failures.

Theory of operation
-------------------
The adapter feeds happenings in (`client_message`, `upstream_event`, `upstream_failed`,
`upstream_eof`, `client_gone`) and executes the actions that come back (`Send`,
`StartUpstream`, `CancelUpstream`, `Close`). Nothing here waits or touches a socket.

A `response.create` is validated on arrival (PROTOCOL 2.1) and becomes a `Run` queued on its
lane. Lanes are FIFO and never overlap; different lanes run concurrently up to
`max_active` runs per connection, further creates wait (4.3). A run starts when it reaches
the head of its lane and a slot is free; only then is `previous_response_id` resolved,
because the parent may be the response that ran just before it. A parent that a queued run
refers to is pinned in the cache until the run starts (4.4).

Run states (transitions only in `_start`, `_on_started`, `_finish`):

    QUEUED --start--> UPSTREAM --first event--> STREAMING --terminal--> DONE
       |                 |  (native fallback:                 |
       |                 |   back to UPSTREAM once)           |
       +--warmup / not found / cancelled -------------------------------> DONE

On a terminal `completed` or `incomplete` the run's whole item list (parent items, new input,
output) is cached under the response id. On any failure of a continuation the parent is
evicted when it belongs to the same lane, and kept for a cross-lane fork (4.2). Errors the
client caused never change the cache.
"""

from __future__ import annotations

import enum
import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from proxy.core import wire
from proxy.core.conversation import EMPTY, CachedResponse, ResponseCache, Segment
from proxy.core.dialects import Dialect, StreamTranslator
from proxy.core.errors import (
    ClientError,
    ProxyError,
    UpstreamError,
    invalid,
    previous_response_not_found,
)
from proxy.core.events import lifecycle_event, response_object, zero_usage
from proxy.core.request import CreateRequest, check_stream_id, parse_create
from proxy.core.sse import SSEEvent

_STREAM_ID_KEY = b'"stream_id"'


# ---------------------------------------------------------------- actions


@dataclass(frozen=True, slots=True)
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


Action = Send | StartUpstream | CancelUpstream | Close | Finished


# ---------------------------------------------------------------- state


class RunState(enum.Enum):
    QUEUED = "queued"
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


@dataclass(frozen=True, slots=True)
class SessionLimits:
    max_active: int = 16  # in-flight responses per connection (PROTOCOL 4.3)
    max_lanes: int = 32  # distinct named stream_ids per connection
    max_queued: int = 256  # creates waiting per connection


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
    new_id: Callable[[str], str] = lambda prefix: prefix

    def __post_init__(self) -> None:
        self._ids = itertools.count(1)
        self._queue: deque[Run] = deque()
        self._runs: dict[int, Run] = {}  # every run not yet DONE
        self._busy_lanes: set[str | None] = set()
        self._lanes: set[str] = set()  # named lanes ever used on this connection
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
            return self._create(msg)
        if kind == "response.steer":
            return self._steer(msg)
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
        return out

    def upstream_failed(self, run_id: int, err: UpstreamError) -> list[Action]:
        """The upstream request failed: an HTTP error status, a connect error, a stall, a cut."""
        run = self._runs.get(run_id)
        if run is None:
            return []
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
            if r.state in (RunState.UPSTREAM, RunState.STREAMING)
        ]
        self._runs.clear()
        self._queue.clear()
        self._busy_lanes.clear()
        self.cache.clear()
        return out

    def is_active(self, run_id: int) -> bool:
        return run_id in self._runs

    @property
    def active_count(self) -> int:
        return sum(1 for r in self._runs.values() if r.state is not RunState.QUEUED)

    @property
    def queued_count(self) -> int:
        return len(self._queue)

    # ------------------------------------------------------------ creates

    def _create(self, msg: dict[str, Any]) -> list[Action]:
        lane: str | None = None
        try:
            lane = check_stream_id(msg.get("stream_id"))
            new_lane = lane is not None and lane not in self._lanes
            if new_lane and len(self._lanes) >= self.limits.max_lanes:
                raise ClientError(
                    f"This connection already uses {self.limits.max_lanes} stream_ids.",
                    code="websocket_stream_limit_reached",
                    param="stream_id",
                )
            req = parse_create(msg)
            if len(self._queue) >= self.limits.max_queued:
                raise ClientError(
                    f"Too many queued requests on this connection (limit "
                    f"{self.limits.max_queued}); wait for responses to finish.",
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

    def _steer(self, msg: dict[str, Any]) -> list[Action]:
        ev = {
            "type": "response.steer.failed",
            "steer": {"previous_response_id": msg.get("previous_response_id")},
            "error": {
                "type": "invalid_request_error",
                "code": "steering_not_supported",
                "message": "Steering is not supported by this server.",
            },
        }
        return [Send(wire.dumps(ev))]

    def _schedule(self) -> list[Action]:
        """Start queued runs whose lane is idle, oldest first, while slots last.

        Starting a run can finish it at once (a warmup, a missing parent), which frees its
        lane again, so the scan restarts after every start until nothing more can start."""
        out: list[Action] = []
        while self._queue and self.active_count < self.limits.max_active:
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
            run.parent = self.cache.get(req.previous_response_id)
            if run.parent is None:
                del self._runs[run.id]
                err = previous_response_not_found(req.previous_response_id)
                return [
                    Send(self._error_frame(err, req.lane)),
                    Finished(run.id, None, "rejected"),
                ]
        if not req.generate:
            return self._warmup(run)
        self._busy_lanes.add(req.lane)
        run.native = (
            self.policy.native_previous_response_id
            and run.parent is not None
            and run.parent.settings.get("store") is not False
        )
        return [self._start_upstream(run)]

    def _start_upstream(self, run: Run) -> StartUpstream:
        req, dialect = run.req, self.policy.dialect
        patch = {"previous_response_id": req.previous_response_id, "store": req.store}
        run.stream = dialect.translator(patch)
        run.state = RunState.UPSTREAM
        if run.native:
            assert run.parent is not None
            extra = {
                "stream": True,
                "store": req.store,
                "previous_response_id": run.parent.id,
            }
            items = list(req.input_items)
        else:
            extra = {"stream": True, "store": self.policy.store}
            parent = run.parent or EMPTY
            items = [*parent.items(), *req.input_items]
        return StartUpstream(run.id, dialect.body(req.settings, extra, items), dialect.path)

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
        self._remember(run, rid, [])
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
        if stream.outcome in ("completed", "incomplete") and rid:
            self._remember(run, rid, [wire.dumps_kept(item) for item in stream.output])
        else:
            self._evict_parent(run)
        return [
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
            seq = stream.last_seq + 1
            failed = {
                **stream.response,
                "status": "failed",
                "error": {"code": err.code or "server_error", "message": err.message},
            }
            ev = lifecycle_event("response.failed", failed, seq)
            out.append(Send(self._event_frame(ev, run.req.lane)))
            seq += 1
        out.append(Send(self._error_frame(err, run.req.lane, seq)))
        self._evict_parent(run)
        rid = stream.response_id if stream is not None else None
        out.append(Finished(run.id, rid, "failed"))
        return out + self._end(run)

    def _end(self, run: Run) -> list[Action]:
        run.state = RunState.DONE
        self._runs.pop(run.id, None)
        self._busy_lanes.discard(run.req.lane)
        return self._schedule()

    def _remember(self, run: Run, rid: str, output: list[bytes]) -> None:
        parent = run.parent or EMPTY
        settings = {**run.req.settings, "store": run.req.store}
        added = Segment((*run.req.input_items, *output))
        self.cache.put(parent.child(rid, run.req.lane, added, settings))

    def _evict_parent(self, run: Run) -> None:
        """PROTOCOL 4.2: a failed same-lane continuation evicts its parent; a fork keeps it."""
        if run.parent is not None and run.parent.lane == run.req.lane:
            self.cache.evict(run.parent.id)

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
        lane = run.req.lane
        if lane is None:
            return frame
        return wire.with_field(frame, _STREAM_ID_KEY, wire.dumps(lane))


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

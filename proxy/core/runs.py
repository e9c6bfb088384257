"""A run (one `response.create`, or a steer's automatic successor) and its state machine.

Theory of operation
-------------------
Every run moves through the states below, and only along the edges of `TRANSITIONS`; the
session moves a run with `Run.move`, which raises `IllegalTransition` (a bug in the proxy,
never a client's mistake) for any other edge. `DONE` has no way out: a run that ended can
never be streamed into, failed or finished a second time.

    QUEUED --start--> UPSTREAM --first event--> STREAMING --terminal--> DONE
       |    |            |  (native fallback or auto's   |  (a steer at an item
       |    |            |   switch to Chat: UPSTREAM     |   boundary, a cancel,
       |    |            |   again, before any event)     |   a failure)
       |    +--> COMPACTING --SummaryDone--> UPSTREAM     +-------------------> DONE
       +--warmup / not found / rejected / client gone -------------------> DONE

    QUEUED --start--> LOADING --StoredLoaded--> UPSTREAM, COMPACTING, or DONE

    QUEUED (a warmup), COMPACTING (a compaction trigger's item), STREAMING (a terminal
    event, a steer's boundary) --the response is to be stored--> SAVING --StoredSaved--> DONE

LOADING: the parent is not in the connection's cache and there is a response store: the
executor reads it (`LoadStored`) while the run holds its lane and slot, and hands the answer
back (`StoredLoaded`: found, not found, or the store unavailable, which end it).

SAVING: the response ended and is to be stored: the executor writes it (`SaveStored`), and
only the answer (`StoredSaved`) releases the rest of the ending the run holds (`Run.after_save`:
its terminal event, its `Finished`), so that a client continuing elsewhere right after the
terminal event finds the response. An id the store holds already fails the run instead.

Every edge into DONE is taken by the session's single end (`Session._end`), which also
settles the run's steers and reports the run's `Outcome` (proxy/core/actions.py).

A run also holds what reads its upstream events: the SSE decoder its raw chunks go through
(`Run.decoder`) and the dialect's translator behind it (`Run.stream`).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import wire
from .actions import RunCreated
from .conversation import CachedResponse
from .dialects import StreamTranslator
from .errors import ClientError
from .request import CreateRequest
from .sse import SSEDecoder

if TYPE_CHECKING:
    from .actions import Action
    from .context.manager import Prepared
    from .tokens.dialect import TokenStream


_STREAM_ID_KEY = b'"stream_id"'


class RunState(enum.Enum):
    QUEUED = "queued"  # waiting for its lane and a free slot
    LOADING = "loading"  # its parent is being read from a remote store (LoadStored)
    COMPACTING = "compacting"  # the summarising request of a compaction is running
    UPSTREAM = "upstream"  # request sent, no event yet
    STREAMING = "streaming"  # the upstream's events are arriving
    SAVING = "saving"  # ended; its write to the response store is awaited (SaveStored)
    DONE = "done"

    # members are singletons compared by identity: hash them so too (Enum's own hash is a
    # Python function, and a state is looked up in a set for every upstream event)
    __hash__ = object.__hash__


_S = RunState
# a run that reads no more upstream events; one whose work is in flight
ENDED = frozenset({_S.SAVING, _S.DONE})
IN_FLIGHT = frozenset({_S.LOADING, _S.COMPACTING, _S.UPSTREAM, _S.STREAMING, _S.SAVING})
TRANSITIONS: dict[RunState, frozenset[RunState]] = {
    _S.QUEUED: frozenset({_S.LOADING, _S.COMPACTING, _S.UPSTREAM, _S.SAVING, _S.DONE}),
    _S.LOADING: frozenset({_S.COMPACTING, _S.UPSTREAM, _S.SAVING, _S.DONE}),
    _S.COMPACTING: frozenset({_S.UPSTREAM, _S.SAVING, _S.DONE}),
    _S.UPSTREAM: frozenset({_S.UPSTREAM, _S.STREAMING, _S.DONE}),
    _S.STREAMING: frozenset({_S.SAVING, _S.DONE}),
    _S.SAVING: frozenset({_S.DONE}),
    _S.DONE: frozenset(),
}


class IllegalTransition(RuntimeError):
    """The session tried to move a run along an edge `TRANSITIONS` does not have: a bug."""

    def __init__(self, run_id: int, old: RunState, new: RunState) -> None:
        super().__init__(f"run {run_id}: illegal transition {old.name} -> {new.name}")
        self.run_id = run_id
        self.old = old
        self.new = new


@dataclass(frozen=True, slots=True)
class SteerRequest:
    """A validated `response.steer` (core/steering.py)."""

    target: str  # the response being steered
    items: tuple[bytes, ...]  # the input as user message items, serialised once
    raw_input: Any  # as the client sent it, echoed by response.steer.failed


@dataclass(eq=False)
class Steer:
    """One accepted steer (core/steering.py): its id, its input, and its lane."""

    id: str
    request: SteerRequest
    lane: str | None


@dataclass(eq=False)
class Run:
    id: int
    req: CreateRequest
    state: RunState = RunState.QUEUED
    pinned: str | None = None  # parent id pinned in the cache while queued
    parent: CachedResponse | None = None
    native: bool = False  # sent with the upstream's own previous_response_id
    chain: str | None = None  # its chain's key (core/routing.py), set when it starts
    replica: str | None = None  # the upstream replica that served it (`Routed`)
    stream: StreamTranslator | None = None
    tokens: TokenStream | None = None  # the token path's stream (also `stream`, or inside it)
    steers: list[Steer] = field(default_factory=list)  # accepted, not yet applied
    applies: list[Steer] = field(default_factory=list)  # steers whose input this run carries
    moderation: Collection[str] | None = None  # new text the runner moderates (core/guards.py)
    seq_offset: int = 0  # events the proxy inserted into this response's stream
    context: Prepared | None = None  # the prepared upstream input (ContextManager)
    response_id: str | None = None  # the upstream's id for it, once seen and found unused
    decoder: SSEDecoder | None = None  # its upstream's event stream, set with `stream`
    # for a turn the context manager did not prepare: the proxy's usage estimate, for an
    # upstream that reports none (a prepared turn's ManagedStream fills it in instead)
    estimate_usage: Callable[[list[Any]], dict[str, Any]] | None = None
    # SAVING: the rest of its ending, released by the store's answer (the theory above)
    after_save: Callable[[], list[Action]] | None = None

    def created(self) -> RunCreated:
        """The action that says it exists: its lane, parent and new input (for the console)."""
        req = self.req
        metadata = req.body.get("client_metadata")
        return RunCreated(
            self.id,
            req.lane,
            req.previous_response_id,
            req.input_items,
            req.model,
            metadata if isinstance(metadata, dict) else None,
        )

    def move(self, new: RunState) -> None:
        """The one way a run changes state (called once per change, never per event)."""
        if new not in TRANSITIONS[self.state]:
            raise IllegalTransition(self.id, self.state, new)
        self.state = new

    @property
    def announced(self) -> bool:
        """The client saw this run's `response.created`."""
        return self.stream is not None and self.stream.response is not None

    def next_seq(self) -> int:
        """The sequence number of the next event the proxy writes into this run's stream."""
        assert self.stream is not None
        return self.stream.last_seq + self.seq_offset + 1

    def lane_frame(self, frame: bytes) -> bytes:
        """An upstream event as the client gets it: on the run's lane, its number shifted
        past the events the proxy inserted (steer events, docs/protocol.md "response.steer"). Per
        event: cheap when there is no lane and no offset."""
        if self.seq_offset:
            ev = wire.loads(frame)
            if isinstance(ev.get("sequence_number"), int):
                ev["sequence_number"] += self.seq_offset
            frame = wire.dumps(ev)
        lane = self.req.lane
        if lane is None:
            return frame
        return wire.with_field(frame, _STREAM_ID_KEY, wire.dumps(lane))


def streaming(runs: Iterable[Run], response_id: str) -> Run | None:
    """The STREAMING run whose response is `response_id` (what steer and cancel target)."""
    for run in runs:
        stream = run.stream
        if run.state is RunState.STREAMING and stream and stream.response_id == response_id:
            return run
    return None


def cancel_target(runs: Iterable[Run], response_id: object, lane: str | None) -> Run:
    """The run a `response.cancel` names (docs/protocol.md "response.cancel"): the streaming
    response `response_id`, or without one the run in flight on `lane`. Raises ClientError."""
    if response_id is not None and not isinstance(response_id, str):
        raise ClientError(
            "'response_id' must be a string.", code="invalid_type", param="response_id"
        )
    if response_id:
        run = streaming(runs, response_id)
    else:
        run = next((r for r in runs if r.req.lane == lane and r.state is not RunState.QUEUED), None)
    if run is None:
        what = f"Response '{response_id}' is" if response_id else "No response is"
        raise ClientError(
            f"{what} not in progress on this connection.",
            code="response_not_found",
            param="response_id" if response_id else None,
        )
    return run


__all__ = [
    "ENDED",
    "IN_FLIGHT",
    "TRANSITIONS",
    "IllegalTransition",
    "Run",
    "RunState",
    "Steer",
    "SteerRequest",
    "cancel_target",
    "streaming",
]

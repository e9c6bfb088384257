"""Driving a `Session` (proxy/core/session.py) without I/O: a session with a fixed clock and
ids, client frames in, upstream SSE events in, and the actions that come back sorted by kind.

Shared by the unit tests of the session, steering and context windows.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import orjson
from wsmode.core.actions import (
    Action,
    Finished,
    LoadStored,
    SaveStored,
    StartUpstream,
    Summarise,
    frames_of,
)
from wsmode.core.context.manager import ContextManager, ContextSettings
from wsmode.core.context.sealing import Sealer
from wsmode.core.context.settings import TokensSettings
from wsmode.core.conversation import CacheBudget, ResponseCache
from wsmode.core.dialects.responses import ResponsesDialect
from wsmode.core.errors import ProxyError, UpstreamError
from wsmode.core.events import (
    ClientMessage,
    InputRefused,
    Routed,
    StoredLoaded,
    StoredSaved,
    SummaryDone,
    SummaryFailed,
    UpstreamChunk,
)
from wsmode.core.policy import SessionLimits, UpstreamPolicy
from wsmode.core.session import Session
from wsmode.core.sse import SSEEvent
from wsmode.core.store import StoredResponse, WriteResult
from wsmode.sim.events import response_events
from wsmode.sim.model import plan

HUGE = 1 << 40
WS_ONLY = {"type", "stream_id", "generate", "client_metadata", "background"}


def make_session(
    *,
    native: bool = False,
    store: bool = False,
    limits: SessionLimits | None = None,
    max_entries: int = 1000,
) -> Session:
    budget = CacheBudget(HUGE, HUGE)
    ids = itertools.count(1)
    return Session(
        cache=ResponseCache(budget, max_entries, HUGE),
        policy=UpstreamPolicy(ResponsesDialect(), store=store, native_previous_response_id=native),
        limits=limits or SessionLimits(),
        clock=lambda: 1_700_000_000.0,
        new_id=lambda prefix: f"{prefix}_warm{next(ids)}",
    )


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": text}


def create(s: Session, **fields: Any) -> list[Action]:
    msg = {"type": "response.create", "model": "m", "input": [user("hi")], **fields}
    return s.handle(ClientMessage(orjson.dumps(msg)))


def sends(actions: Iterable[Action]) -> list[dict[str, Any]]:
    return [orjson.loads(frame) for frame in frames_of(actions)]


def starts(actions: Iterable[Action]) -> list[StartUpstream]:
    return [a for a in actions if isinstance(a, StartUpstream)]


def finished(actions: Iterable[Action]) -> list[Finished]:
    return [a for a in actions if isinstance(a, Finished)]


def the_start(actions: list[Action]) -> StartUpstream:
    found = starts(actions)
    assert len(found) == 1, actions
    return found[0]


def body_of(start: StartUpstream) -> dict[str, Any]:
    return orjson.loads(b"".join(start.body))


def sse(ev: dict[str, Any], *, named: bool = True) -> SSEEvent:
    return SSEEvent(ev["type"] if named else None, orjson.dumps(ev))


def encoded(event: SSEEvent) -> bytes:
    """One SSE event on the wire, as an upstream sends it."""
    head = b"event: " + event.event.encode() + b"\n" if event.event is not None else b""
    lines = b"".join(b"data: " + line + b"\n" for line in event.data.split(b"\n"))
    return head + lines + b"\n"


def event_in(s: Session, run_id: int, event: SSEEvent) -> list[Action]:
    """One upstream event for a run, arriving as a chunk of its own; a write to the store it
    asks for is answered as stored, as the executor would (the answer's actions follow)."""
    return saved(s, s.handle(UpstreamChunk(run_id, encoded(event))))


def saved(
    s: Session, actions: list[Action], result: WriteResult = WriteResult.STORED
) -> list[Action]:
    """`actions`, with each `SaveStored` among them answered by `result`."""
    out: list[Action] = []
    for action in actions:
        out.append(action)
        if isinstance(action, SaveStored):
            out += saved(s, s.handle(StoredSaved(action, result)), result)
    return out


def is_active(s: Session, run_id: int) -> bool:
    """The session still has the run (queued or in flight)."""
    return run_id in s._runs


def summary_done(s: Session, run_id: int, result: Any) -> list[Action]:
    return s.handle(SummaryDone(Summarise(run_id, [], "/responses"), result))


def summary_failed(s: Session, run_id: int, err: UpstreamError) -> list[Action]:
    return s.handle(SummaryFailed(Summarise(run_id, [], "/responses"), err))


def stored_loaded(
    s: Session, run_id: int, stored: StoredResponse | None, *, unavailable: bool = False
) -> list[Action]:
    run = s._runs.get(run_id)
    rid = (run.req.previous_response_id if run is not None else None) or ""
    return saved(s, s.handle(StoredLoaded(LoadStored(run_id, rid, s.owner), stored, unavailable)))


def input_refused(s: Session, run_id: int, err: ProxyError) -> list[Action]:
    return s.handle(InputRefused(StartUpstream(run_id, [], "/responses"), err))


def routed(s: Session, run_id: int, replica: str) -> list[Action]:
    return s.handle(Routed(StartUpstream(run_id, [], "/responses"), replica))


def sim_events(upstream_body: dict[str, Any], tokens: int = 3) -> list[dict[str, Any]]:
    """The simulated model's full, spec-complete event list for one upstream request."""
    p = plan(upstream_body, seed=1, output_tokens=tokens, tool_calls_per_turn=0)
    return list(response_events(upstream_body, p))


def feed(s: Session, run_id: int, events: Iterable[dict[str, Any]]) -> list[Action]:
    out: list[Action] = []
    for ev in events:
        out += event_in(s, run_id, sse(ev))
    return out


def complete(s: Session, start: StartUpstream) -> tuple[str, list[Action]]:
    """Run the simulated model for `start` to completion; returns the response id."""
    events = sim_events(body_of(start))
    return events[0]["response"]["id"], feed(s, start.run_id, events)


# hand-written upstream events for failure paths


def created(rid: str, seq: int = 0) -> dict[str, Any]:
    resp = {"id": rid, "object": "response", "status": "in_progress", "output": []}
    return {"type": "response.created", "sequence_number": seq, "response": resp}


def delta(seq: int, text: str = "x") -> dict[str, Any]:
    return {
        "type": "response.output_text.delta",
        "sequence_number": seq,
        "item_id": "msg_1",
        "output_index": 0,
        "content_index": 0,
        "delta": text,
    }


def item_done(seq: int, item: dict[str, Any], index: int = 0) -> dict[str, Any]:
    return {
        "type": "response.output_item.done",
        "sequence_number": seq,
        "output_index": index,
        "item": item,
    }


def terminal(
    rid: str, seq: int, output: list[Any], kind: str = "response.completed"
) -> dict[str, Any]:
    status = kind.removeprefix("response.")
    resp = {"id": rid, "object": "response", "status": status, "output": output}
    return {"type": kind, "sequence_number": seq, "response": resp}


def assistant(text: str, item_id: str = "msg_1") -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def quick(s: Session, start: StartUpstream, rid: str, text: str = "ok") -> list[Action]:
    """A minimal three-event upstream response."""
    return feed(
        s, start.run_id, [created(rid), item_done(1, assistant(text)), terminal(rid, 2, [])]
    )


# ------------------------------------------------------------------ context windows


def adjusted(settings: ContextSettings, **kw: Any) -> ContextSettings:
    """`settings` with each key of `kw` changed in the section that has it ([tokens],
    [compaction], or the window itself)."""
    tokens = {f.name for f in dataclasses.fields(settings.tokens)}
    compaction = {f.name for f in dataclasses.fields(settings.compaction)}
    return replace(
        settings,
        tokens=replace(settings.tokens, **{k: v for k, v in kw.items() if k in tokens}),
        compaction=replace(settings.compaction, **{k: v for k, v in kw.items() if k in compaction}),
        **{k: v for k, v in kw.items() if k not in tokens | compaction},
    )


def context_settings(**kw: Any) -> ContextSettings:
    """One byte a token and no tokenizer, unless `kw` says otherwise."""
    base = ContextSettings(TokensSettings(tokenize_url="", bytes_per_token=1.0))
    return adjusted(base, **kw)


# ------------------------------------------------------------------ steering


def added(seq: int, index: int, kind: str = "message") -> dict[str, Any]:
    item = {"id": f"i{index}", "type": kind}
    return {
        "type": "response.output_item.added",
        "sequence_number": seq,
        "output_index": index,
        "item": item,
    }


def done(seq: int, index: int, item: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "response.output_item.done",
        "sequence_number": seq,
        "output_index": index,
        "item": item,
    }


MSG = {
    "id": "i0",
    "type": "message",
    "role": "assistant",
    "content": [{"type": "output_text", "text": "a"}],
}
CALL = {"id": "i0", "type": "function_call", "call_id": "c1", "name": "run", "arguments": "{}"}


def steer(target: str, input: Any = "more") -> bytes:
    return orjson.dumps({"type": "response.steer", "previous_response_id": target, "input": input})


# ---------------------------------------------------------- a session with a context manager


def make_context_session(
    owner: str = "owner-a", *, policy: UpstreamPolicy | None = None, **settings: Any
) -> Session:
    ids = itertools.count(1)
    ctx = ContextManager(context_settings(**settings), Sealer(bytes(range(32))))
    return Session(
        cache=ResponseCache(CacheBudget(HUGE, HUGE), 1000, HUGE),
        policy=policy or UpstreamPolicy(ResponsesDialect()),
        clock=lambda: 1_700_000_000.0,
        new_id=lambda prefix: f"{prefix}_{next(ids)}",
        owner=owner,
        context=ctx,
    )


def send_create(s: Session, **fields: Any) -> list[Action]:
    msg = {"type": "response.create", "model": "m", "store": False, **fields}
    return s.handle(ClientMessage(orjson.dumps(msg)))

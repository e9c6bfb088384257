"""A run's life from its start to its end: the per-run half of the session.

`RunDriver` is the base of `Session` (proxy/core/session.py): the session keeps dispatch, the
connection's life and the lane scheduler; this module holds what happens to one run once the
scheduler starts it. In order:

- **start**: the parent resolved (the connection's cache, else a `LoadStored` the run waits
  on in LOADING), the new input checked (tool outputs against the call index, the input
  guards), then a warmup, a compaction (proxy/core/compacting.py) or the upstream request
  (proxy/core/plan.py), its events read by the run's SSE decoder and the dialect's translator;
- **the upstream's events**: one `UpstreamChunk` at a time, every event of it up to the run's
  end (or the token path's early end); a reused response id fails it; a steer stops it at an
  item boundary;
- **endings**, each in one place: the terminal event (`_finish_stream`), a failure (`_fail`),
  a refusal before the upstream was asked (`_refuse`), a steer's boundary (`_interrupt`); each
  waits in SAVING for the store's answer when the response is stored (`_after`, `_saved`),
  and all end in `_end`. The states and their legal moves are proxy/core/runs.py's table.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from . import frames, wire
from .actions import (
    Action,
    CancelUpstream,
    CountTokens,
    Finished,
    LoadStored,
    Outcome,
    Relay,
    SaveStored,
    Send,
)
from .admission import Admission
from .api_objects import failed_error, lifecycle_event, response_object, zero_usage
from .calls import CHECKED_OUTPUTS, orphan_output
from .compacting import Compacting
from .context.compaction import has_trigger
from .context.managed_stream import ManagedStream
from .context.manager import ContextManager
from .conversation import EMPTY, ResponseCache
from .errors import (
    ClientError,
    ProxyError,
    UpstreamError,
    no_tool_call,
    previous_response_not_found,
    response_failure,
    reused_response_id,
    stored_response_unavailable,
)
from .events import StoredLoaded, StoredSaved
from .guards import Guards, Unseen
from .plan import Planner
from .policy import UpstreamPolicy
from .recorder import Recorder
from .routing import cached_tokens
from .runs import ENDED, Run, RunState
from .sse import SSEDecoder
from .steering import Steering, at_boundary, steered_response
from .store import WriteResult

# outcomes whose run delivered what it carried (a steer's input included)
_DELIVERED = frozenset({Outcome.COMPLETED, Outcome.INCOMPLETE, Outcome.WARMUP, Outcome.STEERED})


class RunDriver:
    """The per-run steps of a `Session`; the parts below are the session's."""

    cache: ResponseCache
    policy: UpstreamPolicy
    clock: Callable[[], float]
    new_id: Callable[[str], str]
    owner: str
    context: ContextManager | None
    guards: Guards | None
    stores: bool
    max_event_bytes: int
    admission: Admission
    planner: Planner
    recorder: Recorder
    steering: Steering
    compacting: Compacting
    _runs: dict[int, Run]
    _queue: deque[Run]
    _busy_lanes: set[str | None]
    _queue_successor: Callable[[Run], list[Action]]

    # ------------------------------------------------------------ start

    def _resolve_parent(self, run: Run) -> list[Action]:
        self.admission.discharge(run.id)
        req = run.req
        self._busy_lanes.add(req.lane)  # until its end (a run that ends now frees it again)
        if run.pinned is not None:
            self.cache.unpin(run.pinned)
            run.pinned = None
        if req.previous_response_id:
            run.parent = self.cache.get(req.previous_response_id)
            if run.parent is None and self.stores:
                # read it from the store; the run holds its lane and slot meanwhile
                run.move(RunState.LOADING)
                return [LoadStored(run.id, req.previous_response_id, self.owner)]
            if run.parent is None:
                return self._refuse(run, previous_response_not_found(req.previous_response_id))
        return self._run_with_parent(run)

    def _parent_loaded(self, ev: StoredLoaded) -> list[Action]:
        """The answer to a `LoadStored`: the stored parent, or None when it is not stored for
        this credential or the store could not answer in time; both end the run with the
        documented `previous_response_not_found`."""
        run = self._runs.get(ev.request.run_id)
        if run is None or run.state is not RunState.LOADING:
            return []  # cancelled, or the client left, while the store was read
        rid = ev.request.response_id
        if ev.stored is None:
            err = stored_response_unavailable(rid) if ev.unavailable else None
            return self._refuse(run, err or previous_response_not_found(rid))
        run.parent = ev.stored.entry
        return self._run_with_parent(run)

    def _run_with_parent(self, run: Run) -> list[Action]:
        """A run whose parent (if it names one) is found: check, then start it."""
        if run.parent is not None and self.steering.waiting:
            self.steering.apply_waiting(run)
        req = run.req
        run.chain = self.planner.chain_of(run)
        refused = self._check_input(run)
        if refused is not None:  # a failed continuation: the parent goes
            self.recorder.evict_parent(run)
            return self._refuse(run, refused, refused=refused.code or "no_tool_call")
        if not req.generate:
            return self._warmup(run)
        if self.context is not None and not req.plain and has_trigger(req.input_items):
            return self.compacting.trigger(run)
        run.native = self.planner.can_go_native(run, self.policy)
        out: list[Action] = []
        context = self.context
        if context is not None and self._managed(run):
            try:
                run.context = context.prepare(run.parent, req, self.owner)
            except ClientError as err:  # the window is exceeded, ...
                return self._refuse(run, err)
            if run.context.jobs:
                out.append(CountTokens(run.context.jobs))
            run.native = run.native and context.native_ok(run.context)
        if run.context is not None and run.context.cut is not None:
            return [*out, *self.compacting.summarise_first(run)]
        return [*out, *self._send_upstream(run)]

    def _managed(self, run: Run) -> bool:
        """The context manager prepares the run's input when it could change what is sent:
        a window to fit, a compaction asked for, compaction items to render. A native run so
        prepared is sent in full unless nothing changed (`ContextManager.native_ok`)."""
        context = self.context
        if context is None:
            return False
        if run.native:
            return context.manages(run.req)
        compacted = run.parent is not None and run.parent.compactions
        return not run.req.plain or context.settings.context_window > 0 or compacted

    def _send_upstream(self, run: Run) -> list[Action]:
        """The run's upstream request, or the dialect's refusal (chat: strict_tools, ...)."""
        try:
            start = self.planner.request(run, self.policy)
        except ClientError as err:
            return self._refuse(run, err)
        run.decoder = SSEDecoder(self.max_event_bytes)
        run.move(RunState.UPSTREAM)  # again after a native fallback or auto's switch
        return [start]

    def _check_input(self, run: Run) -> ClientError | None:
        """Checks of the new input: every function or custom tool call output answers a call
        of the conversation or of the input before it (OpenAI's 400), from the parent's call
        index; then the input guards. The cost is the new input's, not the history's."""
        parent = run.parent or EMPTY
        items, opaque = self.recorder.visible(run.req.input_items)
        if not opaque and not parent.opaque:
            found = orphan_output(parent.calls, items)
            if found is not None:
                return no_tool_call(CHECKED_OUTPUTS[found[1]], found[2])
        if self.guards is not None:
            refusal, run.moderation = self.guards.run(run.req.input_items)
            if refusal is None and parent.unmoderated and self.guards.moderation:
                run.moderation = Unseen(run.moderation or (), parent.unmoderated)
            return refusal
        return None

    def _input_refused(self, run_id: int, err: ProxyError) -> list[Action]:
        """The moderation hook refused the run's new input (a `ClientError`), or could not
        answer and fails closed: before any upstream request, so no event was sent."""
        run = self._runs.get(run_id)
        if run is None:
            return []
        self.recorder.evict_parent(run)  # a failed continuation
        outcome = Outcome.REJECTED if isinstance(err, ClientError) else Outcome.FAILED
        out: list[Action] = [frames.error(err, run.req.lane)]
        return out + self._end(run, outcome, refused=err.code or "moderation", error=err)

    def _warmup(self, run: Run) -> list[Action]:
        """`generate: false` (docs/protocol.md "response.create"): created + completed, no
        upstream call; the input is cached under the new id so the next turn chains from it."""
        req = run.req
        now = int(self.clock())
        rid = self.new_id("resp")
        resp = response_object(
            response_id=rid, request=req.body, status="in_progress", created_at=now
        )
        created = lifecycle_event("response.created", resp, 0)
        done = {**resp, "status": "completed", "usage": zero_usage(), "completed_at": now}
        completed = lifecycle_event("response.completed", done, 1)

        def rest() -> list[Action]:
            sends = [frames.event(created, req.lane), frames.event(completed, req.lane)]
            return sends + self._end(run, Outcome.WARMUP, rid, zero_usage(), response=done)

        return self._after(run, self.recorder.remember(run, rid, [], done, self._queue), rest)

    # ------------------------------------------------------------ the upstream's events

    def _chunk(self, run_id: int, data: bytes) -> list[Action]:
        """One raw chunk of a run's upstream stream: its events, up to the run's end."""
        run = self._runs.get(run_id)
        if run is None or run.decoder is None or run.state in ENDED:
            return []
        try:
            events = run.decoder.feed(data)
        except UpstreamError as err:  # an event past the size bound (core/sse.py)
            return self._fail(run, err)
        out: list[Action] = []
        stream = run.stream
        assert stream is not None
        # the common case, an event of a run already streaming on the default lane with no
        # steer waiting: its frames go out as the translator returns them
        plain = not run.steers and not run.seq_offset and run.req.lane is None
        relayed: list[bytes] = []  # such frames in a row go out as one `Relay`
        i, n = 0, len(events)
        while i < n:
            flowing = plain and run.state is RunState.STREAMING
            try:  # a run of ordinary events in one call, then the next one through `feed`
                if flowing and stream.response_id == run.response_id:
                    i = stream.relay(events, i, relayed)
                if i == n:
                    break
                sent = stream.feed(events[i])
            except UpstreamError as err:
                out += [Relay(relayed), *self._fail(run, err)] if relayed else self._fail(run, err)
                relayed = []
                break
            i += 1
            if flowing and stream.outcome is None and stream.response_id == run.response_id:
                relayed += sent
                continue
            if relayed:
                out.append(Relay(relayed))
                relayed = []
            out += self._fed(run, sent)
            if run.state in ENDED:
                break
        if relayed:
            out.append(Relay(relayed))
        if run.tokens is not None and run.tokens.cut_short:  # the rest is not wanted: stop it
            out.append(CancelUpstream(run.id))
        return out

    def _fed(self, run: Run, sent: list[bytes]) -> list[Action]:
        """The translator's frames for one event, and what they start or end."""
        stream = run.stream
        assert stream is not None
        rid = stream.response_id
        if rid is not None and rid != run.response_id:  # the upstream named it (once a run)
            seen, run.response_id = run.response_id, rid
            if self.recorder.taken(run, rid, self._runs.values()):
                return self._fail(run, reused_response_id(rid), announce=seen is not None)
        if run.state is not RunState.STREAMING:  # once per run, not per event
            run.move(RunState.STREAMING)
        out = self._relay(run, sent)
        if stream.outcome is None and run.steers and at_boundary(run):
            out += self._interrupt(run)
        return out

    def _eof(self, run_id: int) -> list[Action]:
        run = self._runs.get(run_id)
        if run is None or run.stream is None or run.state in ENDED:
            return []
        try:
            sent = run.stream.eof()
        except UpstreamError as err:
            return self._fail(run, err)
        return self._relay(run, sent)

    def _relay(self, run: Run, sent: list[bytes]) -> list[Action]:
        """The translator's frames as the client gets them; at the terminal one, the end."""
        stream = run.stream
        assert stream is not None
        lanes = run.seq_offset or run.req.lane is not None
        sends = [Send(run.lane_frame(f) if lanes else f) for f in sent]
        if stream.outcome is not None:
            if sends:
                self._final(run, sends[-1])
            return self._finish_stream(run, sends)
        return list(sends)

    def _final(self, run: Run, last: Send) -> None:
        """The terminal event `last` carries the response object; an upstream that reported no
        usage gets the proxy's estimate in it, when the turn has one (`Run.estimate_usage`)."""
        stream = run.stream
        assert stream is not None
        response = stream.response
        last.final = response
        if run.estimate_usage is None or response is None:
            return
        if isinstance(response.get("usage"), dict):
            return
        response["usage"] = run.estimate_usage(stream.output)
        last.frame = frames.with_usage(last.frame, response["usage"])

    def _upstream_failed(self, run_id: int, err: UpstreamError) -> list[Action]:
        """The upstream request failed: an HTTP error status, a connect error, a stall, a cut."""
        run = self._runs.get(run_id)
        if run is None or run.state in ENDED:
            return []
        # upstream.api = "auto": a 404/405 on /responses switches to Chat and resends
        inner = run.stream.inner if isinstance(run.stream, ManagedStream) else run.stream
        if not err.started and inner and self.policy.dialect.retry_elsewhere(err.status, inner):
            return self._send_upstream(run)
        if run.native and not err.started and err.code == "previous_response_not_found":
            # the upstream lost its own state: rebuild the full request, once
            run.native = False
            return self._send_upstream(run)
        return self._fail(run, err)

    # ------------------------------------------------------------ endings

    def _finish_stream(self, run: Run, sent: list[Send]) -> list[Action]:
        """The run's terminal event arrived (its frames are `sent`): cache and store the
        response, then send them (after the store's answer when it is stored)."""
        stream = run.stream
        assert stream is not None and stream.outcome is not None
        rid = stream.response_id
        response = stream.response or {}
        usage = response.get("usage")
        outcome = Outcome(stream.outcome)
        save: SaveStored | None = None
        if stream.outcome in ("completed", "incomplete") and rid:
            output = [wire.dumps_kept(item) for item in stream.output]
            save = self.recorder.remember(run, rid, output, response, self._queue)
        else:
            self.recorder.evict_parent(run)

        def rest() -> list[Action]:
            out: list[Action] = list(sent)
            # it ended before a boundary came (docs/protocol.md "response.steer" steps 2, 4)
            if rid and run.steers and outcome in (Outcome.COMPLETED, Outcome.INCOMPLETE):
                sends, successor = self.steering.after_end(run, rid, self._queue)
                out += sends
                if successor is not None:
                    out += self._queue_successor(successor)
            return out + self._end(
                run,
                outcome,
                rid,
                usage if isinstance(usage, dict) else None,
                output_items=len(stream.output),
                response=response or None,
                error=response_failure(response) if outcome is Outcome.FAILED else None,
            )

        return self._after(run, save, rest)

    def _fail(self, run: Run, err: ProxyError, *, announce: bool = True) -> list[Action]:
        """A failure of the upstream (or of the client's reading): tell the client in the
        protocol's terms, evict, move on.

        If the client already saw `response.created`, it is owed a terminal event, so a
        `response.failed` precedes the `error` (docs/protocol.md "Errors", "Chat Completions
        upstreams"). `announce=False`: the event that failed the run was its first response
        object, never forwarded."""
        out: list[Action] = []
        stream = run.stream
        seq: int | None = None
        failed: dict[str, Any] | None = None
        if stream is not None and stream.response is not None and announce:
            seq = run.next_seq()
            failed = {
                **stream.response,
                "status": "failed",
                "error": failed_error(err.code, err.message, err.status),
            }
            out.append(frames.event(lifecycle_event("response.failed", failed, seq), run.req.lane))
            seq += 1
        out.append(frames.error(err, run.req.lane, seq))
        self.recorder.evict_parent(run)
        rid = stream.response_id if stream is not None else None
        return out + self._end(run, Outcome.FAILED, rid, error=err, response=failed)

    def _refuse(self, run: Run, err: ProxyError, *, refused: str | None = None) -> list[Action]:
        """A run refused before its upstream was asked: the error, and its end."""
        out: list[Action] = [frames.error(err, run.req.lane)]
        return out + self._end(run, Outcome.REJECTED, refused=refused, error=err)

    def _interrupt(self, run: Run) -> list[Action]:
        """A steer reached an item boundary (docs/protocol.md "response.steer" step 2): end
        `incomplete` (reason `steered`) with the finished items, cache that, and queue the
        successor."""
        stream = run.stream
        assert stream is not None and stream.response is not None and stream.response_id
        rid, items = stream.response_id, stream.finished_items()
        resp = steered_response(stream.response, items)
        ev = lifecycle_event("response.incomplete", resp, run.next_seq())
        save = self.recorder.remember(run, rid, wire.all_kept(items), resp, self._queue)
        steers, run.steers = run.steers, []

        def rest() -> list[Action]:
            return [
                frames.event(ev, run.req.lane),
                CancelUpstream(run.id),
                *self._queue_successor(self.steering.successor(run, rid, steers)),
                *self._end(run, Outcome.STEERED, rid, output_items=len(items), response=resp),
            ]

        return self._after(run, save, rest)

    def _after(
        self, run: Run, save: SaveStored | None, rest: Callable[[], list[Action]]
    ) -> list[Action]:
        """The rest of a run's ending, at once, or once the store answers `save`."""
        if save is None:
            return rest()
        run.move(RunState.SAVING)
        run.after_save = rest
        return [save]

    def _saved(self, ev: StoredSaved) -> list[Action]:
        """The store's answer to a `SaveStored`: the ending goes on, unless the id was
        stored already (an upstream that reuses ids): then the response fails, and the
        cache forgets it, so that it never replaces another conversation."""
        run = self._runs.get(ev.request.run_id)
        if run is None or run.state is not RunState.SAVING or run.after_save is None:
            return []
        rest, run.after_save = run.after_save, None
        if ev.result is WriteResult.EXISTS:
            rid = ev.request.stored.entry.id
            self.recorder.forget(rid)
            return self._fail(run, reused_response_id(rid))
        return rest()

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
        error: ProxyError | None = None,
        response: dict[str, Any] | None = None,
    ) -> list[Action]:
        """The one end of every run: DONE, forgotten, its lane free; then the
        `response.steer.failed` owed to its steers (docs/protocol.md "response.steer": an
        undelivered successor's steers fail with `successor_creation_failed`, steers still
        pending on it with `response_not_active`) and its `Finished`. `silent` (the client is
        gone) skips everything that speaks to the client."""
        run.move(RunState.DONE)
        del self._runs[run.id]
        self.admission.discharge(run.id)
        # queued runs end only when every run does (drain, client gone): the lane is free
        self._busy_lanes.discard(run.req.lane)
        if silent:
            return []
        out = self.steering.settle(run, outcome in _DELIVERED) if run.steers or run.applies else []
        model = response.get("model") if response else None
        out.append(
            Finished(
                run.id,
                response_id,
                outcome,
                usage,
                refused,
                run.replica,
                cached_tokens(usage),
                output_items=output_items,
                model=model if isinstance(model, str) else run.req.model,
                error=error,
                response=response,
                tokens=run.tokens.use() if run.tokens is not None else None,
            )
        )
        return out


__all__ = ["RunDriver"]

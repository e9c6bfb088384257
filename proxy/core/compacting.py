"""A run's compaction, as the session drives it (docs/protocol.md "Compaction").

Two ways in. A run whose prepared context asks for a compaction (`context_management`, or the
window is full: proxy/core/context/manager.py) first waits in COMPACTING while the executor runs
its `Summarise` actions, one per chunk of the history, and then generates from the compacted
context, its stream beginning with the compaction item (`summarise_first`). A create whose
input ends with a `compaction_trigger` generates nothing: its response is the proxy's own
(proxy/core/context/trigger.py), the compaction of the conversation so far, and ends with the
compaction item once the summary is complete (`trigger`); the trigger and the compaction never
reach the upstream, only the summarising requests do.

The answers come back as `SummaryDone` / `SummaryFailed` (`done`, `failed`). This module owns
no run state; it asks the session (`Host`) to send, end and store.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any, Protocol

from . import wire
from .actions import Action, Outcome, Route, SaveStored, Send, Summarise
from .context.manager import ContextManager, SummaryResult, compaction_failed
from .context.trigger import CompactionStream
from .errors import ClientError, ProxyError, UpstreamError
from .policy import UpstreamPolicy
from .recorder import Recorder
from .runs import Run, RunState


class Host(Protocol):
    """What compaction asks of the session (proxy/core/session.py): its parts, and the
    steps of a run's life that it owns (internal to the two modules)."""

    policy: UpstreamPolicy
    context: ContextManager | None
    owner: str
    recorder: Recorder

    @property
    def clock(self) -> Callable[[], float]: ...
    @property
    def new_id(self) -> Callable[[str], str]: ...

    def _send_upstream(self, run: Run) -> list[Action]: ...
    def _fail(self, run: Run, err: ProxyError, *, announce: bool = True) -> list[Action]: ...
    def _refuse(self, run: Run, err: ProxyError, *, refused: str | None = None) -> list[Action]: ...
    def _after(
        self, run: Run, save: SaveStored | None, rest: Callable[[], list[Action]]
    ) -> list[Action]: ...
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
    ) -> list[Action]: ...
    @property
    def queue(self) -> Iterable[Run]: ...


def routed(run: Run, action: Summarise) -> Summarise:
    """A run's summarising request, routed as its upstream request is (core/plan.py): to the
    replica that served its parent, under its chain's key; not to the least loaded one."""
    if run.chain is None:
        return action
    return replace(action, route=Route(run.parent.replica if run.parent else None, run.chain))


class Compacting:
    """The compactions of one session's runs."""

    def __init__(self, host: Host) -> None:
        self.host = host

    @property
    def context(self) -> ContextManager:
        assert self.host.context is not None
        return self.host.context

    def summarise_first(self, run: Run) -> list[Action]:
        """The run's prepared context cuts the history: summarise the cut first."""
        assert run.context is not None
        run.move(RunState.COMPACTING)
        dialect = self.host.policy.dialect
        return [
            routed(run, self.context.summary_action(run.id, run.context, run.req.model, dialect))
        ]

    def trigger(self, run: Run) -> list[Action]:
        """A `compaction_trigger`: the response is the compaction of the conversation so
        far, written here."""
        host, req = self.host, run.req
        try:
            run.context = self.context.plan_trigger(run.parent, req, host.owner)
        except ClientError as err:  # nothing to compact
            return host._refuse(run, err)
        stream = CompactionStream(
            host.new_id("resp"),
            host.new_id("cmp"),
            req.body,
            int(host.clock()),
            progress=self.context.settings.compaction.progress_events,
        )
        run.stream = stream
        out: list[Action] = [Send(run.lane_frame(f)) for f in stream.opening()]
        if run.context.cut is None:
            return out + self._compacted(run, stream)
        run.move(RunState.COMPACTING)
        return [*out, *self._next_summary(run, stream)]

    def done(self, run: Run | None, result: SummaryResult) -> list[Action]:
        """A summarising request finished: the next chunk's, or generate from the compacted
        context (the stream starting with the compaction item), or, for a trigger, answer
        the compaction item alone."""
        if run is None or run.state is not RunState.COMPACTING:
            return []
        assert run.context is not None
        host = self.host
        trigger = run.stream if isinstance(run.stream, CompactionStream) else None
        try:
            if self.context.absorb_summary(run.context, result):  # the next chunk
                if trigger is not None:
                    return self._next_summary(run, trigger)
                dialect = host.policy.dialect
                action = self.context.summary_action(run.id, run.context, run.req.model, dialect)
                return [routed(run, action)]
            if trigger is not None:
                return self._compacted(run, trigger)
            run.context = self.context.compacted(run.context, host.owner, host.new_id("cmp"))
            return host._send_upstream(run)
        except UpstreamError as err:
            return host._fail(run, err)
        except ClientError as err:  # the compacted context does not fit, or cannot be sent
            return host._refuse(run, err)

    def failed(self, run: Run | None, err: UpstreamError) -> list[Action]:
        if run is None or run.state is not RunState.COMPACTING:
            return []
        return self.host._fail(run, compaction_failed(err))

    def _next_summary(self, run: Run, stream: CompactionStream) -> list[Action]:
        """A trigger's next summarising request, announced by the progress event. The
        request's instructions are summarised with the conversation (as for /compact)."""
        assert run.context is not None
        instructions = run.req.settings.get("instructions")
        action = self.context.summary_action(
            run.id,
            run.context,
            run.req.model,
            self.host.policy.dialect,
            instructions if isinstance(instructions, str) else None,
        )
        return [*(Send(run.lane_frame(f)) for f in stream.compacting()), routed(run, action)]

    def _compacted(self, run: Run, stream: CompactionStream) -> list[Action]:
        """A trigger's summary is complete: seal the item, finish and cache the response."""
        assert run.context is not None
        host = self.host
        item, usage = self.context.trigger_item(run.context, host.owner, stream.item_id)
        sent: list[Action] = [
            Send(run.lane_frame(f)) for f in stream.finish(item, usage, int(host.clock()))
        ]
        rid = stream.response_id
        response = stream.response
        assert rid is not None and response is not None
        if sent and isinstance(sent[-1], Send):
            sent[-1].final = response
        save = host.recorder.remember(run, rid, [wire.dumps_kept(item)], response, host.queue)

        def rest() -> list[Action]:
            return sent + host._end(run, Outcome.COMPLETED, rid, usage, response=response)

        return host._after(run, save, rest)


__all__ = ["Compacting", "Host"]

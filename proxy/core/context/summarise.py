"""Compaction's summarising: planning the summarising requests, absorbing their results and
sealing the compaction item (docs/protocol.md "Compaction").

A request with `context_management: [{type: "compaction"}]` whose rendered count crosses its
`compact_threshold` is compacted before it goes upstream (the second step of
`ContextManager.prepare`, proxy/core/context/manager.py): preparing plans the split, the
session then runs the `Summarise` action (an ordinary upstream request, executed by the
adapter) and hands the result to `absorb_summary`, then to `compacted`, which seals the
compaction item and rebuilds the items as head + summary + recent tail. Ordinary turns never
pay for this. An explicit compaction (`POST /v1/responses/compact`: `plan_compact`,
`compact_output`) and a `compaction_trigger` (`plan_trigger`, `trigger_item`) take the same
summarising steps.

This is the one module of proxy/core/context/ that builds an action (`Summarise`, from
proxy/core/actions.py, which imports nothing from here). Nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import wire
from ..actions import Summarise
from ..api_objects import add_usage, usage_of
from ..conversation import CachedResponse
from ..dialects import Dialect
from ..errors import UpstreamError, invalid
from ..request import CreateRequest
from .compaction import (
    Compacted,
    CompactRequest,
    ItemFacts,
    is_summary,
    last_safe_cut,
    new_input_start,
    pinned_head,
    plan_split,
    seal,
    summary_message,
    summary_request,
    summary_text,
    transcript,
)
from .render import Prepared, Renderer

_SUMMARY_PROMPT_TOKENS = 300  # the summarising request's own instructions, roughly


@dataclass(frozen=True, slots=True)
class SummaryResult:
    outcome: str  # completed | incomplete | failed
    output: list[Any]
    usage: dict[str, Any] | None


class Summariser(Renderer):
    """The summarising steps of a compaction, over the rendered input; the layer of
    `ContextManager` between rendering and validating."""

    # ------------------------------------------------------------ compaction

    def _plan_compaction(self, prep: Prepared, threshold: int | None) -> bool:
        """Plan the compaction of a run over its compaction threshold: True with the split
        planned (`cut` set); False under the threshold, or when nothing older than the new
        input can be summarised."""
        if threshold is None or prep.input_tokens() <= threshold:
            return False
        all_facts = prep.facts()
        prep.new_start = new_input_start(all_facts, prep.new_start, prep.chained)
        prep.head = pinned_head(all_facts, prep.new_start)
        keep = int(threshold * self.settings.compaction.keep_recent_fraction)
        lo, hi = prep.head + 1, prep.new_start
        cut = plan_split(all_facts, prep.counts, lo, hi, keep)
        if cut is None:
            cut = last_safe_cut(all_facts, lo, hi)
        if cut is not None:
            prep.cut = cut
            return True
        return False

    def summary_action(
        self,
        run_id: int,
        prep: Prepared,
        model: str,
        dialect: Dialect,
        instructions: str | None = None,
    ) -> Summarise:
        """The next summarising request of a planned compaction (`prep.cut` set).

        The older part is `items[head:cut]`. When it does not fit the window with the
        summarising prompt and its output, it is summarised in chunks, oldest first: each
        request carries the summary so far and as many of the next items as fit, and
        `absorb_summary` says whether another chunk follows. Nothing is left out."""
        assert prep.cut is not None
        window = self.settings.context_window
        max_out = self.settings.compaction.summary_max_output_tokens
        head, cut = prep.head, prep.cut
        if prep.summary is not None:  # a later chunk: the summary so far comes first
            prefix: list[bytes] = [summary_message(prep.summary)]
            prefix_tokens = self.estimator.item(prefix[0])
            start = prep.summary_from if prep.summary_from is not None else cut
        else:  # an earlier compaction's summary stands for everything before it
            first = 1 if is_summary(prep.items[head]) else 0
            prefix = list(prep.items[head : head + first])
            prefix_tokens = sum(prep.counts[head : head + first])
            start = head + first
        end = cut
        if window:  # the summarising request must fit the window too
            max_out = max(1, min(max_out, window // 4))
            budget = window - max_out - _SUMMARY_PROMPT_TOKENS
            total, end = prefix_tokens, start
            while end < cut and (end == start or total + prep.counts[end] <= budget):
                total += prep.counts[end]
                end += 1
        prep.summary_to = end
        text = transcript(prefix, instructions)
        text = "\n\n".join(t for t in (text, transcript(prep.items[start:end])) if t)
        settings, items = summary_request(model, text, max_out)
        return Summarise(
            run_id, dialect.body(settings, {"stream": True, "store": False}, items), dialect.path
        )

    def absorb_summary(self, prep: Prepared, result: SummaryResult) -> bool:
        """Take one summarising response. True when more of the older part remains (then
        send the next `summary_action`); False when the summary is complete."""
        assert prep.cut is not None and prep.summary_to is not None, "summary_action first"
        summary = summary_text(result.output)
        if result.outcome == "failed" or not summary:
            raise _no_summary()
        prep.summary = summary
        if isinstance(result.usage, dict):
            before = prep.summary_usage
            prep.summary_usage = add_usage(before, result.usage) if before else result.usage
        if prep.summary_to < prep.cut:
            prep.summary_from = prep.summary_to
            return True
        return False

    def compacted(self, prep: Prepared, owner: str, item_id: str) -> Prepared:
        """The run's items once the summary is complete: head + summary + recent tail, and
        the sealed compaction item that stands for them."""
        assert prep.cut is not None and prep.summary is not None
        summary = prep.summary
        head, tail = prep.items[: prep.head], prep.items[prep.cut :]
        item = seal(self.sealer, Compacted(tuple(head), summary, tuple(tail)), owner, item_id)
        message = summary_message(summary)
        facts = prep.facts()
        kept = [*facts[: prep.head], ItemFacts("message", "user", None), *facts[prep.cut :]]
        done = Prepared(
            items=[*head, message, *tail],
            counts=[
                *prep.counts[: prep.head],
                self.estimator.item(message),
                *prep.counts[prep.cut :],
            ],
            facts=lambda: kept,
            settings=prep.settings,
            new_start=prep.new_start - (prep.cut - prep.head) + 1,
            chained=prep.chained,
            truncation=prep.truncation,
            reserve=prep.reserve,
            settings_tokens=prep.settings_tokens,
            threshold=prep.threshold,
            compaction=item,
            summary_usage=prep.summary_usage,
        )
        return self._fit(done)

    # ------------------------------------------------------------ POST /v1/responses/compact

    def plan_compact(
        self, parent: CachedResponse | None, req: CompactRequest, owner: str
    ) -> Prepared:
        """The split for an explicit compaction: system/developer head kept, then the
        older part to summarise, then a recent tail of at most `keep_recent_fraction` of
        the conversation's tokens, returned in the clear. `cut` is None when there is
        nothing to summarise."""
        return self._plan_split_all(parent, req.input_items, owner)

    def plan_trigger(
        self, parent: CachedResponse | None, req: CreateRequest, owner: str
    ) -> Prepared:
        """The split for a `compaction_trigger`: as for `/responses/compact`, over the
        conversation and the request's other new items (the trigger, last, left out)."""
        return self._plan_split_all(parent, req.input_items[:-1], owner)

    def trigger_item(
        self, prep: Prepared, owner: str, item_id: str
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The compaction item a `compaction_trigger` answers (its summary absorbed
        already), and the usage of the compaction. Unlike `/responses/compact` the recent
        tail is sealed inside the item: the client keeps only the item, and a later turn
        expands it into head, summary and tail."""
        head = tuple(prep.items[: prep.head])
        if prep.cut is None:  # nothing to summarise: the item stands for the items as they are
            compacted = Compacted(head, "", tuple(prep.items[prep.head :]))
            usage = usage_of(0, 0)
        else:
            if not prep.summary:
                raise _no_summary()
            compacted = Compacted(head, prep.summary, tuple(prep.items[prep.cut :]))
            older = sum(prep.counts[prep.head : prep.cut])
            usage = prep.summary_usage or usage_of(older, self.estimator.of_text(prep.summary))
        prep.compaction = seal(self.sealer, compacted, owner, item_id)
        return prep.compaction, usage

    def _plan_split_all(
        self, parent: CachedResponse | None, input_items: tuple[bytes, ...], owner: str
    ) -> Prepared:
        prep, _ = self._assemble(parent, input_items, {}, owner, counted=True)
        if not prep.items:
            raise invalid("There is nothing to compact: the input is empty.", "input")
        facts = prep.facts()
        prep.head = pinned_head(facts, len(facts))
        keep = int(sum(prep.counts) * self.settings.compaction.keep_recent_fraction)
        lo, hi = prep.head + 1, len(facts)
        cut = plan_split(facts, prep.counts, lo, hi, keep)
        prep.cut = cut if cut is not None else last_safe_cut(facts, lo, hi)
        return prep

    def compact_output(
        self, prep: Prepared, owner: str, item_id: str
    ) -> tuple[list[Any], dict[str, Any]]:
        """The compacted window (the compaction item, then the recent tail as it was
        given) and the usage of the compaction pass (its summary absorbed already)."""
        head = tuple(prep.items[: prep.head])
        if prep.cut is None:  # only system/developer messages
            item = seal(self.sealer, Compacted(head, "", ()), owner, item_id)
            return [item, *(wire.loads(i) for i in prep.items[prep.head :])], usage_of(0, 0)
        summary = prep.summary
        if not summary:
            raise _no_summary()
        item = seal(self.sealer, Compacted(head, summary, ()), owner, item_id)
        usage = prep.summary_usage
        if not isinstance(usage, dict):
            older = sum(prep.counts[prep.head : prep.cut])
            usage = usage_of(older, self.estimator.of_text(summary))
        return [item, *(wire.loads(i) for i in prep.items[prep.cut :])], usage


def compaction_failed(err: UpstreamError) -> UpstreamError:
    """An upstream failure of the summarising request, said as such."""
    if err.message.startswith("Compaction failed"):
        return err
    return UpstreamError(
        f"Compaction failed: {err.message}",
        status=err.status,
        code=err.code,
        param=err.param,
        type=err.type,
        headers=err.headers,
    )


def _no_summary() -> UpstreamError:
    return UpstreamError(
        "Compaction failed: the upstream model returned no summary.",
        code="compaction_failed",
        status=502,
    )

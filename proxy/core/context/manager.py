"""The context window of a stateless upstream: rendering, counting, truncation, compaction.

Theory of operation
-------------------
Before a run goes upstream the session asks `ContextManager.prepare` for the items to send
(docs/protocol.md "Compaction", "What carries over"). Preparing does, in order:

1. **Render** the conversation: the parent's cached segments, then the new input, with every
   compaction item expanded (proxy/core/context/compaction.py) and everything before the latest one
   dropped. Each cached segment is rendered once and the result memoised on it
   (`Segment.rendering`), with one token count per rendered item: an ordinary turn costs one
   attribute read per segment, and a compaction item in the history is decrypted once, not
   every turn. Opened compaction items are also memoised by content (bounded), for clients
   that resend the whole history each turn.
2. **Compact**, if the request has `context_management: [{type: "compaction"}]` and the
   rendered count crosses its `compact_threshold`: the session then runs the `Summarise`
   action (an ordinary upstream request, executed by the adapter) and hands the result to
   `compacted`, which seals the compaction item and rebuilds the items as
   head + summary + recent tail. Ordinary turns never pay for this.
3. **Fit** the window, when `upstream.context_window` is known: `truncation: "auto"` drops
   the oldest turns that do not fit the window minus a reserve for output; otherwise a
   request over the window is a 400 `context_length_exceeded` without an upstream call.

Counts start as estimates (proxy/core/context/tokens.py). When the upstream has a tokenizer and a
request depends on counts, the segments it used are handed out once as `CountTokens` jobs;
the adapter tokenizes them in the background and calls `record_counts`, so later turns see
exact numbers. Nothing here does I/O; the manager is process-wide and holds no
per-connection state.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .. import wire
from ..actions import Summarise
from ..api_objects import add_usage, usage_of
from ..conversation import CachedResponse, Segment
from ..dialects import Dialect
from ..errors import ClientError, UpstreamError, invalid, wrong_type
from ..lru import ByteLRU
from ..request import CreateRequest
from .compaction import (
    Compacted,
    CompactRequest,
    ItemFacts,
    check_trigger,
    compaction_of,
    facts_of,
    has_trigger,
    is_summary,
    last_safe_cut,
    new_input_start,
    open_item,
    pinned_head,
    plan_split,
    seal,
    summary_message,
    summary_request,
    summary_text,
    transcript,
)
from .sealing import Sealer
from .settings import ContextSettings
from .tokens import TokenEstimator

MIN_COMPACT_THRESHOLD = 1000  # docs/protocol.md "Compaction"
TRUNCATION_MODES = ("auto", "disabled")
_SUMMARY_PROMPT_TOKENS = 300  # the summarising request's own instructions, roughly


# ---------------------------------------------------------------- counts and results


@dataclass(eq=False)
class TokenCounts:
    """The rendered items of one segment (or of one request's input) and their counts."""

    items: tuple[bytes, ...]
    counts: list[int]
    restart: int  # index where the latest compaction's expansion begins, -1 if none
    exact: bool = False
    queued: bool = False
    _facts: list[ItemFacts] | None = None

    def facts(self) -> list[ItemFacts]:
        if self._facts is None:
            self._facts = [facts_of(i) for i in self.items]
        return self._facts


@dataclass(frozen=True, slots=True, eq=False)
class TokenJob:
    """Items whose exact counts the adapter should ask the upstream's tokenizer for."""

    target: TokenCounts
    items: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class SummaryResult:
    outcome: str  # completed | incomplete | failed
    output: list[Any]
    usage: dict[str, Any] | None


@dataclass(eq=False)
class Prepared:
    """The upstream input of one run, and what it still needs."""

    items: list[bytes]
    counts: list[int]  # per item; empty when no decision needs them (an ordinary turn)
    facts: Callable[[], list[ItemFacts]]
    settings: dict[str, Any]  # the request's settings as sent upstream
    new_start: int  # index of the first item of the request's new input
    chained: bool  # a continuation (previous_response_id): all of `input` is new
    truncation: str
    reserve: int  # output tokens to keep free under truncation "auto"
    settings_tokens: int  # instructions and tools
    threshold: int | None = None
    cut: int | None = None  # compaction planned: summarise items[head:cut]
    head: int = 0
    compaction: dict[str, Any] | None = None  # the compaction item, once compacted
    summary_usage: dict[str, Any] | None = None
    # the older part is summarised in chunks that each fit the window: the summary so far
    # (it opens the next chunk's transcript), and the items the current chunk covers
    summary: str | None = None
    summary_from: int | None = None
    summary_to: int | None = None
    jobs: tuple[TokenJob, ...] = ()
    dropped: int = 0  # items truncation left out
    input_compacted: bool = False  # the new input holds a compaction item (expanded here)

    def input_tokens(self) -> int:
        return sum(self.counts) + self.settings_tokens


# ---------------------------------------------------------------- the manager


class ContextManager:
    def __init__(self, settings: ContextSettings, sealer: Sealer) -> None:
        self.settings = settings
        self.sealer = sealer
        self.estimator = TokenEstimator(settings.tokens.bytes_per_token)
        self.tokenize = settings.tokens.tokenize
        # opened compaction items by (credential, encrypted_content), for clients that
        # resend the whole history each turn
        self._opened: ByteLRU[tuple[str, str], Compacted] = ByteLRU(
            settings.compaction.expansion_cache_bytes
        )

    # ------------------------------------------------------------ validation

    def validate(self, req: CreateRequest, owner: str) -> None:
        """Checks on arrival: `context_management`, `truncation`, where a
        `compaction_trigger` stands, and that every compaction item in the new input opens."""
        self._threshold(req.settings)
        check_trigger(req.input_items, req.generate)
        truncation = req.settings.get("truncation")
        if truncation is not None and truncation not in TRUNCATION_MODES:
            raise invalid("'truncation' must be 'auto' or 'disabled'.", "truncation")
        self._render(req.input_items, owner)

    def expanded(self, items: tuple[bytes, ...], owner: str) -> tuple[bytes, ...]:
        """`items` with every compaction item replaced by what it stands for (memoised per
        item), so that the tool calls it kept verbatim can be seen."""
        return self._render(items, owner).items

    def _threshold(self, settings: dict[str, Any]) -> int | None:
        """The compaction threshold the request asks for, or None."""
        entries = settings.get("context_management")
        if entries is None:
            return None
        threshold: int | None = None
        enabled = False
        for i, entry in enumerate(entries):
            where = f"context_management[{i}]"
            if not isinstance(entry, dict):
                raise wrong_type(where, "an object")
            if entry.get("type") != "compaction":
                raise invalid(
                    f"'{where}.type' must be 'compaction', the only context management type.",
                    f"{where}.type",
                )
            value = entry.get("compact_threshold")
            if value is not None:
                if not isinstance(value, int) or isinstance(value, bool):
                    raise wrong_type(f"{where}.compact_threshold", "an integer")
                if value < MIN_COMPACT_THRESHOLD:
                    raise invalid(
                        f"'{where}.compact_threshold' must be at least {MIN_COMPACT_THRESHOLD}.",
                        f"{where}.compact_threshold",
                    )
                threshold = value
            enabled = True
        if enabled and threshold is None:
            window = self.settings.context_window
            return window - self.settings.tokens.output_reserve if window else None
        return threshold

    # ------------------------------------------------------------ rendering

    def _open(self, item: dict[str, Any], owner: str) -> Compacted:
        key = (owner, str(item.get("encrypted_content")))
        found = self._opened.get(key)
        if found is None:
            found = open_item(self.sealer, item, owner)
            expansion = sum(len(i) for i in (*found.head, *found.tail)) + len(found.summary)
            self._opened.put(key, found, len(key[1]) + expansion)  # the token and what it opens to
        return found

    def _render(self, items: tuple[bytes, ...], owner: str) -> TokenCounts:
        rendered: list[bytes] | None = None
        restart = -1
        for index, item in enumerate(items):
            doc = compaction_of(item)
            if doc is None:
                if rendered is not None:
                    rendered.append(item)
                continue
            if rendered is None:
                rendered = list(items[:index])
            restart = len(rendered)
            rendered.extend(self._open(doc, owner).expand())
        final = tuple(rendered) if rendered is not None else items
        return TokenCounts(final, [self.estimator.item(i) for i in final], restart)

    def _segment(self, seg: Segment, owner: str) -> TokenCounts:
        memo = seg.rendering
        if memo is not None and memo[0] is self:
            found: TokenCounts = memo[1]
            return found
        found = self._render(seg.items, owner)
        object.__setattr__(seg, "rendering", (self, found))  # a memo on a frozen segment
        return found

    def _assemble(
        self,
        parent: CachedResponse | None,
        input_items: tuple[bytes, ...],
        settings: dict[str, Any],
        owner: str,
        counted: bool,
    ) -> tuple[Prepared, list[TokenCounts]]:
        """The rendered conversation (step 1) and the cached segments it used; the counts
        only if `counted` (an ordinary turn needs none)."""
        segments = parent.segments if parent is not None else ()
        parts = [self._segment(seg, owner) for seg in segments]
        parts.append(self._render(input_items, owner))
        first = 0
        for k in range(len(parts) - 1, -1, -1):
            if parts[k].restart >= 0:
                first = k
                break
        used = parts[first:]
        offset = max(used[0].restart, 0)
        items: list[bytes] = list(used[0].items[offset:])
        for part in used[1:]:
            items.extend(part.items)
        counts: list[int] = []
        if counted:
            counts = used[0].counts[offset:]
            for part in used[1:]:
                counts.extend(part.counts)
        last = used[-1]
        input_start = len(items) - len(last.items) + (offset if len(used) == 1 else 0)

        def facts() -> list[ItemFacts]:
            out = used[0].facts()[offset:]
            for part in used[1:]:
                out.extend(part.facts())
            return out

        max_out = settings.get("max_output_tokens")
        reserve = max_out if isinstance(max_out, int) and max_out > 0 else 0
        prep = Prepared(
            items=items,
            counts=counts,
            facts=_once(facts),
            settings=settings,
            new_start=input_start,
            chained=bool(segments),  # a continuation: all of `input` is new
            truncation=str(settings.get("truncation") or "disabled"),
            reserve=reserve or self.settings.tokens.output_reserve,
            settings_tokens=0,
            input_compacted=parts[-1].restart >= 0,
        )
        return prep, used[:-1]

    def prepare(self, parent: CachedResponse | None, req: CreateRequest, owner: str) -> Prepared:
        """The items to send for a run, or the compaction it needs first (`cut` set).
        Raises ClientError for items that do not open and requests that cannot fit."""
        settings = req.settings
        threshold = self._threshold(settings)
        if "context_management" in settings:
            settings = {k: v for k, v in settings.items() if k != "context_management"}
        counted = threshold is not None or self.settings.context_window > 0
        prep, cached = self._assemble(parent, req.input_items, settings, owner, counted)
        prep.threshold = threshold
        if not counted:
            return prep
        prep.settings_tokens = self._settings_tokens(settings)
        if self.tokenize:
            prep.jobs = self._jobs(cached)
        if threshold is not None and prep.input_tokens() > threshold:
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
                return prep
        return self._fit(prep)

    def manages(self, req: CreateRequest) -> bool:
        """Whether preparing can change a request that could be sent with the upstream's own
        `previous_response_id`: a window to check, a compaction asked for, a compaction
        item or trigger in the new input. If not, such a run goes upstream as it is."""
        return bool(
            self.settings.context_window
            or "context_management" in req.settings
            or has_trigger(req.input_items)
            or any(compaction_of(i) is not None for i in req.input_items)
        )

    @staticmethod
    def native_ok(prep: Prepared) -> bool:
        """A prepared run may still go upstream with the upstream's own
        `previous_response_id` and only its new input: nothing was compacted, truncated or
        expanded, so the upstream's state is what the proxy would have sent."""
        return prep.cut is None and not prep.dropped and not prep.input_compacted

    def _settings_tokens(self, settings: dict[str, Any]) -> int:
        n = 0
        for key in ("instructions", "tools"):
            if settings.get(key):
                n += self.estimator.of_bytes(len(wire.dumps(settings[key])))
        return n

    def _jobs(self, parts: Sequence[TokenCounts]) -> tuple[TokenJob, ...]:
        jobs: list[TokenJob] = []
        for part in parts:
            if not part.exact and not part.queued:
                part.queued = True
                jobs.append(TokenJob(part, part.items))
        return tuple(jobs)

    def record_counts(self, target: TokenCounts, counts: Sequence[int]) -> None:
        """Exact counts for a job's items, in order, from the upstream's tokenizer."""
        if len(counts) == len(target.items):
            target.counts[:] = counts
            target.exact = True

    # ------------------------------------------------------------ fitting the window

    def _fit(self, prep: Prepared) -> Prepared:
        window = self.settings.context_window
        if not window:
            return prep
        tokens = prep.input_tokens()
        if prep.truncation != "auto":
            if tokens > window:
                raise context_length_exceeded(tokens, window)
            return prep
        budget = window - prep.reserve - prep.settings_tokens
        if sum(prep.counts) <= budget:
            return prep
        facts = prep.facts()
        new_start = new_input_start(facts, prep.new_start, prep.chained)
        head = pinned_head(facts, new_start)
        cut = plan_split(facts, prep.counts, head, new_start, budget - sum(prep.counts[:head]))
        if cut is None:
            raise context_length_exceeded(tokens, window, truncated=True)
        prep.dropped = cut - head
        prep.items = prep.items[:head] + prep.items[cut:]
        prep.counts = prep.counts[:head] + prep.counts[cut:]
        kept = facts[:head] + facts[cut:]
        prep.facts = lambda: kept
        prep.new_start = new_start - prep.dropped
        return prep

    # ------------------------------------------------------------ compaction

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

    def usage(self, prep: Prepared, output: Sequence[Any]) -> dict[str, Any]:
        """Usage from the proxy's counts, for an upstream that reports none."""
        settings_tokens = prep.settings_tokens or self._settings_tokens(prep.settings)
        counts = prep.counts or [self.estimator.item(i) for i in prep.items]
        input_tokens = sum(counts) + settings_tokens
        out = sum(self.estimator.of_bytes(len(wire.dumps(item))) for item in output)
        return usage_of(input_tokens, out)


def _once(fn: Callable[[], list[ItemFacts]]) -> Callable[[], list[ItemFacts]]:
    memo: list[list[ItemFacts]] = []

    def call() -> list[ItemFacts]:
        if not memo:
            memo.append(fn())
        return memo[0]

    return call


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


def context_length_exceeded(tokens: int, window: int, truncated: bool = False) -> ClientError:
    if truncated:
        message = (
            f"The request does not fit the model's context window of {window} tokens even "
            "after truncation: its new input, with the system messages and the room kept "
            "for output, is too long."
        )
    else:
        message = (
            f"The request needs about {tokens} tokens, more than the model's context window "
            f'of {window} tokens. Use truncation: "auto" or context_management compaction, '
            "or shorten the input."
        )
    return ClientError(message, code="context_length_exceeded", param="input")


__all__ = [
    "ContextManager",
    "ContextSettings",
    "Prepared",
    "SummaryResult",
    "TokenCounts",
    "TokenJob",
    "compaction_failed",
]

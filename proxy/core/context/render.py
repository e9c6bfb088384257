"""The upstream input of a run: rendering, counting and fitting the window (the first and
last steps of `ContextManager.prepare`, proxy/core/context/manager.py).

Rendering
---------
The conversation is the parent's cached segments, then the new input, with every
compaction item expanded (proxy/core/context/compaction.py) and everything before the latest
one dropped. Each cached segment is rendered once and the result memoised on it
(`Segment.rendering`), with one token count per rendered item: an ordinary turn costs one
attribute read per segment, and a compaction item in the history is decrypted once, not
every turn. Opened compaction items are also memoised by content (bounded), for clients
that resend the whole history each turn.

Counting
--------
Counts start as estimates (proxy/core/context/tokens.py). When the upstream has a tokenizer and
a request depends on counts, the segments it used are handed out once as `CountTokens` jobs;
the adapter tokenizes them in the background and calls `record_counts`, so later turns see
exact numbers.

Fitting
-------
When `upstream.context_window` is known, `truncation: "auto"` drops the oldest turns that do
not fit the window minus a reserve for output; otherwise a request over the window is a 400
`context_length_exceeded` without an upstream call.

Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .. import wire
from ..conversation import CachedResponse, Segment
from ..errors import ClientError
from ..lru import ByteLRU
from .compaction import (
    Compacted,
    ItemFacts,
    compaction_of,
    new_input_start,
    open_item,
    pinned_head,
    plan_split,
)
from .sealing import Sealer
from .settings import ContextSettings
from .tokens import TokenCounts, TokenEstimator, TokenJob


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


class Renderer:
    """Renders, counts and fits the upstream input; the base of `ContextManager`, which
    holds one per process (no per-connection state)."""

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

    def expanded(self, items: tuple[bytes, ...], owner: str) -> tuple[bytes, ...]:
        """`items` with every compaction item replaced by what it stands for (memoised per
        item), so that the tool calls it kept verbatim can be seen."""
        return self._render(items, owner).items

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
        """The rendered conversation and the cached segments it used; the counts only if
        `counted` (an ordinary turn needs none)."""
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

    # ------------------------------------------------------------ counting

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


def _once(fn: Callable[[], list[ItemFacts]]) -> Callable[[], list[ItemFacts]]:
    memo: list[list[ItemFacts]] = []

    def call() -> list[ItemFacts]:
        if not memo:
            memo.append(fn())
        return memo[0]

    return call


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

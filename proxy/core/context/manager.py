"""The context window of a stateless upstream: rendering, counting, truncation, compaction.

Theory of operation
-------------------
Before a run goes upstream the session asks `ContextManager.prepare` for the items to send
(docs/protocol.md "Compaction", "What carries over"). Preparing does, in order:

1. **Render** the conversation: the parent's cached segments, then the new input, with every
   compaction item expanded and everything before the latest one dropped, each cached
   segment rendered once (proxy/core/context/render.py).
2. **Compact**, if the request has `context_management: [{type: "compaction"}]` and the
   rendered count crosses its `compact_threshold`: the session runs the `Summarise` action
   and hands the result back (proxy/core/context/summarise.py). Ordinary turns never pay for
   this.
3. **Fit** the window, when `upstream.context_window` is known: truncate under
   `truncation: "auto"`, else refuse what does not fit (proxy/core/context/render.py).

Counts start as estimates (proxy/core/context/tokens.py) and become exact once the upstream's
tokenizer answers the jobs preparing hands out (render.py, "Counting").

`ContextManager` is built in layers, one module each: `Renderer` (render.py) renders,
counts and fits; `Summariser` (summarise.py) adds the summarising steps on top of it; this
module adds the checks on arrival and the order of preparing. Nothing here does I/O; the
manager is process-wide and holds no per-connection state.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import wire
from ..api_objects import usage_of
from ..conversation import CachedResponse
from ..errors import invalid, wrong_type
from ..request import CreateRequest
from .compaction import check_trigger, compaction_of, has_trigger
from .render import Prepared
from .settings import ContextSettings
from .summarise import Summariser, SummaryResult, compaction_failed
from .tokens import TokenCounts, TokenJob

MIN_COMPACT_THRESHOLD = 1000  # docs/protocol.md "Compaction"
TRUNCATION_MODES = ("auto", "disabled")


class ContextManager(Summariser):
    """What the session asks of the context window. Rendering, counting and fitting
    (`expanded`, `record_counts`) come from `Renderer`, the summarising steps
    (`summary_action`, `absorb_summary`, `compacted`, `plan_trigger`, `trigger_item`,
    `plan_compact`, `compact_output`) from `Summariser`."""

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

    # ------------------------------------------------------------ preparing

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
        if self._plan_compaction(prep, threshold):
            return prep  # the compaction comes first (summary_action)
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

    def usage(self, prep: Prepared, output: Sequence[Any]) -> dict[str, Any]:
        """Usage from the proxy's counts, for an upstream that reports none."""
        settings_tokens = prep.settings_tokens or self._settings_tokens(prep.settings)
        counts = prep.counts or [self.estimator.item(i) for i in prep.items]
        return self._usage(sum(counts) + settings_tokens, output)

    def usage_of_items(
        self, settings: dict[str, Any], items: Sequence[bytes], output: Sequence[Any]
    ) -> dict[str, Any]:
        """Usage estimated for a turn the manager did not prepare (nothing to manage), for
        an upstream that reports none."""
        counts = sum(self.estimator.item(i) for i in items)
        return self._usage(counts + self._settings_tokens(settings), output)

    def _usage(self, input_tokens: int, output: Sequence[Any]) -> dict[str, Any]:
        out = sum(self.estimator.of_bytes(len(wire.dumps(item))) for item in output)
        return usage_of(input_tokens, out)


__all__ = [
    "ContextManager",
    "ContextSettings",
    "Prepared",
    "SummaryResult",
    "TokenCounts",
    "TokenJob",
    "compaction_failed",
]

"""What a session keeps of its responses: the connection's cache, and what it asks the store.

A response that ended `completed` or `incomplete` (or at a steer's item boundary) is cached
under its id with its whole item list (parent items, new input, output), as segments shared
with its parent (core/conversation.py); one created with `store` not false is also written to
the response store, by a `SaveStored` action that the run waits on (proxy/core/actions.py).
The store keeps each response's own segment and a pointer to its stored parent when the parent
was stored and nothing was compacted; otherwise the whole conversation (docs/store.md).

Lookups go to the connection's cache only; a parent that is not there is read from the store
by a `LoadStored` action. On any failure of a continuation the parent is evicted when it belongs
to the same lane, and kept for a cross-lane fork (docs/protocol.md "Continuing and eviction").
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from . import wire
from .actions import SaveStored
from .calls import NO_CALLS, index_calls
from .context.compaction import compaction_of
from .context.manager import ContextManager
from .context.trigger import CompactionStream
from .conversation import EMPTY, ResponseCache, Segment, holds_compaction
from .guards import Unseen
from .memory import SETTINGS_FACTOR
from .runs import Run
from .store import StoredResponse
from .tokens.chain import NO_IDS_YET, TokenTurn

# set in a cached response's settings when the upstream never saw it (the proxy wrote it):
# it cannot be continued with the upstream's own previous_response_id
PROXY_MADE = "wsmode_proxy_made"


class Recorder:
    """One session's cache writes and store requests."""

    def __init__(
        self,
        cache: ResponseCache,
        owner: str,
        context: ContextManager | None,
        *,
        stores: bool,
        token_path: bool = False,
    ) -> None:
        self.cache = cache
        self.owner = owner  # the credential scope of the store and of compaction items
        self.context = context
        self.stores = stores  # there is a response store (`store.enabled`)
        self.token_path = token_path  # responses keep token ids (core/tokens/)

    def remember(
        self,
        run: Run,
        rid: str,
        output: list[bytes],
        response: dict[str, Any],
        queue: Iterable[Run],
    ) -> SaveStored | None:
        """Cache the finished response (pinning it for the queued creates that continue it);
        the `SaveStored` to wait on when it is to be stored."""
        # after a compaction the conversation continues from the compaction item, which
        # stands for everything before it: the parent's segments are no longer needed
        compacted = run.context is not None and run.context.compaction is not None
        parent = run.parent or EMPTY
        settings = {**run.req.settings, "store": run.req.store}
        if isinstance(run.stream, CompactionStream):
            settings[PROXY_MADE] = True
        added = Segment((*run.req.input_items, *output))
        seen, opaque = self.visible(run.req.input_items)
        expanded = None if seen is run.req.input_items else (*seen, *output)
        entry = parent.child(
            rid,
            run.req.lane,
            added,
            settings,
            compacted=compacted,
            opaque=opaque,
            seen=expanded,
            unmoderated=run.moderation or (),  # left only by a warmup: it went nowhere
            replica=run.replica,
            chain=run.chain,
            # a warmup adds input only: the next turn tokenises it after the parent's ids
            tokens=run.tokens.turn() if run.tokens is not None else self._warmup_tokens(run),
            stored=bool(run.req.store) and self.stores,
            held=_held(run),
        )
        self.cache.put(entry)
        for queued in queue:  # a create that waited for this response: pin it too
            if queued.pinned is None and queued.req.previous_response_id == rid:
                queued.pinned = rid if self.cache.pin(rid) else None
        if not run.req.store or not self.stores:
            return None
        stored = StoredResponse(
            entry,
            wire.dumps_kept(response),
            entry.item_count - len(output),
            # deleting the stored response it continues deletes it too (its history holds it)
            continues=parent.stored_above,
        )
        # the store may keep this turn's own segment, pointing at its parent's entry: only
        # if the parent was stored and the history was not compacted (docs/store.md)
        if not compacted and run.parent is not None and run.parent.settings.get("store"):
            calls = index_calls(NO_CALLS, added.items if expanded is None else expanded)
            stored = replace(
                stored,
                parent=run.parent.id,
                added_calls=tuple(calls),
                token_base=run.parent.tokens,
            )
        return SaveStored(run.id, stored, self.owner)

    def _warmup_tokens(self, run: Run) -> TokenTurn | None:
        """A run that did not go to the model (a warmup) keeps its parent's ids; at a
        conversation's start, the mark that there are none yet (not that they were lost)."""
        if run.req.generate or not self.token_path:
            return None
        parent = run.parent
        if parent is None:
            return NO_IDS_YET
        return parent.tokens

    def forget(self, rid: str) -> None:
        """A response cached by `remember` whose write the store refused (its id is stored
        already): it never happened."""
        self.cache.evict(rid)

    def evict_parent(self, run: Run) -> None:
        """docs/protocol.md "Continuing and eviction": a failed same-lane continuation evicts
        its parent; a fork keeps it."""
        if run.parent is not None and run.parent.lane == run.req.lane:
            self.cache.evict(run.parent.id)

    def taken(self, run: Run, rid: str, runs: Iterable[Run]) -> bool:
        """`rid` already names another response of this connection (cached or in flight):
        an upstream that reuses ids must not make one conversation overwrite another, so
        that response fails instead (docs/errors.md). The store is not asked (no call from
        the core): it refuses to overwrite an id it holds, and the write's answer says so."""
        return rid in self.cache or any(r.response_id == rid for r in runs if r is not run)

    def visible(self, items: tuple[bytes, ...]) -> tuple[tuple[bytes, ...], bool]:
        """The new input as the call index sees it: compaction items expanded when they are
        this proxy's own; `True` if one holds what the proxy cannot see (the upstream's)."""
        if not holds_compaction(items) or all(compaction_of(i) is None for i in items):
            return items, False
        if self.context is None:
            return items, True
        return self.context.expanded(items, self.owner), False


def _held(run: Run) -> int:
    """What a response's own objects hold beside its links (`CachedResponse.held`): its
    settings, estimated from their JSON, and the text it leaves unmoderated (its own: the
    rest is its parent's)."""
    unseen = run.moderation
    held = SETTINGS_FACTOR * run.req.settings_bytes
    if not unseen:  # no moderation (the usual turn): no text of its own held
        return held
    # `type` rather than `isinstance`: `Unseen` is a `Collection`, whose check is slow
    own = unseen.own if type(unseen) is Unseen else unseen
    return held + sum(len(text) for text in own)


__all__ = ["PROXY_MADE", "Recorder"]

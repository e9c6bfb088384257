"""The response cache: what `previous_response_id` continues from (docs/protocol.md "The connection
cache", "Continuing and eviction", "What carries over").

Each cached response holds the full item list a continuation must send to a stateless
upstream: its parent's items, its own new input, its output. Items are kept as the bytes of
their JSON, serialised once when they arrive, so rebuilding a request is a concatenation.

Storage is shared, not copied: a response's list is a linked chain of `Link`s, each holding
the `Segment` one response in its ancestry added and a pointer to the link before it. A
child is its parent's last link plus one new link, so a turn costs the same at the 16,000th
link of a chain as at the first (nothing per entry grows with the history: no tuple of the
ancestry, and the item and byte totals are kept on each link). Bytes are accounted once per
distinct link held (a link is held by the entries ending at it and by the held links after
it), so a 30-turn chain with every turn cached costs the history once, not thirty times,
and evicting an entry whose links live on in its descendants frees nothing until they go.
What is charged is what is held (proxy/core/memory.py `Overheads`): an entry's objects and
its settings (`held`), each link's objects, each item's bytes object, beside the items'
bytes. On the token path an entry's token turns are shared along its chain the same way, and
each distinct turn is charged once, what it holds and its reference count; links and turns
are counted by one mechanism (proxy/core/memory.py `HeldChain`). A cache and the response
store that share links or turns each charge them.

Bounds: entries and bytes per connection (`ResponseCache`) and process-wide
(`CacheBudget`), least recently used evicted first. Entries that a queued request refers to
are *pinned* and never evicted until unpinned (docs/protocol.md "Forks"). If the only way to fit is
to drop the entry just added, `put` says so and the cache is as it was. Memory only.

Because bytes are charged per distinct segment and pinned entries cannot go, this is not
a `ByteLRU` (proxy/core/lru.py): the recency orders below are plain lru-dict maps (C, on
every turn's path) and the bounds are enforced here.

Each entry also carries its conversation's *call index* (proxy/core/calls.py): the `call_id`
of every tool call it holds, which a child extends with its own new items only.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import field
from typing import Any

from lru import LRU

from .calls import NO_CALLS, CallIndex, index_calls
from .memory import HELD, HeldChain, MemoryBudget, Overheads, chain_cost, held_turns
from .records import record
from .tokens.chain import TokenTurn

_UNBOUNDED = 2**31 - 1  # lru-dict needs a size; we evict by our own budgets, never by this
# stored responses a response keeps the ids of (`CachedResponse.stored_above`): enough that
# a continuation is registered under one of them when the nearest have expired or gone
STORED_ABOVE = 8


@record(eq=False)
class Segment:
    """The items one response added to its conversation: its new input, then its output."""

    items: tuple[bytes, ...]
    nbytes: int = field(init=False)
    # proxy/core/context/render.py's rendering of the items, with their token counts: a memo set
    # once, the first time the segment is continued from, and gone with the segment
    rendering: Any = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "nbytes", sum(len(i) for i in self.items))


class Link:
    """One step of a history: `segment` after the links before it (`up`), with the item and
    byte totals of the history up to and including it. Immutable by convention."""

    __slots__ = ("count", "depth", "segment", "total", "up")

    def __init__(self, segment: Segment, up: Link | None) -> None:
        self.segment: Segment = segment
        self.up: Link | None = up
        self.count: int = len(segment.items)
        self.total: int = segment.nbytes
        self.depth: int = 1  # links up to and including this one
        if up is not None:
            self.count += up.count
            self.total += up.total
            self.depth += up.depth

    def segments(self) -> list[Segment]:
        """The history's segments, oldest first (a walk of every link: O(links))."""
        out: list[Segment] = []
        at: Link | None = self
        while at is not None:
            out.append(at.segment)
            at = at.up
        out.reverse()
        return out


def linked(segments: Iterable[Segment]) -> Link | None:
    """The history of these segments, oldest first; None for none."""
    last: Link | None = None
    for seg in segments:
        last = Link(seg, last)
    return last


def _link_up(link: Link) -> Link | None:
    return link.up


@record(eq=False)
class CachedResponse:
    id: str
    lane: str | None  # the lane it ran on: same-lane failures evict, cross-lane forks do not
    history: Link | None  # the whole conversation: its newest link (None: nothing yet)
    settings: Mapping[str, Any] = field(default_factory=dict)  # the request minus its input
    calls: CallIndex = NO_CALLS  # every tool call of the conversation (the module's doc)
    opaque: bool = False  # holds a compaction item the index cannot see into
    # new text no moderation has seen (a `generate: false` turn's): the next turn that goes
    # to the model has it moderated with its own (core/guards.py)
    unmoderated: Collection[str] = ()
    # the upstream replica that served this response (upstream/pool.py), and the id of its
    # chain's first response: where the chain's next turn goes, and the session key upstream
    replica: str | None = None
    chain: str | None = None
    # its history may hold a compaction item (a byte scan of every segment added: see
    # `holds_compaction`), so a turn continuing it needs the context manager to render it
    compactions: bool = False
    # the token path (core/tokens/chain.py): its prompt's and its generation's ids, linked to
    # its parent's; None when it was not made on the token path or starts no token chain
    tokens: TokenTurn | None = None
    # the responses of its conversation that went to the response store, nearest first (itself
    # if it did, then its ancestors that did), at most `STORED_ABOVE`: a stored response
    # continuing it is registered under the first of them the store still holds, and deleted
    # with it (core/store.py "Deleting"); empty when none did
    stored_above: tuple[str, ...] = ()
    # bytes its own objects hold beside its links and its entry's fixed objects: its settings
    # (estimated from their JSON), its unseen text; in the store, its response object too
    held: int = 0

    def items(self) -> list[bytes]:
        """Every item of the conversation, oldest first: a new list, extended a segment at a
        time (several times faster than a generator over a long history of small items)."""
        out: list[bytes] = []
        if self.history is not None:
            for seg in self.history.segments():
                out.extend(seg.items)
        return out

    @property
    def segments(self) -> list[Segment]:
        """The conversation's segments, oldest first (a walk of the history: O(links))."""
        return self.history.segments() if self.history is not None else []

    @property
    def last(self) -> Segment | None:
        """The segment this response added (None for the empty conversation)."""
        return self.history.segment if self.history is not None else None

    @property
    def nbytes(self) -> int:
        """Its items' bytes (the whole history's)."""
        return self.history.total if self.history is not None else 0

    @property
    def item_count(self) -> int:
        return self.history.count if self.history is not None else 0

    def child(
        self,
        response_id: str,
        lane: str | None,
        added: Segment,
        settings: Mapping[str, Any],
        *,
        compacted: bool = False,
        opaque: bool = False,
        seen: Iterable[bytes] | None = None,
        unmoderated: Collection[str] = (),
        replica: str | None = None,
        chain: str | None = None,
        tokens: TokenTurn | None = None,
        stored: bool = False,
        held: int = 0,
    ) -> CachedResponse:
        """The conversation continued by `added`. `compacted`: `added` starts with what a
        compaction left of the history, so the parent's segments go, its index stays.
        `seen`: the items to index in place of `added`'s (compaction items expanded).
        `unmoderated`: the text of `added` that no moderation saw (a warmup's).
        `replica`, `chain`: where the response was served and its chain's key (routing.py);
        a response no replica served (a warmup) stays where its parent was.
        `stored`: it goes to the response store (it heads its `stored_above`). `held`:
        what its own objects hold (its `held` field)."""
        history = Link(added, None if compacted else self.history)
        calls = index_calls(self.calls, added.items if seen is None else seen)
        return CachedResponse(
            response_id,
            lane,
            history,
            settings,
            calls,
            self.opaque or opaque,
            unmoderated,
            replica if replica is not None else self.replica,
            chain if chain is not None else self.chain,
            self.compactions or compacted or opaque or holds_compaction(added.items),
            tokens,
            (response_id, *self.stored_above[: STORED_ABOVE - 1]) if stored else self.stored_above,
            held,
        )


def holds_compaction(items: Iterable[bytes]) -> bool:
    """Whether any of these items may be a compaction item (docs/protocol.md "Compaction"):
    its type's name is in its bytes. A false positive only costs a closer look."""
    return any(b'"compaction' in item for item in items)


EMPTY = CachedResponse("", None, None)


class CacheBudget:
    """Process-wide entry and byte bounds across every connection's cache, with one LRU order;
    with a `MemoryBudget`, also the room the process budget leaves (proxy/core/memory.py).
    `costs`: what each entry, link and item is charged beside its items' bytes."""

    def __init__(
        self,
        max_entries: int,
        max_bytes: int,
        memory: MemoryBudget | None = None,
        costs: Overheads = HELD,
    ) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.memory = memory
        self.costs = costs
        self.entries = 0
        self.nbytes = 0
        self.evictions = 0
        self._order: Any = LRU(_UNBOUNDED)  # (cache serial, response id) -> ResponseCache

    def _touch(self, owner: ResponseCache, rid: str) -> None:
        self._order[(owner.serial, rid)] = owner

    def _forget(self, owner: ResponseCache, rid: str) -> None:
        self._order.pop((owner.serial, rid), None)

    def over(self) -> bool:
        if self.nbytes > self.max_bytes or self.entries > self.max_entries:
            return True
        return self.memory is not None and self.memory.over()

    def could_hold(self, nbytes: int) -> bool:
        """Whether an entry of `nbytes` could fit at all, with everything else evicted."""
        if nbytes > self.max_bytes:
            return False
        return self.memory is None or nbytes <= self.memory.room_beside(self)

    def cost(self, entry: CachedResponse) -> int:
        """What `entry` is charged when nothing else holds any of its links or token turns
        (what `ResponseCache.put` charges then), without a walk."""
        c, history = self.costs, entry.history
        own = c.entry + entry.held + entry.nbytes + chain_cost(entry.tokens, c.turn)
        if history is None:
            return own
        return own + c.link * history.depth + c.item * history.count

    def link_cost(self, link: Link) -> int:
        """What one link is charged: its items' bytes and its objects."""
        return link.segment.nbytes + self.costs.link + self.costs.item * len(link.segment.items)

    def enforce(self) -> None:
        while self.over() and len(self._order):
            (_, rid), owner = self._order.peek_last_item()
            owner.evict(rid)
            self.evictions += 1


class ResponseCache:
    """One connection's cached responses (docs/protocol.md "The connection cache": in memory, gone
    with the socket)."""

    _serials = itertools.count()

    def __init__(self, budget: CacheBudget, max_entries: int, max_bytes: int) -> None:
        self.serial = next(self._serials)
        self.budget = budget
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.nbytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self._entries: dict[str, CachedResponse] = {}
        self._order: Any = LRU(_UNBOUNDED)  # unpinned ids, most recent first
        self._pins: dict[str, int] = {}
        # the links held, each counted by the entries ending at it plus the held links right
        # after it (`HeldChain`), and the token turns, counted the same way
        self._refs = self._links()
        self._turns = held_turns(budget.costs.turn)
        # called with the id of every entry that leaves (evicted, replaced or cleared), so an
        # owner that keeps more per entry (the store) forgets it in O(1)
        self.on_evict: Callable[[str], None] | None = None

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, rid: str) -> bool:
        return rid in self._entries

    def ids(self) -> list[str]:
        return list(self._entries)

    def get(self, rid: str) -> CachedResponse | None:
        """Look up a response for continuation; a hit makes it the most recently used."""
        entry = self._entries.get(rid)
        if entry is None:
            self.misses += 1
            return None
        self.hits += 1
        if rid in self._order:
            self._order[rid] = True
            self.budget._touch(self, rid)
        return entry

    def peek(self, rid: str) -> CachedResponse | None:
        return self._entries.get(rid)

    def put(self, entry: CachedResponse) -> bool:
        """Cache `entry` as the most recently used. False, with nothing changed, if it cannot
        fit alone or beside this connection's pinned entries."""
        cost = self.budget.cost(entry)
        if (
            cost > self.max_bytes
            or not self.budget.could_hold(cost)
            or min(self.max_entries, self.budget.max_entries) < 1
        ):
            return False  # it could never fit: refuse before evicting anything for it
        if self._pins and not self._fits_beside_pins(entry):
            return False
        if entry.id in self._entries:
            self.evict(entry.id)
        self._entries[entry.id] = entry
        added = self._refs.hold(entry.history) + self._turns.hold(entry.tokens)
        added += self.budget.costs.entry + entry.held
        self.nbytes += added
        self.budget.nbytes += added
        self.budget.entries += 1
        self._order[entry.id] = True
        self.budget._touch(self, entry.id)
        self._shrink()
        return entry.id in self._entries

    def _shrink(self) -> None:
        """Evict unpinned entries, least recently used first, until this connection is
        within its bounds; then bring the process-wide budget within its own."""
        while (self.nbytes > self.max_bytes or len(self._entries) > self.max_entries) and len(
            self._order
        ):
            self.evict(self._order.peek_last_item()[0])
            self.evictions += 1
        self.budget.enforce()

    def _fits_beside_pins(self, entry: CachedResponse) -> bool:
        """Whether `entry` fits this connection's bounds next to the pinned entries, which
        eviction cannot remove; otherwise `put` would evict others and then `entry` too."""
        pinned = [self._entries[rid] for rid in self._pins if rid != entry.id]
        if len(pinned) + 1 > self.max_entries:
            return False
        entries = (*pinned, entry)
        if sum(self.budget.cost(e) for e in entries) <= self.max_bytes:
            return True  # fits even if nothing were shared: no walk
        held = sum(self.budget.costs.entry + e.held for e in entries)
        # the distinct links and token turns of all these entries, each walked once
        links, turns = self._links(), held_turns(self.budget.costs.turn)
        held += sum(links.hold(e.history) + turns.hold(e.tokens) for e in entries)
        return held <= self.max_bytes

    def _links(self) -> HeldChain[Link]:
        return HeldChain(_link_up, self.budget.link_cost)

    def evict(self, rid: str) -> bool:
        entry = self._entries.pop(rid, None)
        if entry is None:
            return False
        self._pins.pop(rid, None)
        self._order.pop(rid, None)
        self.budget._forget(self, rid)
        freed = self._refs.release(entry.history) + self._turns.release(entry.tokens)
        freed += self.budget.costs.entry + entry.held
        self.nbytes -= freed
        self.budget.nbytes -= freed
        self.budget.entries -= 1
        if self.on_evict is not None:
            self.on_evict(rid)
        return True

    def pin(self, rid: str) -> bool:
        """Protect an entry from eviction while a queued request refers to it."""
        if rid not in self._entries:
            return False
        self._pins[rid] = self._pins.get(rid, 0) + 1
        self._order.pop(rid, None)
        self.budget._forget(self, rid)
        return True

    def unpin(self, rid: str) -> None:
        n = self._pins.get(rid)
        if n is None:
            return
        if n > 1:
            self._pins[rid] = n - 1
            return
        del self._pins[rid]
        self._order[rid] = True
        self.budget._touch(self, rid)
        self._shrink()  # an unpinned entry may now be evictable

    def clear(self) -> None:
        for rid in list(self._entries):
            self.evict(rid)

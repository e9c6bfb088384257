"""`MemoryBudget`: one process-wide bound on the bytes clients can make the proxy hold.

Five parts count against it, each still within its own bound:

- `cache`: the connection caches (proxy/core/conversation.py; `cache.process_max_*`),
- `store`: the response store (proxy/core/store.py; `store.max_*`),
- `lost_writes`: what that store remembers of the writes it did not make, for a `DELETE` to
  reach what continues them (`store.max_entries` of them),
- `queued`: the `response.create` messages waiting on their connection
  (`limits.max_queued_bytes_per_connection` each),
- `outbound`: the bytes written for clients and not yet taken by their sockets
  (`server.outbound_buffer_bytes` each; the WebSocket front reports them after each write).

What happens at the bound depends on whether a part can give memory back. The caches and the
store can: a put that takes the total past the budget evicts that part's least recently used
entries until it fits (or the put is refused, as for its own bound). Queued creates cannot be
dropped once accepted, so a create is refused instead (429 `too_many_queued_requests`) when
queued and outbound bytes with it would exceed the budget. Outbound bytes are bounded per
connection by backpressure; they are counted, so the other parts make room for them. So are
the remembered writes, bounded by their count: the caches and the store make room for them.

What a cached or stored response is charged is what it holds (`Overheads`, docs/memory.md
"What an entry costs"): its items' bytes, its token turns on the token path, and the
Python objects around them, at sizes measured with tracemalloc (tests/support/held_costs.py
measures them again; a unit test holds these figures to that measurement).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from .tokens.chain import NO_IDS_YET, TokenTurn


@dataclass(frozen=True, slots=True)
class Overheads:
    """Bytes charged for a cached response's objects, beyond its items' own bytes."""

    entry: int  # a response: its objects, its settings' dict, its places in the indexes
    link: int  # a link of its history (held once, however many responses share it)
    item: int  # an item: its bytes object's header and its slot in the link's tuple
    stored: int  # in the response store, a record beside the entry: key, expiry, metadata
    # a token turn (the token path), beside what it holds (`TokenTurn.nbytes`): its reference
    # count in the cache (held once, however many responses share it)
    turn: int = 0


# measured on CPython 3.11 (docs/memory.md "What an entry costs")
HELD = Overheads(entry=640, link=320, item=48, stored=860, turn=140)
# items' and ids' bytes only: for tests of the accounting's mechanics
ITEMS_ONLY = Overheads(entry=0, link=0, item=0, stored=0, turn=0)
# bytes of Python objects per byte of a request's settings as JSON (instructions, tools):
# a long string holds about its length, a tools list about 4 times it (measured)
SETTINGS_FACTOR = 2


class HoldsBytes(Protocol):
    @property
    def nbytes(self) -> int: ...


class MemoryBudget:
    """The bytes of every part, their sum, and the budget they share."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.queued = 0  # bytes of creates waiting, all connections
        self.outbound = 0  # bytes written for clients and not yet sent, all connections
        self.refused = 0  # creates refused because the budget was reached
        self._held: dict[str, HoldsBytes] = {}  # the evictable parts: "cache", "store"

    def add_part(self, name: str, part: HoldsBytes) -> None:
        self._held[name] = part

    def parts(self) -> dict[str, int]:
        """Bytes per part, by name (what /metrics shows)."""
        out = {name: part.nbytes for name, part in self._held.items()}
        out["queued"] = self.queued
        out["outbound"] = self.outbound
        return out

    @property
    def nbytes(self) -> int:
        return self.queued + self.outbound + sum(p.nbytes for p in self._held.values())

    def over(self) -> bool:
        return self.nbytes > self.max_bytes

    def room_beside(self, part: HoldsBytes) -> int:
        """How many bytes `part` may hold at most: the budget minus every other part."""
        return self.max_bytes - (self.nbytes - part.nbytes)

    def can_queue(self, nbytes: int) -> bool:
        """Whether a create of `nbytes` may wait: the parts that cannot give memory back
        (queued creates, outbound buffers) stay within the budget with it."""
        return self.queued + self.outbound + nbytes <= self.max_bytes


# ---------------------------------------------------------------- what chains of nodes hold
# A history's links each hold the link before them, and on the token path a response's token
# turns each hold their parent's turn (core/tokens/chain.py). A child's node points at its
# parent's, so a chain's nodes are shared by every response that continues it: each distinct
# node is counted once, with a reference count of the holders whose node it is plus the held
# nodes right after it. Holding a node walks only the nodes new to the count, and letting one
# go frees only the nodes nothing else holds. The counts are keyed by identity (a `TokenTurn`
# compares by value, so hashing one would hash its whole chain); each count keeps its node
# beside it, so no id is reused while counted.

N = TypeVar("N")


class HeldChain(Generic[N]):
    """The distinct nodes held and their reference counts. `up`: the node a node holds (None
    at a chain's start); `cost`: the bytes a node is charged; `free`: a node shared by the
    whole process that costs nothing and holds nothing (None: there is none)."""

    __slots__ = ("_cost", "_free", "_refs", "_up")

    def __init__(
        self, up: Callable[[N], N | None], cost: Callable[[N], int], free: N | None = None
    ) -> None:
        self._up = up
        self._cost = cost
        self._free = free
        self._refs: dict[int, tuple[N, int]] = {}

    def __len__(self) -> int:
        return len(self._refs)

    def hold(self, node: N | None) -> int:
        """One more reference to `node`; the bytes newly held. A node held for the first
        time holds the one before it, so this walks only the nodes new to the count."""
        refs, up, cost, free = self._refs, self._up, self._cost, self._free
        added = 0
        while node is not None and node is not free:
            key = id(node)
            held = refs.get(key)
            refs[key] = (node, 1 if held is None else held[1] + 1)
            if held is not None:
                break
            added += cost(node)
            node = up(node)
        return added

    def release(self, node: N | None) -> int:
        """One reference fewer to `node`; the bytes no longer held (a node nothing holds
        lets go of the one before it)."""
        refs, up, cost, free = self._refs, self._up, self._cost, self._free
        freed = 0
        while node is not None and node is not free:
            key = id(node)
            n = refs[key][1] - 1
            if n:
                refs[key] = (node, n)
                break
            del refs[key]
            freed += cost(node)
            node = up(node)
        return freed


def held_turns(per_turn: int) -> HeldChain[TokenTurn]:
    """A count of token turns, each charged what it held of its own when it was made (`total`
    less its parent's: the same figure when it is let go, whatever happened to it since) and
    `per_turn` for its place in the count (the key, the count, the dict's slot). `NO_IDS_YET`
    (one object for the whole process) costs nothing."""

    def cost(turn: TokenTurn) -> int:
        up = turn.parent
        return turn.total - (0 if up is None else up.total) + per_turn

    return HeldChain(_parent, cost, NO_IDS_YET)


def _parent(turn: TokenTurn) -> TokenTurn | None:
    return turn.parent


def chain_cost(turn: TokenTurn | None, per_turn: int) -> int:
    """What `turn`'s whole chain is charged in a cache that holds none of it, `per_turn`
    beside what each turn holds; no walk (`TokenTurn.total`, `depth`)."""
    if turn is None or turn is NO_IDS_YET:
        return 0
    return turn.total + per_turn * turn.depth

"""`HeldTurns`: the token turns one cache holds, each charged once however many of its
responses share it (docs/memory.md "What an entry costs").

A cached response on the token path holds its `TokenTurn`, and through `parent` every turn
before it (core/tokens/chain.py). A child's turn points at its parent's, so the turns of a
chain are shared exactly as the links of its history are (core/conversation.py): each
distinct turn is counted once, with a reference count of the entries whose turn it is plus
the held turns right after it. Holding a turn walks only the turns new to the cache, and
letting one go frees only the turns nothing else holds.

The counts are keyed by identity: a `TokenTurn` compares by value, so hashing one would hash
its whole chain. Each count keeps its turn beside it, so no id is reused while counted.
"""

from __future__ import annotations

from .chain import NO_IDS_YET, TokenTurn


class HeldTurns:
    """The distinct turns held and their reference counts. `per_turn`: bytes charged for
    each beside what it holds (its place here: the key, the count, the dict's slot)."""

    __slots__ = ("_refs", "per_turn")

    def __init__(self, per_turn: int) -> None:
        self.per_turn = per_turn
        self._refs: dict[int, tuple[TokenTurn, int]] = {}

    def __len__(self) -> int:
        return len(self._refs)

    def cost(self, turn: TokenTurn) -> int:
        """What one turn is charged: what it held of its own when it was made (`total` less
        its parent's: the same figure when it is let go, whatever happened to it since) and
        its place here."""
        up = turn.parent
        return turn.total - (0 if up is None else up.total) + self.per_turn

    def hold(self, turn: TokenTurn | None) -> int:
        """One more reference to `turn`; the bytes newly held. A turn held for the first
        time holds its parent, so this walks only the turns new to the cache. `None` and
        `NO_IDS_YET` (one object for the whole process) cost nothing."""
        refs = self._refs
        added = 0
        while turn is not None and turn is not NO_IDS_YET:
            key = id(turn)
            held = refs.get(key)
            refs[key] = (turn, 1 if held is None else held[1] + 1)
            if held is not None:
                break
            added += self.cost(turn)
            turn = turn.parent
        return added

    def release(self, turn: TokenTurn | None) -> int:
        """One reference fewer to `turn`; the bytes no longer held (a turn nothing holds
        lets go of its parent)."""
        refs = self._refs
        freed = 0
        while turn is not None and turn is not NO_IDS_YET:
            key = id(turn)
            n = refs[key][1] - 1
            if n:
                refs[key] = (turn, n)
                break
            del refs[key]
            freed += self.cost(turn)
            turn = turn.parent
        return freed


def chain_cost(turn: TokenTurn | None, per_turn: int) -> int:
    """What `turn`'s whole chain is charged in a cache that holds none of it, `per_turn`
    beside what each turn holds; no walk (`TokenTurn.total`, `depth`)."""
    if turn is None or turn is NO_IDS_YET:
        return 0
    return turn.total + per_turn * turn.depth


__all__ = ["HeldTurns", "chain_cost"]

"""The token cache: each response's exact ids, and how a continuation reuses them
(docs/tokens.md "The token cache").

A response made on the token path keeps a `TokenTurn`: what its prompt added after its
parent's turn (the rendered text and its ids) and what the model generated (the text the
server streamed and the ids it reported, never re-encoded). Turns link to their parent, so a
chain of n turns holds each id once: memory grows with the chain, not with its square.

A continuation (core/tokens/walk.py) lines the parent's segments (prompt pieces,
generation, prompt pieces, ...) up with the rendered conversation: each segment whose text is
where the rendering has it keeps its ids. Normally every segment matches and the new text is
just what the template writes after the last generation (the end of the assistant's turn,
the new input, the generation prompt), so a turn's tokenising is proportional to its new
input.

A segment that does not match is a divergence, counted by reason (`DIVERGENCES`), never
silent: the template rewrote the history (`history_changed`: an edited instruction,
truncation), or rendered a generation other than the model wrote it
(`generation_rerendered`: a tool call re-serialised, reasoning dropped, text after a tool call
cut), or the parent has no ids at all (`parent_without_ids`: made on another path). Only the
text from there to the next place where the history is as it was (a later segment, at a turn
marker) is tokenised again, and the ids after it are kept. Segments begin where a
tokenisation was cut before (the start of a prompt, of a generation, a turn marker, which is
a special token the server tokenises on its own), so a cut there is one the server's own
tokenising of the whole text makes too. A different model, template, tool set or engine
(`fingerprint`) starts afresh.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from sys import getsizeof
from typing import Any, Final, TypeAlias

from .. import wire

# why a continuation could not keep every id of its parent (the metric's `reason` label)
DIVERGENCES: Final = (
    "fingerprint",
    "history_changed",
    "generation_rerendered",
    "parent_without_ids",
)


@dataclass(frozen=True, slots=True)
class Segment:
    text: str  # as rendered (a prompt part) or as streamed (a generation)
    ids: array[int]  # their ids, exactly as the server tokenised or generated them
    json: bytes  # the ids as JSON array elements ("1,2,3"), built once

    @staticmethod
    def of(text: str, ids: list[int] | array[int]) -> Segment:
        if isinstance(ids, array):
            return Segment(text, ids, ids_json(ids.tolist()))
        return Segment(text, array("i", ids), ids_json(ids))

    @property
    def nbytes(self) -> int:
        """What it holds: its object, its text, its ids' array (with the room an array that
        grew by appends keeps), their JSON. `getsizeof` is what each was allocated."""
        text, ids, json = self.text, self.ids, self.json
        return getsizeof(self) + getsizeof(text) + getsizeof(ids) + getsizeof(json)


def ids_json(ids: list[int]) -> bytes:
    """Ids (in `identity.ID_LIMIT`) as JSON array elements: "1,2,3"."""
    return wire.dumps(ids)[1:-1]


EMPTY_SEGMENT: Final = Segment("", array("i"), b"")
_INT: Final = getsizeof(1 << 20)  # an int object past the cached small ones


@dataclass(frozen=True, slots=True, weakref_slot=True)
class TokenTurn:
    """One response's tokens, linked to its parent's."""

    parent: TokenTurn | None
    fingerprint: str  # model, template, tools and engine (`fingerprint`)
    # what its prompt added after the parent's generation, cut before each turn marker
    # (`split_at_turns`), so that a change in one message keeps the ids of those before it
    prompt: tuple[Segment, ...]
    generated: Segment  # what the model generated
    logprobs: array[float] | None = None  # one per generated id, when they were asked for
    eos: bool = False  # generation ended on the model's end-of-generation token
    prompt_length: int = 0  # ids of its whole prompt
    # the turns of its chain up to and including it, and the bytes they hold (`nbytes`
    # summed): what holding the chain costs, known without walking it (like `Link`'s)
    depth: int = field(init=False, compare=False, repr=False)
    total: int = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        up = self.parent
        object.__setattr__(self, "depth", 1 if up is None else up.depth + 1)
        object.__setattr__(self, "total", self.nbytes + (0 if up is None else up.total))

    def segments(self) -> list[Segment]:
        """The chain's segments, oldest first."""
        turns: list[TokenTurn] = []
        turn: TokenTurn | None = self
        while turn is not None:
            turns.append(turn)
            turn = turn.parent
        out: list[Segment] = []
        for t in reversed(turns):
            out.extend(t.prompt)
            out.append(t.generated)
        return out

    def prompt_ids(self) -> list[int]:
        """The ids of this turn's whole prompt (what the server was sent)."""
        segs = self.segments()[:-1]
        out: list[int] = []
        for s in segs:
            out.extend(s.ids)
        return out

    @property
    def nbytes(self) -> int:
        """What this turn holds of its own (its parent's are counted with the parent): its
        object and fingerprint, its prompt's tuple and segments, its generation, its
        logprobs, and the ints of its `depth` and `total`."""
        held = getsizeof(self) + getsizeof(self.fingerprint) + self.generated.nbytes + 2 * _INT
        if self.prompt:  # the empty tuple is shared
            held += getsizeof(self.prompt) + sum(s.nbytes for s in self.prompt)
        if self.logprobs is not None:
            held += getsizeof(self.logprobs)
        return held


# the token turn of a conversation that so far has input only (`generate: false` warmups
# from its start): nothing to reuse, nothing diverged; its empty fingerprint fits any
NO_IDS_YET: Final = TokenTurn(None, "", (), EMPTY_SEGMENT)


def split_at_turns(
    text: str, ids: list[int], marker: tuple[str, int] | None
) -> tuple[Segment, ...]:
    """The segments of one tokenised text, cut before each turn marker (`marker`: the
    special token that starts a turn, as text and id, `<start_of_turn>` and 105, say). A
    special token is tokenised on its own, so each piece is exactly what tokenising it alone
    gives. The text and the ids must show the marker equally often; else one segment."""
    if marker is None or not text:
        return (Segment.of(text, ids),)
    mark, mark_id = marker
    found = _find_all(text, mark)
    cuts_ids = [i for i, x in enumerate(ids) if x == mark_id]
    if found and found[0] == 0:  # the first piece starts with it (after a BOS, maybe)
        found, cuts_ids = found[1:], cuts_ids[1:]
    cuts_text = found
    if len(cuts_text) != len(cuts_ids) or not cuts_text:
        return (Segment.of(text, ids),)
    out = []
    for a, b, c, d in zip(
        [0, *cuts_text], [*cuts_text, len(text)], [0, *cuts_ids], [*cuts_ids, len(ids)], strict=True
    ):
        out.append(Segment.of(text[a:b], ids[c:d]))
    return tuple(out)


def _find_all(text: str, mark: str) -> list[int]:
    out, at = [], text.find(mark)
    while at >= 0:
        out.append(at)
        at = text.find(mark, at + len(mark))
    return out


@dataclass(frozen=True, slots=True)
class TokenUse:
    """What one turn's prompt took from the cache (`Finished.tokens`)."""

    reused: int  # ids kept from the parent's chain
    new: int  # ids the server tokenised for this turn
    divergences: tuple[str, ...] = ()  # one of DIVERGENCES per divergence, in order

    @property
    def divergence(self) -> str | None:
        """The first divergence, if any (what the console shows)."""
        return self.divergences[0] if self.divergences else None


@dataclass(frozen=True, slots=True)
class Gap:
    """Rendered text the server tokenises: the new text at the end (`reason` None), or a
    part of the history that diverged (`reason`, one of DIVERGENCES)."""

    text: str
    reason: str | None = None
    # the id to leave out if the text's ids begin with it: the end-of-generation token the
    # model produced just before, which the template writes again after the generation
    repeated: int | None = None


@dataclass(frozen=True, slots=True)
class Reused:
    """An earlier turn's generation kept after a divergence, ids as the model made them."""

    turn: TokenTurn


Part: TypeAlias = Segment | Reused | Gap


@dataclass(frozen=True, slots=True)
class Continuation:
    """How one turn's prompt is made from its parent's ids and the rendered text: the ids
    through `base`, then `parts` in order: segments and generations kept after a divergence,
    and gaps of text to tokenise (the last part is always a gap: the new text)."""

    base: TokenTurn | None  # the chain the prompt continues whole (None: none of it)
    kept: tuple[bytes, ...]  # JSON pieces of the ids through `base`, oldest first
    parts: tuple[Part, ...]
    kept_ids: int  # ids kept: through `base`, and those of the kept parts
    divergences: tuple[str, ...] = ()  # one per divergence, in order

    @property
    def gaps(self) -> tuple[Gap, ...]:
        return tuple(p for p in self.parts if isinstance(p, Gap))

    @property
    def text(self) -> str:
        """All the text to tokenise, the gaps joined (one gap, normally: the new text)."""
        return "".join(g.text for g in self.gaps)

    @property
    def divergence(self) -> str | None:
        return self.divergences[0] if self.divergences else None

    @property
    def repeated(self) -> int | None:
        """The id the new text's ids leave out if they begin with it (the last gap's)."""
        last = self.parts[-1] if self.parts else None
        return last.repeated if isinstance(last, Gap) else None


def fresh(rendered: str, divergence: str | None = None) -> Continuation:
    why = (divergence,) if divergence else ()
    return Continuation(None, (), (Gap(rendered, divergence),), 0, why)


def turn_after(
    plan: Continuation,
    ids: Sequence[list[int]],
    marker: tuple[str, int] | None,
    fingerprint: str,
    generated: Segment,
    *,
    logprobs: array[float] | None = None,
    eos: bool = False,
) -> TokenTurn:
    """The turn a response made from `plan` keeps: its prompt after the plan's base (the
    kept parts and each gap's text with its `ids`, cut before each turn `marker`) and what
    the model `generated`. A generation kept after a divergence (`Reused`) ends a turn of
    its own, so the chain still reads prompt, generation, prompt, ..."""
    prev = plan.base
    # ids through the base: the kept ones but those of the kept parts
    length = plan.kept_ids - sum(
        len(p.turn.generated.ids if isinstance(p, Reused) else p.ids)
        for p in plan.parts
        if not isinstance(p, Gap)
    )
    pieces: list[Segment] = []
    gaps = iter(ids)
    for part in plan.parts:
        if isinstance(part, Gap):
            new = next(gaps)
            if part.text:
                pieces.extend(split_at_turns(part.text, new, marker))
            length += len(new)
        elif isinstance(part, Reused):
            t = part.turn
            prev = TokenTurn(
                prev, fingerprint, tuple(pieces), t.generated, t.logprobs, t.eos, length
            )
            length += len(t.generated.ids)
            pieces = []
        else:
            pieces.append(part)
            length += len(part.ids)
    return TokenTurn(
        prev,
        fingerprint,
        tuple(pieces),
        generated,
        logprobs=logprobs,
        eos=eos,
        prompt_length=length,
    )


# ---------------------------------------------------------------- stored (the Redis store)


def turn_record(t: TokenTurn) -> dict[str, Any]:
    """One turn as JSON values, its parent left out."""
    rec: dict[str, Any] = {
        "f": t.fingerprint,
        "p": [[seg.text, seg.ids.tolist()] for seg in t.prompt],
        "gt": t.generated.text,
        "gi": t.generated.ids.tolist(),
        "eos": t.eos,
        "n": t.prompt_length,
    }
    if t.logprobs is not None:
        rec["lp"] = t.logprobs.tolist()
    return rec


def turn_of(rec: Mapping[str, Any], parent: TokenTurn | None) -> TokenTurn:
    """The turn `turn_record` wrote, linked to `parent`."""
    lp = rec.get("lp")
    return TokenTurn(
        parent,
        rec["f"],
        tuple(Segment.of(text, ids) for text, ids in rec["p"]),
        Segment.of(rec["gt"], rec["gi"]),
        logprobs=array("d", lp) if isinstance(lp, list) else None,
        eos=bool(rec.get("eos")),
        prompt_length=int(rec.get("n", 0)),
    )


def chain_records(turn: TokenTurn | None, stop: TokenTurn | None) -> list[dict[str, Any]]:
    """The turns from `turn` back to (not including) `stop`, oldest first, as records."""
    out: list[dict[str, Any]] = []
    while turn is not None and turn is not stop:
        out.append(turn_record(turn))
        turn = turn.parent
    out.reverse()
    return out


def prompt_json(c: Continuation, *new: bytes) -> bytes:
    """The prompt as a JSON array: the kept ids and, in place of each gap, `new`'s piece
    (that gap's ids as JSON array elements), in order."""
    pieces = list(c.kept)
    gaps = iter(new)
    for part in c.parts:
        if isinstance(part, Gap):
            piece = next(gaps, b"")
        elif isinstance(part, Reused):
            piece = part.turn.generated.json
        else:
            piece = part.json
        if piece:
            pieces.append(piece)
    return b"[" + b",".join(pieces) + b"]"


def new_ids(c: Continuation | Gap, ids: list[int]) -> list[int]:
    """A gap's ids as they go into the prompt (a continuation: its last gap's): an
    end-of-generation id the model already produced is not repeated."""
    repeated = c.repeated
    if repeated is not None and ids and ids[0] == repeated:
        return ids[1:]
    return ids


__all__ = [
    "DIVERGENCES",
    "EMPTY_SEGMENT",
    "NO_IDS_YET",
    "Continuation",
    "Gap",
    "Part",
    "Reused",
    "Segment",
    "TokenTurn",
    "TokenUse",
    "chain_records",
    "fresh",
    "ids_json",
    "new_ids",
    "prompt_json",
    "split_at_turns",
    "turn_after",
    "turn_of",
    "turn_record",
]

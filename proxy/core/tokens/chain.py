"""The token cache: each response's exact ids, and how a continuation reuses them
(docs/tokens.md "The token cache").

A response made on the token path keeps a `TokenTurn`: what its prompt added after its
parent's turn (the rendered text and its ids) and what the model generated (the text the
server streamed and the ids it reported, never re-encoded). Turns link to their parent, so a
chain of n turns holds each id once: memory grows with the chain, not with its square.

A continuation renders the whole conversation with the chat template, then walks the parent's
segments (prompt, generation, prompt, generation, ...) along the rendered text: each segment
whose text is where the rendering has it keeps its ids. What follows the last kept segment is
the only text tokenised. Normally every segment matches and the new text is just what the
template writes after the last generation (the end of the assistant's turn, the new input, the
generation prompt), so a turn's tokenising is proportional to its new input.

A segment that does not match is a divergence, counted by reason (`DIVERGENCES`), never
silent: the template rewrote the history (`history_changed`: an edited instruction, a
template that drops earlier reasoning), or rendered a generation other than the model wrote it
(`generation_rerendered`: a tool call re-serialised, reasoning dropped, text after a tool call
cut), or the parent has no ids at all (`parent_without_ids`: made on another path). The ids
before that segment are kept and the rest is tokenised again. Segments begin where a
tokenisation was cut before (the start of a prompt, the start of a generation), so a cut
there is one the server has already seen. A different model, template, tool set or
engine (`fingerprint`) starts afresh.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

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
        a = ids if isinstance(ids, array) else array("i", ids)
        return Segment(text, a, ",".join(map(str, a)).encode())

    @property
    def nbytes(self) -> int:
        return len(self.text) + 4 * len(self.ids) + len(self.json) + 64


EMPTY_SEGMENT: Final = Segment("", array("i"), b"")


@dataclass(frozen=True, slots=True)
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
        """What this turn holds of its own (its parent's are counted with the parent)."""
        logprobs = 8 * len(self.logprobs) if self.logprobs is not None else 0
        held = sum(s.nbytes for s in self.prompt) + self.generated.nbytes
        return held + logprobs + 96


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
    divergence: str | None  # one of DIVERGENCES, or None


@dataclass(frozen=True, slots=True)
class Continuation:
    """How one turn's prompt is made from its parent's ids and the rendered text."""

    base: TokenTurn | None  # the new turn's parent in the token chain (kept ids end there)
    kept: tuple[bytes, ...]  # JSON pieces of the kept ids, oldest first
    kept_ids: int  # how many ids are kept
    text: str  # the text to tokenise: everything after the kept ids
    # the id to leave out if the new text's ids begin with it: the end-of-generation token
    # the model produced, which the template writes again after the generation
    repeated: int | None
    divergence: str | None  # one of DIVERGENCES, or None


def fresh(rendered: str, divergence: str | None = None) -> Continuation:
    return Continuation(None, (), 0, rendered, None, divergence)


def continue_from(
    parent: TokenTurn | None, rendered: str, fingerprint: str, turn_end: str = ""
) -> Continuation:
    """The continuation of `parent`'s chain by the conversation `rendered` as a whole.
    `turn_end` is what the template writes after a model's turn (`<end_of_turn>` and a line
    break, say): the last generation must be followed by it, else the history shows more or
    other than the model wrote (its text matched only as a prefix)."""
    if parent is None:
        return fresh(rendered)
    if not parent.fingerprint:  # NO_IDS_YET (or it read back from the store)
        return fresh(rendered)
    if parent.fingerprint != fingerprint:
        return fresh(rendered, "fingerprint")
    turns: list[TokenTurn] = []
    turn: TokenTurn | None = parent
    while turn is not None:
        turns.append(turn)
        turn = turn.parent
    turns.reverse()
    kept: list[bytes] = []
    kept_ids = 0
    at = 0
    base: TokenTurn | None = None
    for t in turns:
        for j, seg in enumerate(t.prompt):
            if not rendered.startswith(seg.text, at):
                # the segments of this prompt before it stay, as a turn that generated nothing
                head = TokenTurn(base, fingerprint, t.prompt[:j], EMPTY_SEGMENT) if j else base
                return _cut(head, kept, kept_ids, rendered, at, "history_changed")
            kept.append(seg.json)
            kept_ids += len(seg.ids)
            at += len(seg.text)
        gen = t.generated
        rerendered = not rendered.startswith(gen.text, at)
        if not rerendered and t is parent and turn_end:
            # the last generation must be followed by the end of a model's turn, else the
            # history shows more or other than the model wrote (it matched as a prefix only)
            rerendered = not rendered.startswith(turn_end, at + len(gen.text))
        if rerendered:  # its prompt stays; its generation is tokenised again as rendered
            head = TokenTurn(base, fingerprint, t.prompt, EMPTY_SEGMENT)
            return _cut(head, kept, kept_ids, rendered, at, "generation_rerendered")
        at += len(gen.text)
        kept.append(gen.json)
        kept_ids += len(gen.ids)
        base = t
    last = parent.generated.ids
    repeated = last[-1] if parent.eos and last else None
    return Continuation(base, tuple(p for p in kept if p), kept_ids, rendered[at:], repeated, None)


def _cut(
    base: TokenTurn | None, kept: list[bytes], kept_ids: int, rendered: str, at: int, why: str
) -> Continuation:
    return Continuation(base, tuple(p for p in kept if p), kept_ids, rendered[at:], None, why)


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


def prompt_json(c: Continuation, new: bytes) -> bytes:
    """The prompt as a JSON array: the kept ids, then `new` (the new text's ids as JSON
    array elements)."""
    pieces = [*c.kept, new] if new else list(c.kept)
    return b"[" + b",".join(pieces) + b"]"


def new_ids(c: Continuation, ids: list[int]) -> list[int]:
    """The new text's ids as they go into the prompt: an end-of-generation id the model
    already produced is not repeated."""
    if c.repeated is not None and ids and ids[0] == c.repeated:
        return ids[1:]
    return ids


__all__ = [
    "DIVERGENCES",
    "EMPTY_SEGMENT",
    "NO_IDS_YET",
    "Continuation",
    "Segment",
    "TokenTurn",
    "TokenUse",
    "chain_records",
    "continue_from",
    "fresh",
    "new_ids",
    "prompt_json",
    "split_at_turns",
    "turn_of",
    "turn_record",
]

"""A continuation's walk along the parent's token chain (docs/tokens.md "The token cache"):
which of the parent's ids a turn keeps, and which text it has tokenised again.

`continue_after` is the usual case, where the conversation is known to go on from the
parent's prompt (core/tokens/incremental.py): only the parent's generation is compared.
`continue_from` walks the whole chain along a whole rendering, and after a divergence finds
where the history is again as it was, so that only the part that changed is tokenised again.
"""

from __future__ import annotations

from typing import Final

from .chain import EMPTY_SEGMENT, Continuation, Gap, Part, Reused, Segment, TokenTurn, fresh

# how many later segments a divergence tries as the place where the history is again as
# it was (each one a search of the rendered text): a bound on the failure path's work
MAX_ANCHORS: Final = 64


def continue_from(
    parent: TokenTurn | None,
    rendered: str,
    fingerprint: str,
    turn_end: str = "",
    marker: str = "",
) -> Continuation:
    """The continuation of `parent`'s chain by the conversation `rendered` as a whole.

    `turn_end` is what the template writes after a model's turn (`<end_of_turn>` and a line
    break, say): the last generation must be followed by it, else the history shows more or
    other than the model wrote (its text matched only as a prefix). `marker` is the special
    token turns start with (`<start_of_turn>`): after a divergence the walk looks for a later
    segment that starts with it, found where the rendering has it, and keeps the ids from
    there on; only the text in between is tokenised again. "" tokenises everything after a
    divergence again."""
    if parent is None or not parent.fingerprint:  # NO_IDS_YET (or it read back so)
        return fresh(rendered)
    if parent.fingerprint != fingerprint:
        return fresh(rendered, "fingerprint")
    return _Walk(parent, rendered, fingerprint, turn_end, marker).run()


def continue_after(
    parent: TokenTurn,
    tail: str,
    prompt_end: str,
    fingerprint: str,
    turn_end: str = "",
    chain: tuple[tuple[bytes, ...], int] | None = None,
) -> Continuation | None:
    """The continuation of `parent`'s chain when the conversation is known to be the
    parent's prompt followed by `tail` (core/tokens/incremental.py): the parent's prompt
    ended with `prompt_end` (its generation prompt), which `tail` must begin with too, else
    None (render whole). Only the parent's generation is compared: the work is the new
    text's, not the history's. `chain`: the JSON pieces of the parent's chain and how many
    ids they hold, when they are known (the memo keeps them), else they are walked."""
    if not parent.fingerprint or parent.fingerprint != fingerprint:
        return None
    if not tail.startswith(prompt_end):
        return None
    at = len(prompt_end)
    gen = parent.generated
    if chain is None:
        segments = parent.segments()
        chain = tuple(s.json for s in segments if s.json), sum(len(s.ids) for s in segments)
    kept, n = chain
    end = at + len(gen.text)
    if tail.startswith(gen.text, at) and (not turn_end or tail.startswith(turn_end, end)):
        repeated = gen.ids[-1] if parent.eos and gen.ids else None
        return Continuation(parent, kept, (Gap(tail[end:], None, repeated),), n)
    # the generation renders otherwise: its prompt stays, the rest is tokenised again
    head = TokenTurn(parent.parent, fingerprint, parent.prompt, EMPTY_SEGMENT)
    if gen.json:
        kept = kept[:-1]
    why = "generation_rerendered"
    return Continuation(head, kept, (Gap(tail[at:], why),), n - len(gen.ids), (why,))


class _Walk:
    """The parent's segments (prompt pieces, generation, prompt pieces, ...) along the
    rendered text. Theory of operation: each segment found where the rendering has it is
    kept. At one that is not (a divergence), a gap starts; it ends before the first later
    segment that starts with the turn marker and is found further on (with the segment after
    it right behind it), or at the end. Kept ids before the first divergence stay the chain
    (`base`); after it they are parts of the new turn's prompt, each generation with its
    turn (`Reused`), so that the chain still reads prompt, generation, prompt, ...

    A gap starts only where the server's own tokenising of the whole text cuts too (`_cut`):
    at a turn marker (a special token), at the start of a generation (where a prompt ended
    before), or right after a kept generation where the end of the model's turn follows
    (`turn_end`: its end-of-generation id, when the model produced one, is then not sent
    twice). Elsewhere the kept segments before it are given back, one by one, until one of
    those places is reached: so a generation that matched only as the start of longer text,
    or a piece whose text runs on, is tokenised again with what follows."""

    def __init__(
        self, parent: TokenTurn, rendered: str, fingerprint: str, turn_end: str, marker: str
    ) -> None:
        turns: list[TokenTurn] = []
        turn: TokenTurn | None = parent
        while turn is not None:
            turns.append(turn)
            turn = turn.parent
        turns.reverse()
        # (turn, j): the turn's prompt piece j, or its generation when j == len(prompt)
        self.seq = [(t, j) for t in turns for j in range(len(t.prompt) + 1)]
        self.parent, self.rendered, self.fp = parent, rendered, fingerprint
        self.turn_end, self.marker = turn_end, marker
        self.at = 0
        self.kept: list[bytes] = []
        self.kept_ids = 0
        self.base: TokenTurn | None = None  # the last turn kept whole, before any divergence
        self.head: TokenTurn | None = None  # the chain kept before the first divergence
        self.parts: list[Part] | None = None  # None until the first divergence
        self.reasons: list[str] = []
        # what was kept since the last gap, newest last: (index, `base` before it)
        self.taken: list[tuple[int, TokenTurn | None]] = []

    def run(self) -> Continuation:
        i, n = 0, len(self.seq)
        to_end = False
        while i < n:
            if self._matches(i, self.at):
                self._take(i)
                i += 1
                continue
            k = self._diverge(i)
            if k is None:
                to_end = True
                break
            i = k
        parts = self.parts if self.parts is not None else []
        if not to_end:
            last = self._last_generation()
            repeated = None
            if last is self.parent and last.eos and last.generated.ids:
                repeated = last.generated.ids[-1]
            parts.append(Gap(self.rendered[self.at :], None, repeated))
        base = self.head if self.parts is not None else self.base
        return Continuation(
            base, tuple(self.kept), tuple(parts), self.kept_ids, tuple(self.reasons)
        )

    def _segment(self, k: int) -> tuple[Segment, bool]:
        t, j = self.seq[k]
        return (t.generated, True) if j == len(t.prompt) else (t.prompt[j], False)

    def _matches(self, k: int, at: int) -> bool:
        seg, gen = self._segment(k)
        if not self.rendered.startswith(seg.text, at):
            return False
        if gen and self.seq[k][0] is self.parent and self.turn_end:
            return self.rendered.startswith(self.turn_end, at + len(seg.text))
        return True

    def _take(self, k: int) -> None:
        seg, gen = self._segment(k)
        t = self.seq[k][0]
        self.taken.append((k, self.base))
        self.at += len(seg.text)
        self.kept_ids += len(seg.ids)
        if self.parts is None:
            if seg.json:
                self.kept.append(seg.json)
            if gen:
                self.base = t
        else:
            self.parts.append(Reused(t) if gen else seg)

    def _untake(self) -> int:
        """Give the last kept segment back; its index."""
        k, base = self.taken.pop()
        seg, _ = self._segment(k)
        self.at -= len(seg.text)
        self.kept_ids -= len(seg.ids)
        if self.parts is None:
            if seg.json:
                self.kept.pop()
            self.base = base
        else:
            self.parts.pop()
        return k

    def _last_generation(self) -> TokenTurn | None:
        """The turn whose generation was the last segment kept, if it was one with ids."""
        if not self.taken:
            return None
        seg, gen = self._segment(self.taken[-1][0])
        return self.seq[self.taken[-1][0]][0] if gen and seg.ids else None

    def _cut(self, i: int) -> tuple[bool, int | None]:
        """Whether a gap may start here, before segment `i`, and the id its text's ids must
        leave out (the end-of-generation id of the generation just before)."""
        at, rendered = self.at, self.rendered
        if at == 0 or self._segment(i)[1]:  # the start, or where a generation started
            return True, None
        last = self._last_generation()
        if last is not None:
            if self.turn_end and rendered.startswith(self.turn_end, at):
                return True, (last.generated.ids[-1] if last.eos else None)
            if last.eos:  # its last id is the end of the turn, which the text lacks here
                return not self.turn_end, None
            return (not self.turn_end) or rendered.startswith(self.marker or "\0", at), None
        if not self.marker or rendered.startswith(self.marker, at):
            return True, None
        k = self.taken[-1][0] if self.taken else -1
        return k >= 0 and self._segment(k)[1], None  # after an empty generation: a cut before

    def _diverge(self, i: int) -> int | None:
        """A gap from the segment `i` on: the index to go on from (None: to the end)."""
        ok, repeated = self._cut(i)
        while not ok and self.taken:
            i = self._untake()
            ok, repeated = self._cut(i)
        gen = self._segment(i)[1]
        reason = "generation_rerendered" if gen else "history_changed"
        if self.parts is None:
            t, j = self.seq[i]
            if gen or j:  # the prompt pieces of that turn before it stay, as a turn
                self.head = TokenTurn(self.base, self.fp, t.prompt[:j], EMPTY_SEGMENT)
            else:
                self.head = self.base
            self.parts = []
        self.reasons.append(reason)
        k, p = self._anchor(i)
        end = p if k is not None else len(self.rendered)
        self.parts.append(Gap(self.rendered[self.at : end], reason, repeated))
        self.at = end
        self.taken = []  # a gap is not given back
        return k

    def _anchor(self, i: int) -> tuple[int | None, int]:
        """The first segment from `i` on that starts with the turn marker and is found
        further on in the rendering, with the segment after it right behind it. Not the
        chain's first segment (its ids start with the model's BOS, which only the start of a
        prompt has), and a gap at the start is never empty (it is what gets the BOS)."""
        if not self.marker:
            return None, -1
        tried = 0
        start = self.at + 1 if self.at == 0 else self.at
        for k in range(max(i, 1), len(self.seq)):
            seg, gen = self._segment(k)
            if gen or not seg.text.startswith(self.marker):
                continue
            tried += 1
            if tried > MAX_ANCHORS:
                break
            p = self.rendered.find(seg.text, start)
            if p < 0:
                continue
            if k + 1 < len(self.seq) and not self._matches(k + 1, p + len(seg.text)):
                continue
            return k, p
        return None, -1


__all__ = ["MAX_ANCHORS", "continue_after", "continue_from"]

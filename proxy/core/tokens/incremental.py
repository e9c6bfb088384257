"""Rendering a continuation without rendering its history again (docs/tokens.md "Rendering
only the new messages").

For a template that renders one message at a time (core/tokens/template_shape.py
`append_only`), with `head` the rendering of the first message alone (no generation prompt),
the rendering of history H followed by new messages N is

    render(H) + render([H[0]] + N)[len(head):] + the generation prompt

byte for byte: `ChatTemplate` checks it on a probe conversation at start-up, and
tests/unit/test_token_incremental.py on random conversations. A turn then parses and renders
only its new messages (and the first one); the history is compared by identity, since the
Chat translation hands back the very bytes objects of the messages it translated before
(core/dialects/chat_request.py `TranslationMemo`).

What a continuation needs of the history's rendering is only where its parent's prompt ended:
the parent's token chain covers exactly render(H) + its generation prompt, so the new text
starts there (core/tokens/chain.py `continue_after`). `RenderMemo` keeps, for the last turn of
each chain, what its rendering was made of (`Rendered`): one entry per chain, as the
translation memo keeps one checkpoint per conversation, bounded by bytes.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .. import wire
from ..lru import ByteLRU
from .chain import TokenTurn
from .template import ChatTemplate, TemplateFailed, object_arguments


@dataclass(frozen=True, slots=True, eq=False)
class Rendered:
    """What one turn's prompt was rendered from, for the next turn to go on from it."""

    key: str  # what else the text depends on: the fingerprint (template, tools, model)
    messages: tuple[bytes, ...]  # the Chat messages, serialised (the translation's objects)
    first: Mapping[str, Any]  # the first message, parsed (the sandbox never changes it)
    head: str  # the first message rendered alone, without the generation prompt
    prompt: str  # the generation prompt the rendering ended with
    held: int  # bytes of the messages

    @property
    def nbytes(self) -> int:
        first = 2 * len(self.messages[0]) if self.messages else 0  # about, parsed
        held = self.held + 8 * len(self.messages) + first
        return held + len(self.head) + len(self.prompt) + 160


@dataclass(frozen=True, slots=True)
class Rendering:
    """One turn's conversation as text: `whole`, or (`after` set) the text that follows
    the rendering `after` was made of, up to and with the generation prompt (`tail`)."""

    whole: str | None
    tail: str
    after: Rendered | None
    rendered: Rendered | None  # this turn's, for the memo (None: not append-only)


def render_turn(
    template: ChatTemplate,
    messages: list[bytes],
    tools: Sequence[Mapping[str, Any]] | None,
    key: str,
    previous: Rendered | None = None,
) -> Rendering:
    """The turn's text: after `previous` when the template renders one message at a time and
    the messages go on from `previous`'s, else whole. Raises TemplateFailed (rendered whole,
    so that it names the message)."""
    if template.append_only is None and previous is not None and previous.key == key:
        done = _after(template, messages, tools, previous)
        if done is not None:
            return done
    dicts = object_arguments([wire.loads(m) for m in messages])
    text = template.render(dicts, tools)
    rendered = None
    if template.append_only is None and messages:
        head, prompt = _head(template, dicts[0], tools)
        if head is not None and text.startswith(head) and text.endswith(prompt):
            held = sum(len(m) for m in messages)
            rendered = Rendered(key, tuple(messages), dicts[0], head, prompt, held)
    return Rendering(text, text, None, rendered)


def _after(
    template: ChatTemplate,
    messages: list[bytes],
    tools: Sequence[Mapping[str, Any]] | None,
    previous: Rendered,
) -> Rendering | None:
    old = previous.messages
    n = len(old)
    if n == 0 or len(messages) < n or messages[n - 1] != old[-1] or tuple(messages[:n]) != old:
        return None  # another history (edited, truncated, another first message)
    new = messages[n:]
    window = [previous.first, *object_arguments([wire.loads(m) for m in new])]
    try:
        text = template.render(window, tools, add_generation_prompt=False)
        # the first message renders as before (the same bytes, tools and template), unless
        # the template prints the date, which may have changed
        if template.uses_clock and _head(template, window[0], tools)[0] != previous.head:
            return None
    except TemplateFailed:
        return None  # rendered whole, the failure is named there
    if not text.startswith(previous.head):
        return None
    tail = text[len(previous.head) :] + previous.prompt
    held = previous.held + sum(len(m) for m in new)
    rendered = Rendered(
        previous.key, tuple(messages), previous.first, previous.head, previous.prompt, held
    )
    return Rendering(None, tail, previous, rendered)


def _head(
    template: ChatTemplate, first: Mapping[str, Any], tools: Sequence[Mapping[str, Any]] | None
) -> tuple[str | None, str]:
    """The first message rendered alone, and the generation prompt after it."""
    try:
        head = template.render([first], tools, add_generation_prompt=False)
        with_prompt = template.render([first], tools, add_generation_prompt=True)
    except TemplateFailed:
        return None, ""
    if not with_prompt.startswith(head):
        return None, ""
    return head, with_prompt[len(head) :]


@dataclass(frozen=True, slots=True, eq=False)
class Remembered:
    """A memo entry: how a turn's prompt was rendered, and its chain's ids as the JSON
    pieces of a prompt (its prompt and generation, oldest first), so that a continuation
    neither renders nor walks the history to build its own."""

    rendered: Rendered
    kept: tuple[bytes, ...]
    ids: int

    @property
    def nbytes(self) -> int:
        return self.rendered.nbytes + 8 * len(self.kept) + 64


class RenderMemo:
    """`Remembered` by token turn, least recently used first out, bounded by bytes. A turn's
    entry replaces its parent's (`keep`), so a chain holds one: a fork's second child
    renders whole, which is exact, only slower. Turns are held weakly: the memo never keeps
    a chain the response cache let go."""

    def __init__(self, max_bytes: int) -> None:
        self._lru: ByteLRU[int, tuple[weakref.ref[TokenTurn], Remembered]] = ByteLRU(max_bytes)
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._lru)

    @property
    def nbytes(self) -> int:
        return self._lru.nbytes

    def find(self, turn: TokenTurn | None) -> Remembered | None:
        found = self._lru.get(id(turn)) if turn is not None else None
        if found is None or found[0]() is not turn:  # an id of a turn gone, used again
            self.misses += 1
            return None
        self.hits += 1
        return found[1]

    def keep(self, turn: TokenTurn, rendered: Rendered, parent: TokenTurn | None) -> None:
        before = None
        if parent is not None:
            old = self._lru.peek(id(parent))
            if old is not None and old[0]() is parent:
                self._lru.pop(id(parent))
                before = old[1]
        if before is not None and turn.parent is parent:  # the parent's chain, then its own
            own = [*turn.prompt, turn.generated]
            kept = before.kept + tuple(s.json for s in own if s.json)
            ids = before.ids + sum(len(s.ids) for s in own)
        else:  # after a divergence (or the first turn): the chain, walked once
            segments = turn.segments()
            kept = tuple(s.json for s in segments if s.json)
            ids = sum(len(s.ids) for s in segments)
        entry = Remembered(rendered, kept, ids)
        self._lru.put(id(turn), (weakref.ref(turn), entry), entry.nbytes)


__all__ = ["Remembered", "RenderMemo", "Rendered", "Rendering", "render_turn"]

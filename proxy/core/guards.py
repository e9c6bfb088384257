"""Input guards: checks of a turn's *new* input, before anything goes upstream (docs/guards.md).

The history behind `previous_response_id` was checked when it arrived, so a guard sees only
the items the turn adds (a steer's input included) and its cost never grows with the
conversation. A guard is any object with `check(turn) -> ClientError | None`; the session
runs them in order when the run starts, after the tool-output check, and the first refusal
ends the run: a 400 `error`, no upstream request, and, as for any failed continuation, the
parent evicted on its lane (docs/protocol.md "Continuing and eviction").

Built in (configured in `[guards]`, put together by proxy/build.py):

- `MaxNewInputBytes`: the new items' JSON is larger than the limit -> `input_too_large`;
- `DenyPatterns`: a regular expression is found in the new text -> `invalid_prompt`;
- moderation: with `moderation = True` the session hands the new text to the runner on the
  `StartUpstream` action, and the runner (proxy/upstream/moderation.py, which does the HTTP)
  asks a `/v1/moderations` endpoint before it sends the model request. The text of a
  `generate: false` turn went to no model, so no moderation saw it: its cached response keeps
  it (`Unseen`, shared along the chain) for the next turn that goes to the model.

"The new text" is what a person or a tool wrote: the text of message contents and of tool
call outputs. Items are parsed here only when a guard needs the text.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from . import wire
from .errors import ClientError

_TEXT_OUTPUTS = frozenset({"function_call_output", "custom_tool_call_output"})


class NewInput:
    """The new items of one turn, as the cache holds them, and their text (parsed once, on
    first use)."""

    def __init__(self, items: tuple[bytes, ...]) -> None:
        self.items = items
        self.nbytes = sum(len(i) for i in items)
        self._texts: tuple[str, ...] | None = None

    @property
    def texts(self) -> tuple[str, ...]:
        """One string per item that has text, in order."""
        if self._texts is None:
            found = (text_of(wire.loads(item)) for item in self.items)
            self._texts = tuple(t for t in found if t)
        return self._texts


def text_of(item: Any) -> str:
    """The text of a message's content or a tool output's output ('' if it has none)."""
    if not isinstance(item, dict):
        return ""
    kind = item.get("type", "message")
    if kind == "message":
        value = item.get("content")
    elif kind in _TEXT_OUTPUTS:
        value = item.get("output")
    else:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = (p.get("text") for p in value if isinstance(p, dict))
        return "\n".join(t for t in parts if isinstance(t, str))
    return ""


class Guard(Protocol):
    def check(self, turn: NewInput) -> ClientError | None:
        """None to let the turn through; the error the client gets to refuse it."""
        ...


def refused_prompt(reason: str) -> ClientError:
    """A turn refused for its content: OpenAI's code for a prompt its policies refuse."""
    return ClientError(f"Invalid prompt: {reason}.", code="invalid_prompt", param="input")


@dataclass(frozen=True, slots=True)
class MaxNewInputBytes:
    limit: int

    def check(self, turn: NewInput) -> ClientError | None:
        if turn.nbytes <= self.limit:
            return None
        return ClientError(
            f"The new input of this turn is {turn.nbytes} bytes; this server accepts at most "
            f"{self.limit} bytes of new input per turn.",
            code="input_too_large",
            param="input",
        )


@dataclass(frozen=True, slots=True)
class DenyPatterns:
    patterns: tuple[re.Pattern[str], ...]

    @classmethod
    def compile(cls, sources: Iterable[str]) -> DenyPatterns:
        return cls(tuple(re.compile(s, re.IGNORECASE) for s in sources))

    def check(self, turn: NewInput) -> ClientError | None:
        for text in turn.texts:
            if any(p.search(text) for p in self.patterns):
                return refused_prompt("the input contains text this server does not accept")
        return None


@dataclass(frozen=True, slots=True)
class Guards:
    checks: tuple[Guard, ...] = ()
    moderation: bool = False  # an HTTP moderation hook waits for the new text

    def run(self, items: tuple[bytes, ...]) -> tuple[ClientError | None, tuple[str, ...] | None]:
        """The first refusal, else None and the texts to moderate (None: nothing to ask)."""
        turn = NewInput(items)
        for guard in self.checks:
            refusal = guard.check(turn)
            if refusal is not None:
                return refusal, None
        return None, (turn.texts or None) if self.moderation else None


class Unseen(Collection[str]):
    """Text no moderation has seen: a turn's own (`own`) after what its parent left unseen
    (`up`), shared as the history's links are, never copied. Iterating gives all of it,
    oldest first (a walk: O(texts)); its length is kept."""

    __slots__ = ("count", "own", "up")

    def __init__(self, own: tuple[str, ...], up: Collection[str]) -> None:
        self.own = own
        self.up = up
        self.count = len(own) + len(up)

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[str]:
        parts: list[Collection[str]] = []
        at: Collection[str] = self
        while isinstance(at, Unseen):
            parts.append(at.own)
            at = at.up
        parts.append(at)
        for part in reversed(parts):
            yield from part

    def __contains__(self, text: object) -> bool:
        return any(t == text for t in self)

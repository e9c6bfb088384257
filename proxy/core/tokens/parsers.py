"""Model output parsers: the raw text a token engine generates -> typed pieces of a response.

A raw completion endpoint (llama.cpp `/completion`, vLLM's and SGLang's) returns the text the
model wrote, tags and all: the server no longer splits it into content, reasoning and tool
calls, so the token path does. A parser is fed the generated text in streamed deltas, cut
anywhere (a tag may arrive as `<tool_` then `call>`), and returns pieces:

- `TextPiece` and `ReasoningPiece`: deltas of the message text and of the reasoning text,
  emitted as soon as they are certainly not the start of a tag (only a trailing fragment that
  could begin one is held back, so text streams as smoothly as the model writes it);
- `CallStart` and `CallArgs`: a tool call whose name has been read, and deltas of its
  arguments' JSON text as the model writes it (Hermes calls written name first, arguments an
  object, as models write them);
- `CallPiece`: one whole tool call, emitted when its closing tag arrives and its JSON parses
  (`streamed`: its arguments went out as `CallArgs` already, and are their concatenation);
- `BrokenCall`: a tool call block that cannot be read as one (see its `reason`); after a
  `CallStart` it ends that call, which is then never a completed call.

Concatenating the text deltas (and the reasoning deltas) gives the same result however the
output was cut; tests/unit/test_token_parsers.py feeds every split.

Formats provided:
- `HermesParser`: Hermes, Qwen2.5 and Qwen3 (and templates written like them): a call is
  `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, reasoning is
  `<think>...</think>`.
- `NoToolsParser`: plain text (and optional think blocks), for `tool_format = "none"`.
- `MistralParser` and `Llama3Parser` (parsers_json.py): calls that end where their JSON
  ends, with no closing tag: Mistral's `[TOOL_CALLS]` and Llama 3's bare JSON object.

- `HarmonyParser` (harmony.py): gpt-oss's channels, read from the generated ids by
  `openai-harmony`, so it takes ids (`feed_ids`) where the others take text.

A parser holds the state of one response: make a new one for each (`formats.parser_for` returns a
new one on every call). `end()` is called once, when generation ends; the parser is then
spent, and feeding it again is a bug.

A caller that asks the server to stop at `</tool_call>` gets the output without that stop
text: it feeds the stop text back (llama.cpp reports it as `stopping_word`) before `end()`,
else the last call is `BrokenCall(reason="unterminated")`.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from functools import cache
from typing import Protocol, TypeAlias

from .. import wire
from .json_scan import ObjectEnd

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"

# The bound on one tool call's buffered text (between its tags), in characters. A call's
# arguments are rarely more than a few KiB; a file written through a tool can be large.
MAX_CALL_CHARS = 1 << 20


@dataclass(frozen=True, slots=True)
class TextPiece:
    """A delta of the message text."""

    text: str


@dataclass(frozen=True, slots=True)
class ReasoningPiece:
    """A delta of the reasoning text (a think block's content)."""

    text: str


@dataclass(frozen=True, slots=True)
class CallStart:
    """A tool call begins: its name is read, its arguments follow as `CallArgs`."""

    name: str


@dataclass(frozen=True, slots=True)
class CallArgs:
    """A delta of the arguments' JSON text of the call `CallStart` began, as written."""

    text: str


@dataclass(frozen=True, slots=True)
class CallPiece:
    """One tool call; `arguments` is the JSON text of the arguments object (the Responses
    `function_call.arguments` string): as the model wrote it when `streamed` (the `CallArgs`
    deltas joined, checked to parse), else written compactly from its parsed value."""

    name: str
    arguments: str
    streamed: bool = False


@dataclass(frozen=True, slots=True)
class BrokenCall:
    """A tool call block that is not one call. `raw` is the block's text as the model wrote
    it (for "too_long", its first `max_call_chars` characters). `reason` is one of:

    - "invalid_json": the block is not a JSON object;
    - "no_name": the object has no `name` string (or an empty one);
    - "bad_arguments": `arguments` is neither an object nor a string holding one;
    - "too_deep": the arguments nest too deeply to be written again;
    - "too_long": the block is longer than the parser's `max_call_chars`;
    - "unterminated": generation ended inside the block.
    """

    raw: str
    reason: str


@dataclass(frozen=True, slots=True)
class ReasoningEnd:
    """The think block closed: its reasoning item is finished (an item boundary, where a
    steer may cut the response)."""


Piece: TypeAlias = (
    TextPiece | ReasoningPiece | ReasoningEnd | CallStart | CallArgs | CallPiece | BrokenCall
)

# a Hermes call written as models write it: `{"name": "NAME", "arguments": {` (the arguments
# object begins at the end of the match); looked for in a call's first characters only
_CALL_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*(?=\{)')
_CALL_HEAD_CHARS = 512


class OutputParser(Protocol):
    """The generated text of one response -> pieces, incrementally."""

    @property
    def after_calls_text(self) -> bool:
        """True once the model wrote text (other than whitespace) after a tool call, which
        was dropped: a base model that keeps talking, so the caller may stop it."""
        ...

    def feed(self, delta: str) -> list[Piece]:
        """The pieces that `delta`, the next fragment of the output, completes."""
        ...

    def end(self) -> list[Piece]:
        """Generation ended: the pieces still held back."""
        ...


class _Mode(enum.Enum):
    TEXT = enum.auto()  # message text (think and call tags recognised)
    THINK = enum.auto()  # inside <think>
    CALL = enum.auto()  # inside <tool_call>, buffering the call
    SKIP = enum.auto()  # inside a <tool_call> already reported too long
    AFTER = enum.auto()  # after a call: only further calls count
    ENDED = enum.auto()  # end() was called


class _TagParser:
    """The machine behind both parsers: the text between the tags of the current mode is its
    content, a tag changes the mode.

    Theory of operation. `feed` appends the delta to the held fragment and repeatedly finds
    the first of the current mode's tags in it: the text before the tag is content of the
    mode, the tag switches it. When no tag is left, everything but the longest suffix that
    could begin a tag is content, and that suffix (shorter than the longest tag) is held for
    the next delta. So the held text stays a few characters, and each character is looked at
    a bounded number of times. The modes and their tags:

        TEXT   <think> -> THINK, </think> (stray) dropped, <tool_call> -> CALL
        THINK  </think> -> TEXT
        CALL   </tool_call> -> AFTER, emitting the call; past the bound -> SKIP
        SKIP   </tool_call> -> AFTER
        AFTER  <tool_call> -> CALL; any other text dropped

    Whitespace at the start of the output is held and goes out with the text after it, so a
    message is the model's text exactly (the history renders it so, and the next turn's ids
    continue it); before a tag it is dropped, so whitespace alone never becomes a message.
    Whitespace at the start of a think block and of the text after one is dropped (Qwen3
    writes `<think>\\n...\\n</think>\\n\\n`). Inside a think block a `<tool_call>` is
    reasoning text.
    """

    def __init__(self, *, tools: bool, think: bool, starts_in_think: bool, max_call_chars: int):
        if starts_in_think and not think:
            raise ValueError("starts_in_think needs think=True")
        if max_call_chars < 1:
            raise ValueError("max_call_chars must be at least 1")
        text_tags: list[str] = []
        if think:
            text_tags += [THINK_OPEN, THINK_CLOSE]
        if tools:
            text_tags.append(CALL_OPEN)
        self._tags = {
            _Mode.TEXT: tuple(text_tags),
            _Mode.THINK: (THINK_CLOSE,),
            _Mode.CALL: (CALL_CLOSE,),
            _Mode.SKIP: (CALL_CLOSE,),
            _Mode.AFTER: (CALL_OPEN,),
        }
        self._max_call_chars = max_call_chars
        self._mode = _Mode.THINK if starts_in_think else _Mode.TEXT
        self._held = ""  # a trailing fragment that may begin a tag of the current mode
        # whitespace at the start of the output is held: it goes out with the text that
        # follows (the message is then the model's text exactly, as the history renders it),
        # and is dropped if a tag follows instead (no message of whitespace before a call)
        self._lead: str | None = "" if not starts_in_think else None
        self._lstrip = starts_in_think  # drop whitespace at the start of reasoning, or after it
        self._call: list[str] = []  # the current call's text, in fragments
        self._call_chars = 0
        # the current call's arguments as they stream: None until its name is read, False
        # when it is not written name first (it is then read whole at its end)
        self._args: ObjectEnd | bool | None = None
        self._after_calls_text = False

    @property
    def after_calls_text(self) -> bool:
        return self._after_calls_text

    def feed(self, delta: str) -> list[Piece]:
        if self._mode is _Mode.ENDED:
            raise RuntimeError("feed after end: a parser serves one response")
        out: list[Piece] = []
        rest = self._held + delta
        while rest:
            tags = self._tags[self._mode]
            at, tag = first_tag(rest, tags)
            if tag is None:
                keep = tag_prefix_len(rest, tags)
                self._content(rest[: len(rest) - keep], out)
                rest = rest[len(rest) - keep :]
                break
            self._content(rest[:at], out)
            rest = rest[at + len(tag) :]
            self._tag(tag, out)
        self._held = rest
        return out

    def end(self) -> list[Piece]:
        if self._mode is _Mode.ENDED:
            raise RuntimeError("end called twice: a parser serves one response")
        out: list[Piece] = []
        held, self._held = self._held, ""
        if self._mode is _Mode.CALL:
            out.append(BrokenCall("".join(self._call) + held, "unterminated"))
        else:  # a fragment that never became a tag is content after all
            self._content(held, out)
        self._mode = _Mode.ENDED
        self._call = []
        return out

    def _content(self, text: str, out: list[Piece]) -> None:
        if not text:
            return
        mode = self._mode
        if mode is _Mode.TEXT and self._lead is not None:
            if text.isspace():
                self._lead += text
                return
            text, self._lead = self._lead + text, None
            emit_text(out, TextPiece(text))
        elif mode is _Mode.TEXT or mode is _Mode.THINK:
            if self._lstrip:
                text = text.lstrip()
                if not text:
                    return
                self._lstrip = False
            emit_text(out, TextPiece(text) if mode is _Mode.TEXT else ReasoningPiece(text))
        elif mode is _Mode.CALL:
            self._call.append(text)
            self._call_chars += len(text)
            if self._call_chars > self._max_call_chars:
                raw = "".join(self._call)[: self._max_call_chars]
                out.append(BrokenCall(raw, "too_long"))
                self._call = []
                self._mode = _Mode.SKIP
                return
            self._stream_call(text, out)
        elif mode is _Mode.AFTER and not text.isspace():
            self._after_calls_text = True
        # SKIP, or whitespace after a call: nothing

    def _tag(self, tag: str, out: list[Piece]) -> None:
        self._lead = None  # whitespace held before a tag is not a message
        if tag == THINK_OPEN:
            self._mode = _Mode.THINK
            self._lstrip = True
        elif tag == THINK_CLOSE:
            if self._mode is _Mode.THINK:
                self._mode = _Mode.TEXT
                self._lstrip = True
                out.append(ReasoningEnd())
            # else a stray close in the text (the prompt opened the block): dropped
        elif tag == CALL_OPEN:
            self._mode = _Mode.CALL
            self._call = []
            self._call_chars = 0
            self._args = None
        else:  # CALL_CLOSE, in CALL or SKIP
            if self._mode is _Mode.CALL:
                out.append(self._call_end("".join(self._call)))
                self._call = []
            self._mode = _Mode.AFTER

    def _stream_call(self, text: str, out: list[Piece]) -> None:
        """The call's name once it is read, then its arguments' text as it comes."""
        args = self._args
        if args is None:
            so_far = "".join(self._call)
            head = _CALL_HEAD.match(so_far)
            if head is None:
                if len(so_far) > _CALL_HEAD_CHARS:
                    self._args = False  # not written name first: read whole at the end
                return
            try:
                name = wire.loads(head.group(1))
            except wire.JSONDecodeError:
                self._args = False
                return
            if not isinstance(name, str) or not name:
                self._args = False
                return
            out.append(CallStart(name))
            args = self._args = ObjectEnd()
            text = so_far[head.end() :]
        if isinstance(args, ObjectEnd) and not args.done:
            used = args.feed(text)
            if used:
                out.append(CallArgs(text[:used]))

    def _call_end(self, raw: str) -> CallPiece | BrokenCall:
        call = call_from_json(raw)
        args = self._args
        if not isinstance(args, ObjectEnd) or isinstance(call, BrokenCall):
            return call
        # streamed: the arguments are what went out, if they are the call's whole arguments
        text = "".join(args.text)
        try:
            same = args.done and wire.loads(text) == wire.loads(call.arguments)
        except wire.JSONDecodeError:
            same = False
        if not same:
            return BrokenCall(raw, "bad_arguments")
        return CallPiece(call.name, text, streamed=True)


class HermesParser(_TagParser):
    """Hermes-style tool calls (Hermes, Qwen2.5, Qwen3): `<tool_call>` JSON `</tool_call>`.

    `think`: read `<think>...</think>` as reasoning. `starts_in_think`: the prompt ended
    inside a think block (Qwen3's templates can open it), so the output is reasoning until
    `</think>`. `max_call_chars`: the bound on one call's text (`BrokenCall` "too_long").

    Text before the first call is the message; once a call block has closed, text outside
    further call blocks is dropped (`after_calls_text` tells), and later calls still count.
    A call written `{"name": ..., "arguments": {...}}` streams (`CallStart`, `CallArgs`).
    """

    def __init__(
        self,
        think: bool = True,
        *,
        starts_in_think: bool = False,
        max_call_chars: int = MAX_CALL_CHARS,
    ) -> None:
        super().__init__(
            tools=True, think=think, starts_in_think=starts_in_think, max_call_chars=max_call_chars
        )


class NoToolsParser(_TagParser):
    """Plain text, and with `think` (as for `HermesParser`) think blocks as reasoning. Tool
    call tags are text; `after_calls_text` is always False."""

    def __init__(self, think: bool = True, *, starts_in_think: bool = False) -> None:
        super().__init__(
            tools=False, think=think, starts_in_think=starts_in_think, max_call_chars=MAX_CALL_CHARS
        )


# ---- helpers shared with parsers_json.py


def emit_text(out: list[Piece], piece: TextPiece | ReasoningPiece) -> None:
    """Append `piece`, joined to the last one when it is of the same kind."""
    if out and type(out[-1]) is type(piece):
        last = out[-1]
        assert isinstance(last, TextPiece | ReasoningPiece)
        out[-1] = type(piece)(last.text + piece.text)
    else:
        out.append(piece)


def first_tag(text: str, tags: tuple[str, ...]) -> tuple[int, str | None]:
    """The earliest of `tags` in `text`: its index and itself, or (-1, None)."""
    best, found = -1, None
    for tag in tags:
        at = text.find(tag)
        if at >= 0 and (found is None or at < best):
            best, found = at, tag
    return best, found


@cache
def _tags_shape(tags: tuple[str, ...]) -> tuple[int, frozenset[str]]:
    """The longest proper prefix a tag of `tags` has, and the characters the tags begin with."""
    return max((len(tag) for tag in tags), default=1) - 1, frozenset(t[0] for t in tags if t)


def tag_prefix_len(text: str, tags: tuple[str, ...]) -> int:
    """The length of the longest suffix of `text` that is a proper prefix of one of `tags`.
    It runs for every piece of streamed text: such a suffix begins with a character a tag
    begins with, so only those places (usually none) are tried."""
    longest, firsts = _tags_shape(tags)
    start = len(text) - min(longest, len(text))
    best = len(text)
    for first in firsts:
        at = text.find(first, start, best)
        while at >= 0:
            tail = text[at:]
            if any(tag.startswith(tail) for tag in tags):
                best = at  # the earliest place for this character: the longest suffix
                break
            at = text.find(first, at + 1, best)
    return len(text) - best


def call_from_json(raw: str) -> CallPiece | BrokenCall:
    """`{"name": ..., "arguments": {...}}` (arguments may be a string holding the object)."""
    try:
        call = wire.loads(raw)
    except wire.JSONDecodeError:
        return BrokenCall(raw, "invalid_json")
    if not isinstance(call, dict):
        return BrokenCall(raw, "invalid_json")
    return call_from_value(call.get("name"), call.get("arguments"), raw)


def call_from_value(name: object, arguments: object, raw: str) -> CallPiece | BrokenCall:
    """A call from its parsed name and arguments (an object, or a string holding one); `raw`
    is the text they came from, for the `BrokenCall` if they are not a call."""
    if not isinstance(name, str) or not name:
        return BrokenCall(raw, "no_name")
    if isinstance(arguments, str):
        try:
            arguments = wire.loads(arguments)
        except wire.JSONDecodeError:
            return BrokenCall(raw, "bad_arguments")
    if not isinstance(arguments, dict):
        return BrokenCall(raw, "bad_arguments")
    try:
        return CallPiece(name, wire.dumps(arguments).decode())
    except wire.JSONEncodeError:  # nested deeper than orjson writes (wire._ORJSON_DEPTH)
        return BrokenCall(raw, "too_deep")

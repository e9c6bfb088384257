"""Tool call formats with no closing tag: a call ends where its JSON value ends, so the
parser follows the JSON's brackets and strings (`_JsonEnd`). The protocol, pieces and helpers
are parsers.py's.

- `MistralParser` (`tool_format = "mistral"`): text before `[TOOL_CALLS]` is the message.
  Then, as mistral-common's tokenizers write calls, one JSON list (v2 to v7: Mistral 7B
  v0.3, Nemo), `[TOOL_CALLS][{"name": "f", "arguments": {...}, "id": "..."}, ...]`, or, from
  v11 (Mistral Small 3.1+, Magistral, Devstral), one tag per call, `[TOOL_CALLS]f[ARGS]{...}`,
  maybe with the id between, `f[CALL_ID]a1b2c3d4e[ARGS]{...}` (dropped: the proxy makes its
  own), or the `{` straight after the name. A list with one bad call is one `BrokenCall`.
  Reasoning: `[THINK]...[/THINK]` (Magistral) or `<think>...</think>`.
- `Llama3Parser` (`tool_format = "llama3"`): Llama 3.1 to 3.3 call with a bare object,
  `{"name": "f", "parameters": {...}}` (or `arguments`), maybe after `<|python_tag|>`,
  several separated by `;` (or whitespace). An object is a call at the start of the message
  (whitespace and think blocks aside), or after the tag, which may come anywhere (the text
  before it is the message). An object at the start with none of the keys `name`,
  `parameters`, `arguments` is text (an answer that is JSON). Llama 3.1's built-in tools
  (`<|python_tag|>brave_search.call(query="...")`) are not read: `BrokenCall("invalid_json")`.

Text streams but for a fragment that may begin a tag; a call is emitted when its JSON
closes. Text after the calls is dropped and `after_calls_text` says so (Mistral: later
`[TOOL_CALLS]` count; Llama 3: that text ends the calls). A call's text, from its tag to the
end of its JSON, is bounded by `max_call_chars`: past it, `BrokenCall("too_long")`, and the
rest of its JSON is skipped (before its JSON began: all that follows). The tags are special
tokens the server must write into the text (vLLM and SGLang: `skip_special_tokens = false`;
llama.cpp: `--special`, or its own chat formats' preserved tokens).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable

from .. import wire
from .parsers import (
    MAX_CALL_CHARS,
    THINK_CLOSE,
    THINK_OPEN,
    BrokenCall,
    Piece,
    ReasoningEnd,
    ReasoningPiece,
    TextPiece,
    call_from_value,
    emit_text,
    first_tag,
    tag_prefix_len,
)

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"
CALL_ID = "[CALL_ID]"
MISTRAL_THINK_OPEN = "[THINK]"
MISTRAL_THINK_CLOSE = "[/THINK]"
PYTHON_TAG = "<|python_tag|>"

_NAME_TAGS = (ARGS, CALL_ID, "{")
_V11_TAGS = (ARGS, CALL_ID)
_NAME = re.compile(r'[^\s\[\]{}"]+')  # a v11 name: no whitespace, brackets, braces, quotes
_CALL_KEYS = ("name", "parameters", "arguments")

_Content = Callable[[str, list[Piece]], object]  # where the text before a tag goes


class _Mode(enum.Enum):
    TEXT = enum.auto()  # message text
    THINK = enum.auto()  # inside a think block
    HEAD = enum.auto()  # Mistral: after [TOOL_CALLS], before its shape (list or name) shows
    NAME = enum.auto()  # Mistral v11: the name, up to [ARGS], [CALL_ID] or `{`
    CALL_ID = enum.auto()  # Mistral v11: the call id, up to [ARGS]
    VALUE_START = enum.auto()  # whitespace, then the `{` that opens the arguments (or call)
    VALUE = enum.auto()  # inside the JSON value, buffering it
    SKIP = enum.auto()  # inside a JSON value already reported too long
    REST = enum.auto()  # Llama 3: after the python tag, text that is not JSON, to the end
    AFTER = enum.auto()  # after a call: only further calls count
    DROP = enum.auto()  # everything to the end is dropped
    ENDED = enum.auto()  # end() was called


class _JsonEnd:
    """Where one JSON value that opens with `{` or `[` closes, in text fed piece by piece.

    Only brackets and strings are followed (a string's brackets do not count, nor an
    escaped quote); whether the value is valid JSON is for the parser that reads it."""

    _OUTSIDE = re.compile(r'[{}\[\]"]')
    _INSIDE = re.compile(r'["\\]')

    def __init__(self) -> None:
        self._depth = 0
        self._in_string = False
        self._escaped = False  # the last character was a backslash inside a string

    def end_in(self, text: str) -> int:
        """The index just past the value's closing bracket in `text`, or -1 if the value
        does not close in it."""
        i = 0
        while i < len(text):
            if self._escaped:
                self._escaped = False
                i += 1
                continue
            found = (self._INSIDE if self._in_string else self._OUTSIDE).search(text, i)
            if found is None:
                return -1
            i = found.end()
            char = found.group()
            if char == "\\":
                self._escaped = True
            elif char == '"':
                self._in_string = not self._in_string
            elif char in "{[":
                self._depth += 1
            else:
                self._depth -= 1
                if self._depth == 0:
                    return i
        return -1


class _JsonCallParser:
    """The machine both formats share: text and think blocks, buffering a call's text and
    following its JSON, and the bound. The formats decide where a call starts, read what
    comes between its tag and its JSON (`_call_step`), read the JSON (`_finish`) and what
    may follow a call (`_after`).

    Theory of operation. `feed` appends the delta to the held fragment and hands it to the
    current mode's step, which uses a prefix of it (maybe changing mode); steps run until
    the text is used up or a step uses nothing and keeps its mode: the rest may begin a tag
    and is held for the next delta (a few characters). A JSON value is consumed as it comes,
    so nothing is scanned twice. Whitespace at the start of the output goes out with the
    text after it, and is dropped before a tag, as in parsers.py.
    """

    def __init__(
        self,
        *,
        think: tuple[tuple[str, str], ...],
        triggers: tuple[str, ...],
        starts_in_think: bool,
        max_call_chars: int,
    ) -> None:
        if max_call_chars < 1:
            raise ValueError("max_call_chars must be at least 1")
        self._closes = dict(think)  # think open tag -> its close tag
        self._text_tags = (*self._closes, *self._closes.values(), *triggers)
        self._think_closes = tuple(self._closes.values()) if starts_in_think else ()
        self._max_call_chars = max_call_chars
        self._mode = _Mode.THINK if starts_in_think else _Mode.TEXT
        self._held = ""
        self._lead: str | None = None if starts_in_think else ""
        self._lstrip = starts_in_think
        self._said = False  # message text was emitted
        self._raw: list[str] = []  # the current call's text, in fragments
        self._raw_chars = 0
        self._value_at = 0  # where the JSON value starts in the call's text
        self._scan = _JsonEnd()
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
            mode = self._mode
            used = self._step(rest, out)
            rest = rest[used:]
            if used == 0 and self._mode is mode:
                break
        self._held = rest
        return out

    def end(self) -> list[Piece]:
        if self._mode is _Mode.ENDED:
            raise RuntimeError("end called twice: a parser serves one response")
        out: list[Piece] = []
        held, self._held = self._held, ""
        mode = self._mode
        if mode is _Mode.TEXT:
            self._text(held, out)
        elif mode is _Mode.THINK:
            self._reasoning(held, out)
        elif mode is _Mode.AFTER:
            self._junk(held)
        elif mode is _Mode.REST:
            out.append(BrokenCall("".join(self._raw) + held, "invalid_json"))
        elif mode not in (_Mode.SKIP, _Mode.DROP):  # inside a call
            out.append(BrokenCall("".join(self._raw) + held, "unterminated"))
        self._mode = _Mode.ENDED
        self._raw = []
        return out

    def _step(self, rest: str, out: list[Piece]) -> int:
        mode = self._mode
        if mode is _Mode.TEXT:
            started = self._starts_call(rest, out)
            return started if started >= 0 else self._tagged(rest, self._text_tags, self._text, out)
        if mode is _Mode.THINK:
            return self._tagged(rest, self._think_closes, self._reasoning, out)
        if mode is _Mode.VALUE_START:
            return self._value_start(rest, out)
        if mode is _Mode.VALUE or mode is _Mode.SKIP:
            return self._value(rest, out)
        if mode is _Mode.AFTER:
            return self._after(rest, out)
        if mode is _Mode.DROP:
            return len(rest)
        return self._call_step(rest, out)

    def _tagged(self, rest: str, tags: tuple[str, ...], content: _Content, out: list[Piece]) -> int:
        """Up to the first of `tags`: the text before it to `content`, the tag to `_tag`."""
        at, tag = first_tag(rest, tags)
        if tag is None:
            at = len(rest) - tag_prefix_len(rest, tags)
            content(rest[:at], out)
            return at
        content(rest[:at], out)
        self._tag(tag, out)
        return at + len(tag)

    def _tag(self, tag: str, out: list[Piece]) -> None:
        if self._mode is _Mode.THINK:  # its close
            self._mode = _Mode.TEXT
            self._lstrip = True
            out.append(ReasoningEnd())
            return
        self._lead = None  # whitespace before a tag is no message
        if tag in self._closes:
            self._mode = _Mode.THINK
            self._think_closes = (self._closes[tag],)
            self._lstrip = True
        elif tag not in self._closes.values():
            self._begin_call()
        # else a stray close in the text (the prompt opened the block): dropped

    def _text(self, text: str, out: list[Piece]) -> None:
        if not text:
            return
        if self._lead is not None:
            if text.isspace():
                self._lead += text
                return
            text, self._lead = self._lead + text, None
        elif self._lstrip:
            text = text.lstrip()
            if not text:
                return
            self._lstrip = False
        self._said = True
        emit_text(out, TextPiece(text))

    def _reasoning(self, text: str, out: list[Piece]) -> None:
        if self._lstrip:
            text = text.lstrip()
            self._lstrip = not text
        if text:
            emit_text(out, ReasoningPiece(text))

    def _value_start(self, rest: str, out: list[Piece]) -> int:
        """Whitespace, then the `{` of the JSON value (anything else: `_no_object`)."""
        ws = _space_len(rest)
        if not self._take(rest[:ws], out) or ws == len(rest):
            return ws
        if rest[ws] == "{":
            self._open_value()
        else:
            self._no_object(out)
        return ws

    def _open_value(self) -> None:
        self._value_at = self._raw_chars
        self._scan = _JsonEnd()
        self._mode = _Mode.VALUE

    def _value(self, rest: str, out: list[Piece]) -> int:
        end = self._scan.end_in(rest)
        chunk = rest if end < 0 else rest[:end]
        if self._mode is _Mode.VALUE:
            self._take(chunk, out)  # past the bound: SKIP
        if end >= 0:
            raw, self._raw = "".join(self._raw), []
            read, self._mode = self._mode is _Mode.VALUE, _Mode.AFTER
            if read:
                self._read(raw, out)
        return len(chunk)

    def _read(self, raw: str, out: list[Piece]) -> None:
        """The JSON closed: the format reads its value, unless it is not JSON."""
        try:
            value = wire.loads(raw[self._value_at :])
        except wire.JSONDecodeError:
            out.append(BrokenCall(raw, "invalid_json"))
        else:
            self._finish(raw, value, out)

    def _begin_call(self) -> None:
        """A call starts (after a trigger tag, or where the format says)."""
        self._raw = []
        self._raw_chars = 0

    def _take(self, text: str, out: list[Piece]) -> bool:
        """Adds `text` to the call's; past the bound, reports it too long and drops it, and
        the mode becomes SKIP inside a JSON value, else DROP."""
        if not text:
            return True
        self._raw.append(text)
        self._raw_chars += len(text)
        if self._raw_chars <= self._max_call_chars:
            return True
        out.append(BrokenCall("".join(self._raw)[: self._max_call_chars], "too_long"))
        self._raw = []
        self._mode = _Mode.SKIP if self._mode is _Mode.VALUE else _Mode.DROP
        return False

    def _junk(self, text: str) -> None:
        if text and not text.isspace():
            self._after_calls_text = True

    # ------------------------------------------------------------ what the formats decide

    def _starts_call(self, rest: str, out: list[Piece]) -> int:
        """In the text: the characters used if a call starts at `rest` untagged, else -1."""
        return -1

    def _call_step(self, rest: str, out: list[Piece]) -> int:
        """A step of the format's own modes, between a call's tag and its JSON."""
        raise NotImplementedError

    def _no_object(self, out: list[Piece]) -> None:
        """The text where a JSON object should open does not open one."""
        raise NotImplementedError

    def _finish(self, raw: str, value: object, out: list[Piece]) -> None:
        """The JSON closed and parsed to `value`; `raw` is the call's text. Mode: AFTER."""
        raise NotImplementedError

    def _after(self, rest: str, out: list[Piece]) -> int:
        raise NotImplementedError  # a step after a call


class MistralParser(_JsonCallParser):
    """Mistral's `[TOOL_CALLS]` (the module's docstring). `starts_in_think`: the prompt
    ended inside a think block, so the output is reasoning until `[/THINK]` or `</think>`.
    `max_call_chars`: the bound on one call's text."""

    def __init__(self, *, starts_in_think: bool = False, max_call_chars: int = MAX_CALL_CHARS):
        super().__init__(
            think=((MISTRAL_THINK_OPEN, MISTRAL_THINK_CLOSE), (THINK_OPEN, THINK_CLOSE)),
            triggers=(TOOL_CALLS,),
            starts_in_think=starts_in_think,
            max_call_chars=max_call_chars,
        )
        self._name: list[str] = []
        self._list = False  # the call is a JSON list of calls (v2 to v7)

    def _begin_call(self) -> None:
        super()._begin_call()
        self._mode = _Mode.HEAD
        self._name = []
        self._list = False

    def _call_step(self, rest: str, out: list[Piece]) -> int:
        if self._mode is _Mode.NAME:
            return self._tagged(rest, _NAME_TAGS, self._name_text, out)
        if self._mode is _Mode.CALL_ID:
            return self._tagged(rest, (ARGS,), self._take, out)
        # HEAD: a list opens with `[`, but so do the tags that end an (empty) name
        ws = _space_len(rest)
        head = rest[ws:]
        if not self._take(rest[:ws], out) or not head:
            return ws
        if any(len(head) < len(tag) and tag.startswith(head) for tag in _V11_TAGS):
            return ws  # `[`, `[AR`...: which one shows with the next characters
        if head[0] == "[" and not head.startswith(_V11_TAGS):
            self._list = True
            self._open_value()
        else:
            self._mode = _Mode.NAME
        return ws

    def _name_text(self, text: str, out: list[Piece]) -> None:
        if self._take(text, out):
            self._name.append(text)

    def _tag(self, tag: str, out: list[Piece]) -> None:
        if self._mode is _Mode.NAME or self._mode is _Mode.CALL_ID:
            if tag == "{":  # the name is followed by the arguments at once: `{` opens them
                self._open_value()
                self._scan.end_in("{")
                self._take("{", out)
            elif self._take(tag, out):
                self._mode = _Mode.CALL_ID if tag == CALL_ID else _Mode.VALUE_START
        else:
            super()._tag(tag, out)

    def _no_object(self, out: list[Piece]) -> None:
        out.append(BrokenCall("".join(self._raw), "bad_arguments"))
        self._raw = []
        self._mode = _Mode.AFTER

    def _finish(self, raw: str, value: object, out: list[Piece]) -> None:
        if not self._list:
            name = "".join(self._name).strip()
            named = _NAME.fullmatch(name) is not None
            out.append(call_from_value(name, value, raw) if named else BrokenCall(raw, "no_name"))
            return
        # not a list, or an empty one: as a list holding one item that is not a call
        items = value if isinstance(value, list) and value else [None]
        calls = [
            call_from_value(item.get("name"), item.get("arguments"), raw)
            if isinstance(item, dict)
            else BrokenCall(raw, "invalid_json")
            for item in items
        ]
        broken = [call for call in calls if isinstance(call, BrokenCall)]
        out.extend(broken[:1] or calls)

    def _after(self, rest: str, out: list[Piece]) -> int:
        return self._tagged(rest, (TOOL_CALLS,), lambda text, _: self._junk(text), out)


class Llama3Parser(_JsonCallParser):
    """Llama 3.x's bare JSON calls (the module's docstring). `starts_in_think` (until
    `</think>`) and `max_call_chars` as for `MistralParser`."""

    def __init__(self, *, starts_in_think: bool = False, max_call_chars: int = MAX_CALL_CHARS):
        super().__init__(
            think=((THINK_OPEN, THINK_CLOSE),),
            triggers=(PYTHON_TAG,),
            starts_in_think=starts_in_think,
            max_call_chars=max_call_chars,
        )
        self._bare = False  # the call opened with `{` at the message's start, with no tag

    def _starts_call(self, rest: str, out: list[Piece]) -> int:
        if self._said:
            return -1
        ws = _space_len(rest)
        if ws == len(rest) or rest[ws] != "{":
            return -1
        self._text(rest[:ws], out)  # held with the lead: the object may be text after all
        self._begin_call()
        self._bare = True
        self._open_value()
        return ws

    def _begin_call(self) -> None:
        super()._begin_call()
        self._bare = False
        self._mode = _Mode.VALUE_START

    def _call_step(self, rest: str, out: list[Piece]) -> int:
        # REST: not JSON after the python tag; broken, kept to the end (bounded)
        self._take(rest, out)
        return len(rest)

    def _no_object(self, out: list[Piece]) -> None:
        self._mode = _Mode.REST

    def _finish(self, raw: str, value: object, out: list[Piece]) -> None:
        if not isinstance(value, dict):
            out.append(BrokenCall(raw, "invalid_json"))
        elif self._bare and not any(key in value for key in _CALL_KEYS):
            self._mode = _Mode.TEXT  # an answer that is JSON: the message's text
            self._text(raw, out)
        else:
            arguments = value["parameters"] if "parameters" in value else value.get("arguments")
            out.append(call_from_value(value.get("name"), arguments, raw))

    def _after(self, rest: str, out: list[Piece]) -> int:
        at = 0
        while at < len(rest) and (rest[at].isspace() or rest[at] == ";"):
            at += 1
        tail = rest[at:]
        if not tail or (len(tail) < len(PYTHON_TAG) and PYTHON_TAG.startswith(tail)):
            return at
        if tail.startswith(PYTHON_TAG):
            return at + len(PYTHON_TAG)
        if tail[0] == "{":
            self._begin_call()
            self._open_value()
        else:  # the model went on in prose: the calls are over
            self._after_calls_text = True
            self._mode = _Mode.DROP
        return at


def _space_len(text: str) -> int:
    """The length of the whitespace `text` starts with."""
    return len(text) - len(text.lstrip())


__all__ = ["Llama3Parser", "MistralParser"]

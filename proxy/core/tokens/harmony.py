"""gpt-oss's output, read with `openai-harmony`: generated ids -> typed pieces of a response.

gpt-oss writes its output in the harmony format: messages of the assistant, each on a
channel, framed by special tokens, for example

    <|channel|>analysis<|message|>The user wants the files.<|end|>
    <|start|>assistant<|channel|>commentary to=functions.shell <|constrain|>json
    <|message|>{"q": "ls"}<|call|>

The framing is made of special tokens, so this parser reads the generated ids, not their
text, through the package's own streaming parser (`openai_harmony.StreamableParser`), which
knows the format's headers, recipients and content types. What becomes of each message:

- the `analysis` channel: reasoning (`ReasoningPiece` deltas, `ReasoningEnd` at its end);
- a message with a recipient `functions.NAME`: a tool call to NAME, whose content is the
  JSON text of its arguments, read when the message ends (`CallPiece`, or `BrokenCall` when
  it is no JSON object); another recipient (a built-in tool such as `browser.search`) keeps
  its whole name;
- any other message (`final`, and `commentary` without a recipient, the preamble gpt-oss
  addresses to the user): message text (`TextPiece` deltas).

Ids the package cannot read as harmony end the output: what is left is a `BrokenCall` with
reason "malformed", so the response ends incomplete. Generation that ends inside a call is
a `BrokenCall` with reason "unterminated", as for the other formats.

The package needs its vocabulary (`o200k_base.tiktoken`); loading it is I/O and takes a
second or two, so the caller loads the encoding once (upstream/harmony_vocab.py) and every
parser shares it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import wire
from .parsers import BrokenCall, Piece, ReasoningEnd, ReasoningPiece, TextPiece, call_from_value

FUNCTIONS = "functions."
# the framing tokens: the text a server leaves out of its stream is written back from them
# (formats.markers), so the text the token cache keeps is the template's
HARMONY_TAGS = (
    "<|start|>",
    "<|channel|>",
    "<|message|>",
    "<|constrain|>",
    "<|end|>",
    "<|call|>",
    "<|return|>",
)
# the tokens a message ends with: what follows one starts at a special token, so the ids
# generated before it never merge with the next text's
HARMONY_ENDS = ("<|end|>", "<|call|>", "<|return|>")


class HarmonyParser:
    """The ids of one gpt-oss response -> pieces. `encoding` is a loaded
    `openai_harmony.HarmonyEncoding` (the gpt-oss one)."""

    def __init__(self, encoding: Any) -> None:
        from openai_harmony import HarmonyError, Role, StreamableParser, StreamState

        self._encoding = encoding
        self._parser = StreamableParser(encoding, role=Role.ASSISTANT)
        self._content = StreamState.CONTENT
        self._error: type[Exception] = HarmonyError
        self._in_message = False
        self._channel: str | None = None
        self._recipient: str | None = None
        self._call: list[str] = []  # the arguments text of the call being written
        self._calls = 0
        self._after_calls = False
        self._broken: list[int] | None = None  # ids after the format broke

    @property
    def after_calls_text(self) -> bool:
        return self._after_calls

    def feed(self, delta: str) -> list[Piece]:
        raise TypeError("HarmonyParser reads ids: call feed_ids")

    def feed_ids(self, ids: Sequence[int]) -> list[Piece]:
        """The pieces that `ids`, the next generated ids, complete."""
        out: list[Piece] = []
        for token in ids:
            if self._broken is not None:
                self._broken.append(token)
                continue
            try:
                self._parser.process(token)
            except self._error:
                self._broken = [token]
                continue
            self._step(out)
        return out

    def end(self) -> list[Piece]:
        """Generation ended: the message being written, finished or not."""
        out: list[Piece] = []
        if self._broken is not None:
            text = self._encoding.decode(self._broken)
            return [BrokenCall(text, "malformed")]
        if self._in_message and self._recipient is not None:
            return [BrokenCall("".join(self._call), "unterminated")]
        if self._in_message:
            self._finish(out)
        return out

    def _step(self, out: list[Piece]) -> None:
        p = self._parser
        writing = p.state == self._content
        if writing and not self._in_message:  # a message's content begins
            self._in_message = True
            self._channel, self._recipient = p.current_channel, p.current_recipient
        delta = p.last_content_delta if writing else None
        if delta:
            self._content_delta(delta, out)
        if self._in_message and not writing:  # its end token
            self._finish(out)

    def _content_delta(self, delta: str, out: list[Piece]) -> None:
        if self._recipient is not None:
            self._call.append(delta)
        elif self._channel == "analysis":
            out.append(ReasoningPiece(delta))
        elif self._calls:
            # text after the calls: a model that goes on instead of stopping at <|call|>
            self._after_calls = self._after_calls or bool(delta.strip())
        else:
            out.append(TextPiece(delta))

    def _finish(self, out: list[Piece]) -> None:
        channel, recipient, raw = self._channel, self._recipient, "".join(self._call)
        self._in_message, self._channel, self._recipient = False, None, None
        self._call = []
        if recipient is None:
            if channel == "analysis":
                out.append(ReasoningEnd())
            return
        self._calls += 1
        try:
            arguments: object = wire.loads(raw)
        except wire.JSONDecodeError:
            out.append(BrokenCall(raw, "invalid_json"))
            return
        out.append(call_from_value(recipient.removeprefix(FUNCTIONS), arguments, raw))

"""Feeding the token path's output parsers (proxy/core/tokens/parsers*.py) in tests: the pieces
of a text fed in fragments, joined as a client sees them in the end."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from wsmode.core.tokens.parsers import (
    BrokenCall,
    CallArgs,
    CallPiece,
    CallStart,
    OutputParser,
    Piece,
    ReasoningEnd,
    ReasoningPiece,
    TextPiece,
)

Make = Callable[[], OutputParser]


def joined(pieces: Iterable[Piece]) -> list[Piece]:
    """Adjacent text (and reasoning) deltas as one piece: what a client sees in the end. The
    end of a think block is a boundary, not content: the parsers' tests check it on its own.
    A streamed call (`CallStart`, `CallArgs`..., then its `CallPiece`) is one `CallPiece`,
    checked to be the name and the deltas joined; a streamed call that broke is its
    `BrokenCall`."""
    out: list[Piece] = []
    started: tuple[str, list[str]] | None = None
    for piece in pieces:
        if isinstance(piece, ReasoningEnd):
            continue
        if isinstance(piece, CallStart):
            assert started is None, "a call started inside a call"
            started = (piece.name, [])
            continue
        if isinstance(piece, CallArgs):
            assert started is not None and piece.text, "arguments outside a call"
            started[1].append(piece.text)
            continue
        if isinstance(piece, CallPiece) and piece.streamed:
            assert started is not None, "a streamed call that never started"
            assert (piece.name, piece.arguments) == (started[0], "".join(started[1]))
            piece, started = CallPiece(piece.name, piece.arguments), None
        elif isinstance(piece, CallPiece):
            assert started is None, "a whole call while one streams"
        elif isinstance(piece, BrokenCall):
            started = None
        else:
            assert started is None, f"{piece} inside a streaming call"
        assert not isinstance(piece, TextPiece | ReasoningPiece) or piece.text, "empty delta"
        last = out[-1] if out else None
        if isinstance(piece, TextPiece) and isinstance(last, TextPiece):
            out[-1] = TextPiece(last.text + piece.text)
        elif isinstance(piece, ReasoningPiece) and isinstance(last, ReasoningPiece):
            out[-1] = ReasoningPiece(last.text + piece.text)
        else:
            out.append(piece)
    return out


def fed(make: Make, fragments: Iterable[str]) -> tuple[list[Piece], bool]:
    """The joined pieces of `fragments` fed in order, then the end; and `after_calls_text`."""
    parser = make()
    pieces: list[Piece] = []
    for fragment in fragments:
        pieces += parser.feed(fragment)
    pieces += parser.end()
    return joined(pieces), parser.after_calls_text

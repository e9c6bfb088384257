"""The simulated model's token vocabulary: deterministic, reversible, with special tokens.

Ids:
- 0..15 are special tokens; the named ones are `<pad>` 0, `<eos>` 1, `<bos>` 2,
  `<start_of_turn>` 3 and `<end_of_turn>` 4 (the rest are reserved and decode to nothing).
- A pair of ASCII characters is one token, `16 + 128 * first + second`.
- Any other character (an ASCII one left alone at the end of a run, or any non-ASCII one) is
  one token, `PAIR_END + code point`.

So every token decodes to whole characters (a streamed piece is always valid text), and
decoding the ids of a text gives the text back exactly. Text is split at special tokens
first (when they are parsed), and each part is encoded on its own, so the ids of a text cut
at a special token's boundary are the ids of the parts, one after the other, as a real
tokenizer's are. Like a real one it is not additive elsewhere: "ab" + "c" is not "a" + "bc".

`burn` models a real server's tokenising cost: CPU time per token, spent busily.
"""

from __future__ import annotations

import re
import time
from typing import Any

SPECIALS = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<start_of_turn>": 3, "<end_of_turn>": 4}
PAD, EOS, BOS = 0, 1, 2
_SPECIAL_TEXT = {v: k for k, v in SPECIALS.items()}
_SPECIAL_IDS = 16
_PAIR_END = _SPECIAL_IDS + 128 * 128
VOCAB_SIZE = _PAIR_END + 0x110000  # every code point has a token
_SPLIT = re.compile("(" + "|".join(re.escape(s) for s in SPECIALS) + ")")


def _encode_text(text: str, out: list[int], pairs: bool = True) -> None:
    if pairs and text.isascii():  # every character pairs with the next: the pairs' ids at once
        data = text.encode()
        n = len(data) - len(data) % 2
        out += [_SPECIAL_IDS + 128 * a + b for a, b in zip(data[0:n:2], data[1:n:2], strict=True)]
        if n < len(data):
            out.append(_PAIR_END + data[-1])
        return
    i, n = 0, len(text)
    while i < n:
        c = ord(text[i])
        if pairs and c < 128 and i + 1 < n and (d := ord(text[i + 1])) < 128:
            out.append(_SPECIAL_IDS + 128 * c + d)
            i += 2
        else:
            out.append(_PAIR_END + c)
            i += 1


def encode(
    text: str, *, add_special: bool = False, parse_special: bool = True, pairs: bool = True
) -> list[int]:
    """`text`'s ids; `add_special` puts `<bos>` first, `parse_special` reads special tokens
    written in the text as themselves (else they are ordinary text). `pairs` False makes
    every character one token: the same vocabulary, another tokenizer (`sim.tokenizer`)."""
    out = [BOS] if add_special else []
    if not parse_special:
        _encode_text(text, out, pairs)
        return out
    for part in _SPLIT.split(text):
        special = SPECIALS.get(part)
        if special is not None:
            out.append(special)
        elif part:
            _encode_text(part, out, pairs)
    return out


def piece(token: int) -> str:
    """One token's text (a special token's name); raises ValueError outside the vocabulary."""
    if token >= _PAIR_END and token < VOCAB_SIZE:
        return chr(token - _PAIR_END)
    if token >= _SPECIAL_IDS and token < _PAIR_END:
        pair = token - _SPECIAL_IDS
        return chr(pair // 128) + chr(pair % 128)
    if 0 <= token < _SPECIAL_IDS:
        return _SPECIAL_TEXT.get(token, "")
    raise ValueError(f"token id {token} is out of the vocabulary (0..{VOCAB_SIZE - 1})")


# the text of every id below _PAIR_END (the specials, then the pairs): a lookup, not a call
_PIECES = [_SPECIAL_TEXT.get(t, "") for t in range(_SPECIAL_IDS)] + [
    chr(p // 128) + chr(p % 128) for p in range(128 * 128)
]


def decode(tokens: list[int]) -> str:
    """The text of ids inside the vocabulary (`out_of_range` finds any other)."""
    table = _PIECES
    return "".join([table[t] if t < _PAIR_END else chr(t - _PAIR_END) for t in tokens])


def all_ints(values: list[Any]) -> bool:
    """Every value a JSON integer as decoded (a bool is not one)."""
    return set(map(type, values)) <= {int}


def out_of_range(tokens: list[int]) -> int | None:
    """The first id outside the vocabulary, if any."""
    if not tokens or (min(tokens) >= 0 and max(tokens) < VOCAB_SIZE):
        return None
    for t in tokens:
        if not 0 <= t < VOCAB_SIZE:
            return t
    return None


def burn(us_per_token: float, tokens: int) -> None:
    """Spend `us_per_token` microseconds of CPU per token, as a real tokenizer would."""
    if us_per_token <= 0 or tokens <= 0:
        return
    end = time.perf_counter() + us_per_token * tokens / 1e6
    while time.perf_counter() < end:
        pass

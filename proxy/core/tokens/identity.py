"""What a token chain's ids depend on (docs/tokens.md "The fingerprint"): the server's side,
found by the start-up probe (upstream/token_probe.py), and the client's side of a turn.

Ids are reusable only when every part is equal. The server's parts are the engine, the chat
template (with its special tokens), the model the server serves, its vocabulary size and a
tokenizer digest: the ids the server gives a fixed probe text, special tokens and all, so a
server restarted with another model file, or a replica with another tokenizer, never gets ids
made by the first. The client's parts are the `model` string it sent and its tool set.

A fingerprint is the parts joined with `|` in `PARTS` order (the model strings escaped), so
two fingerprints can be compared part by part and a mismatch can say which part changed.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from .. import wire

log = logging.getLogger("wsmode.tokens")

PARTS: Final = ("engine", "model", "template", "tools", "served_model", "vocabulary", "tokenizer")
_ENGINE, _MODEL, _TEMPLATE, _TOOLS, _SERVED, _VOCAB, _TOKENIZER = range(len(PARTS))


def _escape(value: str) -> str:
    return value.replace("%", "%25").replace("|", "%7C")


@dataclass(frozen=True, slots=True)
class ServerIdentity:
    """The server's parts of the fingerprint, as one replica answered the probe."""

    engine: str
    template: str  # the template's digest (ChatTemplate.digest)
    served_model: str  # "" when the server names none
    vocab_size: int  # 0: unknown
    tokenizer: str  # digest of the probe text's ids

    def differences(self, other: ServerIdentity) -> list[str]:
        """The names of the parts in which `other` differs."""
        mine, theirs = self._parts(), other._parts()
        return [name for name, a, b in zip(_SERVER_PARTS, mine, theirs, strict=True) if a != b]

    def describe(self) -> str:
        vocab = self.vocab_size or "unknown"
        return (
            f"{self.engine}, model {self.served_model or 'unnamed'}, vocabulary {vocab}, "
            f"tokenizer {self.tokenizer}, template {self.template[:12]}"
        )

    def _parts(self) -> tuple[str, str, str, int, str]:
        return (self.engine, self.template, self.served_model, self.vocab_size, self.tokenizer)


_SERVER_PARTS: Final = ("engine", "template", "served_model", "vocabulary", "tokenizer")


def tokenizer_digest(ids: Sequence[int]) -> str:
    return hashlib.sha256(wire.dumps(list(ids))).hexdigest()[:16]


def tools_digest(tools: object) -> str:
    return hashlib.sha256(wire.dumps(tools)).hexdigest()[:16] if tools else ""


def fingerprint(server: ServerIdentity, model: object, tools: object) -> str:
    """The fingerprint of a turn on `server` with the client's `model` and `tools`."""
    parts = ["", "", "", "", "", "", ""]
    parts[_ENGINE] = server.engine
    parts[_MODEL] = _escape(str(model))
    parts[_TEMPLATE] = server.template
    parts[_TOOLS] = tools_digest(tools)
    parts[_SERVED] = _escape(server.served_model)
    parts[_VOCAB] = str(server.vocab_size)
    parts[_TOKENIZER] = server.tokenizer
    return "|".join(parts)


def changed_parts(old: str, new: str) -> list[str]:
    """The names of the parts in which two fingerprints differ (a part missing from an
    older, shorter fingerprint counts as changed)."""
    a, b = old.split("|"), new.split("|")
    names = list(PARTS) + [f"part {i}" for i in range(len(PARTS), max(len(a), len(b)))]
    return [
        names[i]
        for i in range(max(len(a), len(b)))
        if (a[i] if i < len(a) else None) != (b[i] if i < len(b) else None)
    ]


def vocab_of(fingerprint_: str) -> int:
    """The vocabulary size a fingerprint records (0: unknown, or an older fingerprint)."""
    parts = fingerprint_.split("|")
    if len(parts) != len(PARTS) or not parts[_VOCAB].isdigit():
        return 0
    return int(parts[_VOCAB])


# the ids a token cache can hold (a C int each, `array("i")`): the bound on an id when the
# server's vocabulary size is unknown
ID_LIMIT: Final = 1 << 31


def out_of_vocab(ids: Sequence[int], vocab_size: int) -> int | None:
    """The first id that no vocabulary of `vocab_size` ids has (0: unknown size, bounded by
    `ID_LIMIT`; a negative id whatever the size), else None."""
    limit = vocab_size or ID_LIMIT
    if not ids or (min(ids) >= 0 and max(ids) < limit):
        return None  # the common case, at C speed
    for x in ids:
        if not 0 <= x < limit:
            return x
    return None


def vocabulary(vocab_size: int) -> str:
    """The vocabulary an id was outside of, for an error message."""
    return f"its vocabulary of {vocab_size} ids" if vocab_size else "any vocabulary"


def log_change(old: str, new: str) -> None:
    """Say which parts of the fingerprint changed, since the metric says only that one did."""
    log.info(
        "token path: the parent's ids are not reused, its fingerprint differs in %s; the "
        "conversation is tokenised afresh",
        ", ".join(changed_parts(old, new)),
    )


__all__ = [
    "ID_LIMIT",
    "PARTS",
    "ServerIdentity",
    "changed_parts",
    "fingerprint",
    "log_change",
    "out_of_vocab",
    "tokenizer_digest",
    "tools_digest",
    "vocab_of",
    "vocabulary",
]

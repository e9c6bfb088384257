"""How many tokens a conversation item costs the upstream model (docs/protocol.md "Compaction").

Counts decide `truncation: "auto"` (what still fits `upstream.context_window`),
`truncation: "disabled"` (a 400 instead of a doomed upstream call), when
`context_management` compacts, and the usage reported when the upstream reports none.

Two sources, in order of preference:

- **exact**: the upstream's own tokenizer (`POST /tokenize`, which llama.cpp and vLLM
  serve), asked once per item in the background, off the request path, for the item's
  text (`item_text`). Until the answer arrives the estimate stands in.
- **estimate**: the item's serialised JSON length divided by `tokens.bytes_per_token`
  (4 by default). JSON is longer than the text a chat template renders, so the estimate
  errs high, which is the safe side for a context window.

Either way every item also costs `ITEM_OVERHEAD` tokens for the role markers a chat
template wraps around it, and an image or file part a flat `ATTACHMENT_TOKENS` instead of
the length of its base64 data. Counts are computed once per item and kept beside it, a
`TokenCounts` per rendered segment (see proxy/core/context/render.py); a `TokenJob` asks the
upstream's tokenizer for a segment's exact counts. Nothing here does I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .. import wire
from .compaction import ItemFacts, facts_of

ITEM_OVERHEAD = 4  # role markers and separators of a chat template, per item
ATTACHMENT_TOKENS = 768  # one image or file part, whatever its encoded size
_ATTACHMENT_TYPES = frozenset({"input_image", "input_file", "image", "file"})
_ATTACHMENT_MARKERS = (b'"input_image"', b'"input_file"')
# Keys whose strings a chat template never shows the model.
_HIDDEN_KEYS = frozenset(
    {"id", "type", "role", "status", "call_id", "encrypted_content", "annotations", "logprobs"}
)


class TokenEstimator:
    """Token estimates from byte lengths (no tokenizer)."""

    def __init__(self, bytes_per_token: float = 4.0) -> None:
        if bytes_per_token <= 0:
            raise ValueError("bytes_per_token must be positive")
        self.bytes_per_token = bytes_per_token

    def of_bytes(self, n: int) -> int:
        return math.ceil(n / self.bytes_per_token)

    def of_text(self, text: str) -> int:
        return self.of_bytes(len(text.encode()))

    def item(self, item: bytes) -> int:
        """The estimate for one serialised item, attachments at their flat cost."""
        if any(marker in item for marker in _ATTACHMENT_MARKERS):
            doc = wire.loads(item)
            attachments = _count_attachments(doc)
            if attachments:
                stripped = wire.dumps(_without_attachments(doc))
                return (
                    self.of_bytes(len(stripped)) + ITEM_OVERHEAD + attachments * ATTACHMENT_TOKENS
                )
        return self.of_bytes(len(item)) + ITEM_OVERHEAD


def exact_item(text_tokens: int, attachments: int) -> int:
    """An item's count from the tokenizer's count of its text (see `item_text`)."""
    return text_tokens + ITEM_OVERHEAD + attachments * ATTACHMENT_TOKENS


def item_text(item: bytes) -> tuple[str, int]:
    """What a chat template shows the model of an item, for the tokenizer: its strings
    (message text, tool names, arguments, outputs, summaries) joined by newlines, without
    ids, types, statuses or opaque content. Also the number of attachment parts."""
    doc = wire.loads(item)
    parts: list[str] = []
    _collect(doc, parts)
    return "\n".join(parts), _count_attachments(doc)


def _collect(node: Any, out: list[str]) -> None:
    if isinstance(node, str):
        out.append(node)
    elif isinstance(node, list):
        for value in node:
            _collect(value, out)
    elif isinstance(node, dict):
        if node.get("type") in _ATTACHMENT_TYPES:
            return
        for key, value in node.items():
            if key not in _HIDDEN_KEYS:
                _collect(value, out)


def _count_attachments(node: Any) -> int:
    if isinstance(node, list):
        return sum(_count_attachments(v) for v in node)
    if isinstance(node, dict):
        if node.get("type") in _ATTACHMENT_TYPES:
            return 1
        return sum(_count_attachments(v) for v in node.values())
    return 0


def _without_attachments(node: Any) -> Any:
    if isinstance(node, list):
        return [_without_attachments(v) for v in node if not _is_attachment(v)]
    if isinstance(node, dict):
        return {k: _without_attachments(v) for k, v in node.items()}
    return node


def _is_attachment(node: Any) -> bool:
    return isinstance(node, dict) and node.get("type") in _ATTACHMENT_TYPES


def tokenize_count(answer: Any) -> int | None:
    """The token count in a `/tokenize` answer: vLLM sends `count` and `tokens`, llama.cpp
    only `tokens`. None if the answer has neither."""
    if not isinstance(answer, dict):
        return None
    count = answer.get("count")
    if wire.is_int(count) and count >= 0:
        return count
    tokens = answer.get("tokens")
    if isinstance(tokens, list):
        return len(tokens)
    return None


def tokenize_body(text: str) -> dict[str, Any]:
    """A `/tokenize` request both llama.cpp (`content`) and vLLM (`prompt`) understand,
    without the special tokens a template adds (they are in `ITEM_OVERHEAD`)."""
    return {"content": text, "prompt": text, "add_special": False, "add_special_tokens": False}


# ---------------------------------------------------------------- counts of rendered items


@dataclass(eq=False)
class TokenCounts:
    """The rendered items of one segment (or of one request's input) and their counts."""

    items: tuple[bytes, ...]
    counts: list[int]
    restart: int  # index where the latest compaction's expansion begins, -1 if none
    exact: bool = False
    queued: bool = False
    _facts: list[ItemFacts] | None = None

    def facts(self) -> list[ItemFacts]:
        if self._facts is None:
            self._facts = [facts_of(i) for i in self.items]
        return self._facts


@dataclass(frozen=True, slots=True, eq=False)
class TokenJob:
    """Items whose exact counts the adapter should ask the upstream's tokenizer for."""

    target: TokenCounts
    items: tuple[bytes, ...]

"""Compaction items and compaction planning for stateless upstreams (docs/protocol.md "Compaction").

A stateless model server cannot compact a conversation itself, so the proxy does: it asks
the upstream model, in an ordinary request, to summarise the older part of the conversation
(`summary_request`), and hands the client a `compaction` item whose `encrypted_content`
seals (proxy/core/context/sealing.py) everything the conversation's start now stands for:

    head     the leading system/developer messages, kept verbatim (an agent's system prompt
             must never be paraphrased)
    summary  the upstream's summary of the older part
    tail     recent items kept verbatim (empty for `POST /v1/responses/compact`, which
             returns them in the clear after the item)

When a later request carries the item, in its input or in the cached history behind
`previous_response_id`, it is *expanded* for the upstream into `head`, one user message
holding the summary (`summary_message`), then `tail`. As OpenAI documents for its own
items, everything before the latest compaction item is then dropped: the item stands for
it. The token is bound to the credential that created it (its hash is the associated data),
so another credential's request cannot open it.

A `compaction_trigger` input item (Codex's remote compaction) asks for the same thing as
`POST /v1/responses/compact`, inside an ordinary create: the conversation so far, with the
rest of that input, is compacted and the response's only output is the compaction item.
Its recent tail is sealed inside the item (the client keeps only the item), and the
trigger itself is never sent upstream.

Planning (`plan_split`) chooses where the older part ends: never inside a tool call and its
output (`call_id` pairs), preferably where a user turn begins, and never after the start of
the new input, which is always kept verbatim.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .. import wire
from ..errors import ClientError, invalid, missing, wrong_type
from ..request import kept_items, normalise_input
from .sealing import Sealer, SealError

PAYLOAD_VERSION = 1
COMPACTION_MARKER = b'"type":"compaction"'  # how every item we hold spells it (orjson)
SUMMARY_PREFIX = (
    "This summarises the earlier part of our conversation, which was compacted to fit the "
    "context window:\n\n"
)
SUMMARY_INSTRUCTIONS = (
    "You compact conversations. The user message holds a transcript of the earlier part of "
    "a conversation between a user and an AI assistant, with the assistant's tool calls and "
    "their results. Write a summary from which the assistant can carry on without the "
    "transcript: what the user wants and asked for, decisions made, facts, names and numbers "
    "learned, the state of any work in progress (files, commands, results, errors), and what "
    "is still open. Be concise and factual, use short paragraphs or bullet points, do not "
    "address the user, and do not invent anything."
)
MAX_TRANSCRIPT_ITEM_CHARS = 4000  # one item's share of the transcript; the rest is elided
_PINNED_ROLES = frozenset({"system", "developer"})


@dataclass(frozen=True, slots=True)
class Compacted:
    """What a compaction item holds once opened."""

    head: tuple[bytes, ...]
    summary: str
    tail: tuple[bytes, ...]

    def expand(self) -> tuple[bytes, ...]:
        middle = (summary_message(self.summary),) if self.summary else ()
        return (*self.head, *middle, *self.tail)


def summary_message(summary: str) -> bytes:
    text = SUMMARY_PREFIX + summary
    return wire.dumps(
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    )


_SUMMARY_HEAD = summary_message("")[: -len(b'"}]}')]


def is_summary(item: bytes) -> bool:
    """Whether an item is the expansion of a compaction's summary."""
    return item.startswith(_SUMMARY_HEAD)


def seal(sealer: Sealer, compacted: Compacted, owner: str, item_id: str) -> dict[str, Any]:
    """The `compaction` item for `compacted`, readable only by this proxy and `owner`."""
    payload = b"".join(
        (
            b'{"v":',
            str(PAYLOAD_VERSION).encode(),
            b',"summary":',
            wire.dumps(compacted.summary),
            b',"head":[',
            b",".join(compacted.head),
            b'],"tail":[',
            b",".join(compacted.tail),
            b"]}",
        )
    )
    return {
        "id": item_id,
        "type": "compaction",
        "encrypted_content": sealer.seal(payload, owner.encode()),
    }


def open_item(sealer: Sealer, item: dict[str, Any], owner: str) -> Compacted:
    """Authenticate and decrypt a compaction item; a 400 `invalid_encrypted_content` if it
    was altered, sealed by another key (another proxy, or before a restart with a generated
    key) or for another credential."""
    content = item.get("encrypted_content")
    if not isinstance(content, str):
        raise _invalid("a compaction item needs its 'encrypted_content' string")
    try:
        doc = wire.loads(sealer.open(content, owner.encode()))
    except SealError as exc:
        raise _invalid(str(exc)) from None
    except wire.JSONDecodeError:
        raise _invalid("its content is not a compaction payload") from None
    if (
        not isinstance(doc, dict)
        or doc.get("v") != PAYLOAD_VERSION
        or not isinstance(doc.get("summary"), str)
        or not all(isinstance(doc.get(k), list) for k in ("head", "tail"))
    ):
        raise _invalid("its content is not a compaction payload this proxy understands")
    return Compacted(
        head=tuple(wire.all_kept(doc["head"])),
        summary=doc["summary"],
        tail=tuple(wire.all_kept(doc["tail"])),
    )


def _invalid(why: str) -> ClientError:
    return ClientError(
        f"A compaction item in the input cannot be used: {why}. Compaction items are only "
        "valid on the proxy, and for the credential, that created them; restart the "
        "conversation from its full history.",
        code="invalid_encrypted_content",
        param="input",
    )


# ---------------------------------------------------------------- compaction_trigger

TRIGGER_MARKER = b'"type":"compaction_trigger"'


def is_trigger(item: bytes) -> bool:
    """Whether an item is a `compaction_trigger` (parsed only when it can be one)."""
    if TRIGGER_MARKER not in item:
        return False
    doc = wire.loads(item)
    return isinstance(doc, dict) and doc.get("type") == "compaction_trigger"


def has_trigger(items: Sequence[bytes]) -> bool:
    """Whether a request's new input ends with a `compaction_trigger` (`check_trigger`
    already made sure no other position holds one)."""
    return bool(items) and is_trigger(items[-1])


def check_trigger(items: Sequence[bytes], generate: bool) -> None:
    """A `compaction_trigger` must be the last input item, at most once, of a request that
    generates (docs/protocol.md "Compaction": "must be the final input item"). Raises
    ClientError."""
    for i, item in enumerate(items):
        if not is_trigger(item):
            continue
        if i != len(items) - 1:
            raise invalid("A 'compaction_trigger' item must be the last input item.", f"input[{i}]")
        if not generate:
            raise invalid(
                "A 'compaction_trigger' item cannot be sent with 'generate': false; the "
                "compaction is the response.",
                "generate",
            )


def compaction_of(item: bytes) -> dict[str, Any] | None:
    """The item as a dict if it is a compaction item, else None, parsing only items that
    can be one: inside a JSON string the marker's quotes would be escaped."""
    if COMPACTION_MARKER not in item:
        return None
    doc = wire.loads(item)
    return doc if isinstance(doc, dict) and doc.get("type") == "compaction" else None


# ---------------------------------------------------------------- planning


@dataclass(frozen=True, slots=True)
class ItemFacts:
    """What planning needs to know of an item."""

    type: str
    role: str | None
    call_id: str | None

    @property
    def starts_turn(self) -> bool:
        return self.type == "message" and self.role == "user"

    @property
    def pinned(self) -> bool:
        return self.type == "message" and self.role in _PINNED_ROLES


def facts_of(item: bytes) -> ItemFacts:
    doc = wire.loads(item)
    if not isinstance(doc, dict):
        return ItemFacts("", None, None)
    kind = doc.get("type")
    role = doc.get("role")
    call_id = doc.get("call_id")
    if kind is None and role is not None:
        kind = "message"  # an EasyInputMessage may omit its type
    return ItemFacts(
        kind if isinstance(kind, str) else "",
        role if isinstance(role, str) else None,
        call_id if isinstance(call_id, str) else None,
    )


def pinned_head(facts: Sequence[ItemFacts], limit: int) -> int:
    """How many leading items are system/developer messages (kept verbatim), at most `limit`."""
    n = 0
    while n < limit and facts[n].pinned:
        n += 1
    return n


def safe_cuts(facts: Sequence[ItemFacts]) -> list[bool]:
    """`ok[c]`: cutting before item c separates no tool call from its output(s)."""
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for i, f in enumerate(facts):
        if f.call_id is not None:
            first.setdefault(f.call_id, i)
            last[f.call_id] = i
    crossing = [0] * (len(facts) + 2)
    for call_id, lo in first.items():
        hi = last[call_id]
        if hi > lo:  # cuts lo+1 .. hi would split the pair
            crossing[lo + 1] += 1
            crossing[hi + 1] -= 1
    ok: list[bool] = []
    open_pairs = 0
    for c in range(len(facts) + 1):
        open_pairs += crossing[c]
        ok.append(open_pairs == 0)
    return ok


def plan_split(
    facts: Sequence[ItemFacts],
    counts: Sequence[int],
    lo: int,
    hi: int,
    budget: int,
) -> int | None:
    """The smallest cut c in [lo, hi] (keep items c.. onwards) whose suffix costs at most
    `budget` tokens, without splitting a tool call from its output. A cut where a user turn
    starts is preferred to any other; None if no cut in range fits."""
    if lo > hi:
        return None
    ok = safe_cuts(facts)
    suffix = [0] * (len(counts) + 1)
    for i in range(len(counts) - 1, -1, -1):
        suffix[i] = suffix[i + 1] + counts[i]
    fitting = [c for c in range(lo, hi + 1) if ok[c] and suffix[c] <= budget]
    for c in fitting:
        if c == len(facts) or facts[c].starts_turn:
            return c
    return fitting[0] if fitting else None


def last_safe_cut(facts: Sequence[ItemFacts], lo: int, hi: int) -> int | None:
    """The largest cut in [lo, hi] that splits no tool call from its output."""
    ok = safe_cuts(facts)
    for c in range(hi, lo - 1, -1):
        if ok[c]:
            return c
    return None


def new_input_start(facts: Sequence[ItemFacts], first_input: int, chained: bool) -> int:
    """Where the request's new input begins. With `previous_response_id` that is all of
    `input`; a client that resends the whole history each turn sends its new input as the
    items from its last user message on."""
    if chained:
        return first_input
    for i in range(len(facts) - 1, first_input - 1, -1):
        if facts[i].starts_turn:
            return i
    return first_input


# ---------------------------------------------------------------- the summary request


def transcript(items: Sequence[bytes], instructions: str | None = None) -> str:
    """The older part as plain text, one block per item, for the summarising model. Plain
    text, not items: any model can read it, whatever its chat template allows."""
    lines: list[str] = []
    if instructions:
        lines.append(f"[instructions the assistant follows] {_clip(instructions)}")
    for raw in items:
        doc = wire.loads(raw)
        if isinstance(doc, dict):
            line = _transcript_line(doc)
            if line:
                lines.append(line)
    return "\n\n".join(lines)


def _transcript_line(doc: dict[str, Any]) -> str:
    kind = doc.get("type", "message")
    if kind == "message":
        return f"[{doc.get('role', 'user')}] {_clip(_text_of(doc.get('content')))}"
    if kind in ("function_call", "custom_tool_call"):
        args = doc.get("arguments", doc.get("input", ""))
        return f"[assistant calls tool {doc.get('name', '?')}] {_clip(str(args))}"
    if kind in ("function_call_output", "custom_tool_call_output"):
        return f"[tool result] {_clip(_text_of(doc.get('output')))}"
    if kind == "reasoning":
        text = _text_of(doc.get("summary"))
        return f"[assistant reasoning] {_clip(text)}" if text else ""
    return f"[{kind}] {_clip(_text_of({k: v for k, v in doc.items() if k not in ('id', 'type')}))}"


def _text_of(node: Any) -> str:
    if isinstance(node, str):
        return node
    if isinstance(node, list):
        return "\n".join(t for t in (_text_of(v) for v in node) if t)
    if isinstance(node, dict):
        if node.get("type") in ("input_image", "input_file"):
            return "[attachment]"
        for key in ("text", "refusal", "output", "content"):
            if key in node:
                return _text_of(node[key])
        return wire.dumps(node).decode()
    return "" if node is None else str(node)


def _clip(text: str) -> str:
    if len(text) <= MAX_TRANSCRIPT_ITEM_CHARS:
        return text
    cut = len(text) - MAX_TRANSCRIPT_ITEM_CHARS
    return text[:MAX_TRANSCRIPT_ITEM_CHARS] + f" [... {cut} more characters elided]"


def summary_request(
    model: str, text: str, max_output_tokens: int
) -> tuple[dict[str, Any], list[bytes]]:
    """Settings and input of the upstream request that summarises `text`."""
    settings = {
        "model": model,
        "instructions": SUMMARY_INSTRUCTIONS,
        "max_output_tokens": max_output_tokens,
    }
    message = {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "Transcript:\n\n" + text}],
    }
    return settings, [wire.dumps(message)]


def summary_text(output: Sequence[Any]) -> str:
    """The summary in the summarising response's output: its assistant text."""
    parts: list[str] = []
    for item in output:
        if isinstance(item, dict) and item.get("type") == "message":
            for part in item.get("content") or []:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    parts.append(part["text"])
    return "\n".join(parts).strip()


# ---------------------------------------------------------------- POST /v1/responses/compact


@dataclass(frozen=True, slots=True)
class CompactRequest:
    model: str
    input_items: tuple[bytes, ...]
    previous_response_id: str | None
    instructions: str | None


def parse_compact(body: dict[str, Any]) -> CompactRequest:
    model = body.get("model")
    if not model:
        raise missing("model")
    if not isinstance(model, str):
        raise wrong_type("model", "a string")
    prev = body.get("previous_response_id") or None
    if prev is not None and not isinstance(prev, str):
        raise wrong_type("previous_response_id", "a string")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise wrong_type("instructions", "a string")
    raw = body.get("input")
    if raw is None:
        if prev is None:
            raise missing("input")
        raw = []
    items = kept_items(normalise_input(raw))  # bounded in depth, as a create's
    return CompactRequest(model, items, prev, instructions)

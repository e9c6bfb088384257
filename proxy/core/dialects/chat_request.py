"""Responses request -> Chat Completions request (docs/protocol.md "Chat Completions upstreams",
request side).

Items become messages:

- `instructions` -> a first `system` (or `developer`, configurable) message; `system` and
  `developer` message items take the same role;
- a `message` item -> a message of its role; text parts become a string (joined by a newline,
  as vLLM joins text parts for string-only templates), `input_image` -> an `image_url` part,
  `input_file` -> a `file` part, `input_audio` -> an `input_audio` part;
- an assistant message followed by `function_call` items -> ONE assistant message with
  `content` and `tool_calls` (Chat has no separate call items, and many chat templates reject
  two assistant turns in a row); `function_call_output` -> a `tool` message;
- `reasoning` items -> dropped, or sent as the next assistant message's reasoning field
  (`reasoning_content` or `reasoning`, configurable);
- hosted-tool items (web_search_call, ...) and compaction items -> dropped: a Chat upstream
  cannot replay them; a `compaction_trigger` (which the proxy serves itself unless
  compaction is switched off) -> 400 `unsupported_value`, never silently dropped.

Tools and the other settings are translated in proxy/core/dialects/chat_settings.py, where
the dialect's options (`ChatOptions`) are defined too.

Cost: the conversation cache holds each item as the bytes of its JSON, and the same bytes
objects come back on every turn. `TranslationMemo` keeps each item's translation under those
bytes (the bytes object caches its hash) and a checkpoint of each conversation's assembled
messages, so a continuation parses, translates and walks only its new items; the rest is an
identity comparison and a join (bench/chat_translation.py measures it).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import wire
from ..errors import ClientError, invalid
from ..lru import ByteLRU
from .chat_settings import NAMESPACE_SEP as NAMESPACE_SEP  # re-exported, as before the split
from .chat_settings import SYSTEM_ROLES
from .chat_settings import ChatOptions as ChatOptions  # re-exported: the bench imports it here

log = logging.getLogger("wsmode.chat")

# Piece kinds: how one item contributes to the message list.
MESSAGE = 0  # a complete message (user, system, tool)
TEXT = 1  # assistant text: joins the assistant message being built
CALL = 2  # one `tool_calls` entry of the assistant message being built
REASONING = 3  # the reasoning field of the assistant message being built
SKIP = 4


@dataclass(frozen=True, slots=True)
class Piece:
    kind: int
    data: bytes  # serialised JSON: a message, a tool call, or a JSON string


_SKIP = Piece(SKIP, b"")


@dataclass(slots=True)
class Assembly:
    """The message list being built: finished messages, and the assistant turn still open
    (text, tool calls and reasoning that later items may still join)."""

    out: list[bytes]
    text: bytes | None = None
    calls: list[bytes] = field(default_factory=list)
    reasoning: list[bytes] = field(default_factory=list)
    # where each message came from, when asked (`messages(origins=...)`): the indexes of
    # the first and the last item it was made of; `opened`: the open turn's first item
    origins: list[tuple[int, int]] | None = None
    opened: int = -1
    joined: int = -1

    def copy(self) -> Assembly:
        return Assembly(list(self.out), self.text, list(self.calls), list(self.reasoning))


@dataclass(slots=True, eq=False)
class Checkpoint:
    prefix: tuple[bytes, ...]  # the items translated, the very bytes objects
    state: Assembly  # the assembly after them, before the final flush
    nbytes: int  # bytes of the prefix's items, what the checkpoint is charged


class TranslationMemo:
    """Translations kept between turns, least recently used first out, bounded by bytes.

    Two layers share the budget. Per item: item bytes -> Piece, so an item is parsed and
    translated once. Per conversation: a `Checkpoint` of the assembly after a body's items,
    found again when the next body starts with the same bytes objects (a continuation is its
    parent's items plus new ones), so a turn walks only its new items; the prefix is compared
    by identity at C speed. A resumed checkpoint is replaced by the longer one, so a chain
    holds one. Charges: an item entry its key and translation, a checkpoint its prefix's
    bytes (it keeps those items alive). Checkpoints are evicted before items."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.hits = 0
        self.misses = 0
        self.resumed = 0  # bodies that started from a checkpoint
        self._items: ByteLRU[bytes, Piece] = ByteLRU(max_bytes)
        self._cps: ByteLRU[Checkpoint, None] = ByteLRU(max_bytes)
        self._by_first: dict[bytes, list[Checkpoint]] = {}

    def __len__(self) -> int:
        return len(self._items)

    @property
    def nbytes(self) -> int:
        return self._items.nbytes + self._cps.nbytes

    def get(self, key: bytes) -> Piece | None:
        piece = self._items.get(key)
        if piece is None:
            self.misses += 1
        else:
            self.hits += 1
        return piece

    def put(self, key: bytes, piece: Piece) -> None:
        size = len(key) + len(piece.data)
        if size > self.max_bytes:
            return
        old = self._items.peek(key)
        grows = size - (len(key) + len(old.data) if old is not None else 0)
        # checkpoints go first; the item layer then evicts its own to fit the budget
        self._drop_checkpoints(self.max_bytes - grows)
        self._items.put(key, piece, size)

    def resume(self, items: list[bytes]) -> Checkpoint | None:
        """The longest checkpoint whose prefix the items start with, taken out of the memo."""
        if not items:
            return None
        best: Checkpoint | None = None
        for cp in self._by_first.get(items[0], ()):
            n = len(cp.prefix)
            longer = best is None or n > len(best.prefix)
            ends_alike = longer and n <= len(items) and items[n - 1] is cp.prefix[-1]
            if ends_alike and tuple(items[:n]) == cp.prefix:  # identity per item: C speed
                best = cp
        if best is not None:
            self._drop(best)
            self.resumed += 1
        return best

    def checkpoint(self, cp: Checkpoint) -> None:
        if not cp.prefix or cp.nbytes > self.max_bytes:
            return
        # older checkpoints make room; items are not evicted for one
        self._drop_checkpoints(self.max_bytes - cp.nbytes)
        if self.nbytes + cp.nbytes > self.max_bytes:
            return
        self._cps.put(cp, None, cp.nbytes)
        self._by_first.setdefault(cp.prefix[0], []).append(cp)

    @property
    def checkpoints(self) -> int:
        return len(self._cps)

    def _drop(self, cp: Checkpoint) -> None:
        self._cps.pop(cp)
        siblings = self._by_first[cp.prefix[0]]
        siblings.remove(cp)
        if not siblings:
            del self._by_first[cp.prefix[0]]

    def _drop_checkpoints(self, limit: int) -> None:
        """Drop checkpoints, least recently used first, until the memo holds `limit` bytes."""
        while self.nbytes > limit:
            oldest = self._cps.oldest()
            if oldest is None:
                return
            self._drop(oldest)


# ---------------------------------------------------------------- items


def _texts(content: Any, where: str) -> list[str]:
    """The text of a content value: a string, or a list of text-like parts."""
    if isinstance(content, str):
        return [content]
    if content is None:
        return []
    if not isinstance(content, list):
        raise invalid(f"Invalid '{where}': expected a string or an array of parts.", "input")
    out: list[str] = []
    for part in content:
        if not isinstance(part, dict):
            raise invalid(f"Invalid '{where}': each part must be an object.", "input")
        kind = part.get("type")
        if kind in ("input_text", "output_text", "text", "summary_text", "reasoning_text"):
            out.append(str(part.get("text") or ""))
        elif kind == "refusal":
            out.append(str(part.get("refusal") or ""))
        else:
            raise _unsupported_part(kind, where)
    return out


def _unsupported_part(kind: Any, where: str) -> ClientError:
    return ClientError(
        f"Content part type '{str(kind)[:64]}' in '{where}' cannot be sent to a Chat "
        "Completions upstream.",
        code="unsupported_value",
        param="input",
    )


def _user_content(content: Any) -> Any:
    """User content: a string when it is all text, else Chat content parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid("Invalid message 'content': expected a string or an array.", "input")
    parts: list[dict[str, Any]] = []
    only_text = True
    for part in content:
        if not isinstance(part, dict):
            raise invalid("Invalid message 'content': each part must be an object.", "input")
        kind = part.get("type")
        if kind in ("input_text", "output_text", "text"):
            parts.append({"type": "text", "text": str(part.get("text") or "")})
            continue
        only_text = False
        if kind == "input_image":
            url = part.get("image_url")
            if not isinstance(url, str) or not url:
                raise ClientError(
                    "An 'input_image' needs an 'image_url' (an http(s) or data: URL) for a Chat "
                    "Completions upstream; 'file_id' images cannot be resolved.",
                    code="unsupported_value",
                    param="input",
                )
            image: dict[str, Any] = {"url": url}
            if isinstance(part.get("detail"), str):
                image["detail"] = part["detail"]
            parts.append({"type": "image_url", "image_url": image})
        elif kind == "input_file":
            keys = ("file_data", "file_id", "filename")
            parts.append({"type": "file", "file": {k: part[k] for k in keys if k in part}})
        elif kind == "input_audio":
            audio = part.get("input_audio")
            parts.append({"type": "input_audio", "input_audio": audio})
        else:
            raise _unsupported_part(kind, "message content")
    if only_text:
        return "\n".join(p["text"] for p in parts)
    return parts


def _call_name(item: Mapping[str, Any]) -> str:
    name = item.get("name")
    if not isinstance(name, str) or not name:
        raise invalid("A 'function_call' input item needs a 'name'.", "input")
    ns = item.get("namespace")
    return f"{ns}{NAMESPACE_SEP}{name}" if isinstance(ns, str) and ns else name


def _call_id(item: Mapping[str, Any]) -> str:
    call_id = item.get("call_id")
    if not isinstance(call_id, str) or not call_id:
        raise invalid(f"A '{item.get('type')}' input item needs a 'call_id'.", "input")
    return call_id


def _output_text(output: Any) -> str:
    """A tool result as text: a string, or the text of its parts (images become a marker)."""
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        texts: list[str] = []
        for part in output:
            if isinstance(part, dict) and part.get("type") in ("input_text", "output_text"):
                texts.append(str(part.get("text") or ""))
            elif isinstance(part, dict):
                log.debug("tool output part %s replaced by a marker", part.get("type"))
                texts.append(f"[{part.get('type')} omitted]")
        return "\n".join(texts)
    return wire.dumps(output).decode() if output is not None else ""


def translate_item(item: Any, opts: ChatOptions) -> Piece:
    """One Responses input item -> its contribution to the Chat message list."""
    if not isinstance(item, dict):
        raise invalid("Each input item must be an object.", "input")
    kind = item.get("type") or ("message" if "role" in item else None)
    if kind == "message":
        role = item.get("role")
        content = item.get("content")
        if role == "assistant":
            return Piece(TEXT, wire.dumps_kept("".join(_texts(content, "assistant content"))))
        if role in SYSTEM_ROLES:
            text = "\n".join(_texts(content, f"{role} content"))
            return Piece(MESSAGE, wire.dumps_kept({"role": opts.system_role, "content": text}))
        if role == "user":
            return Piece(
                MESSAGE, wire.dumps_kept({"role": "user", "content": _user_content(content)})
            )
        raise invalid(f"Unknown message role '{str(role)[:32]}'.", "input")
    if kind in ("function_call", "custom_tool_call"):
        if kind == "function_call":
            args = item.get("arguments")
            args = args if isinstance(args, str) else wire.dumps(args or {}).decode()
        else:  # a custom tool's free-form input, carried as a JSON argument
            args = wire.dumps({"input": item.get("input") or ""}).decode()
        call = {
            "id": _call_id(item),
            "type": "function",
            "function": {"name": _call_name(item), "arguments": args},
        }
        return Piece(CALL, wire.dumps_kept(call))
    if kind in ("function_call_output", "custom_tool_call_output"):
        msg = {
            "role": "tool",
            "tool_call_id": _call_id(item),
            "content": _output_text(item.get("output")),
        }
        return Piece(MESSAGE, wire.dumps_kept(msg))
    if kind == "reasoning":
        if opts.reasoning == "drop":
            return _SKIP
        texts = _texts(item.get("content"), "reasoning content") or _texts(
            item.get("summary"), "reasoning summary"
        )
        text = "\n".join(texts)
        return Piece(REASONING, wire.dumps_kept(text)) if text else _SKIP
    if kind == "item_reference":
        raise ClientError(
            "'item_reference' input items cannot be resolved for a Chat Completions upstream; "
            "send the item itself.",
            code="unsupported_value",
            param="input",
        )
    if kind == "compaction_trigger":  # served by the proxy; here only with compaction off
        raise ClientError(
            "A 'compaction_trigger' item cannot be sent to a Chat Completions upstream; "
            "it needs the proxy's compaction (compaction.enabled = true).",
            code="unsupported_value",
            param="input",
        )
    log.debug("input item of type %s dropped: a Chat upstream cannot replay it", kind)
    return _SKIP


# ---------------------------------------------------------------- messages


def messages(
    items: Iterable[bytes],
    opts: ChatOptions,
    memo: TranslationMemo | None,
    instructions: str | None = None,
    origins: list[tuple[int, int] | None] | None = None,
) -> list[bytes]:
    """The `messages` array's elements, each serialised, in order. `origins`, when given,
    gets one entry per message: the indexes of the first and the last item it was made of
    (None for the instructions' message); the memo is not used then (a failure path)."""
    items = items if isinstance(items, list) else list(items)
    start, state, nbytes = 0, Assembly([]), 0
    if origins is not None:
        memo, state.origins = None, []
    cp = memo.resume(items) if memo is not None else None
    if cp is not None:
        start, state, nbytes = len(cp.prefix), cp.state, cp.nbytes
    for at, raw in enumerate(items[start:], start):
        nbytes += len(raw)
        piece = memo.get(raw) if memo is not None else None
        if piece is None:
            piece = translate_item(wire.loads(raw), opts)
            if memo is not None:
                memo.put(raw, piece)
        kind = piece.kind
        if kind == CALL:
            _open(state, at)
            state.calls.append(piece.data)
        elif kind == TEXT:
            if state.text is not None or state.calls:
                _flush(state, opts)
            _open(state, at)
            state.text = piece.data
        elif kind == REASONING:
            if state.text is not None or state.calls:
                _flush(state, opts)
            _open(state, at)
            state.reasoning.append(piece.data)
        elif kind == MESSAGE:
            _flush(state, opts)
            state.out.append(piece.data)
            if state.origins is not None:
                state.origins.append((at, at))
    if memo is not None and items:
        memo.checkpoint(Checkpoint(tuple(items), state.copy(), nbytes))
    _flush(state, opts)
    if origins is not None and state.origins is not None:
        origins.extend([None] if instructions else [])
        origins.extend(state.origins)
    if instructions:
        return [wire.dumps({"role": opts.system_role, "content": instructions}), *state.out]
    return state.out


def _open(state: Assembly, at: int) -> None:
    """Item `at` joins the open assistant turn (the first one opens it)."""
    if state.opened < 0:
        state.opened = at
    state.joined = at


def _flush(state: Assembly, opts: ChatOptions) -> None:
    """Close the open assistant turn into one message: content, tool_calls, reasoning."""
    opened, state.opened = state.opened, -1
    if state.text is None and not state.calls:
        state.reasoning.clear()  # reasoning that led to no answer is not a turn of its own
        return
    if state.origins is not None:
        state.origins.append((opened, state.joined))
    head = [b'{"role":"assistant","content":', state.text if state.text is not None else b'""']
    if state.calls:
        head += [b',"tool_calls":[', b",".join(state.calls), b"]"]
    if state.reasoning and opts.reasoning != "drop":
        field_name = wire.dumps(opts.reasoning)
        reasoning = state.reasoning
        joined = reasoning[0] if len(reasoning) == 1 else _join_strings(reasoning)
        head += [b",", field_name, b":", joined]
    head.append(b"}")
    state.out.append(b"".join(head))
    state.text = None
    state.calls = []
    state.reasoning = []


def _join_strings(parts: list[bytes]) -> bytes:
    return wire.dumps("\n".join(wire.loads(p) for p in parts))

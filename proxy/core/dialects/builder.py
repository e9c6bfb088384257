"""Writes the canonical Responses event sequence for one response, from plain happenings.

Upstreams that do not speak spec-complete Responses (Chat Completions servers, and llama.cpp's
own `/v1/responses`) are rebuilt through this one writer, so a client sees the same shapes as
from OpenAI (docs/protocol.md "Stream events", "Chat Completions upstreams"; docs/clients.md "What
every client needs"): every event numbered from 0, every item opened with `output_item.added` before
its deltas and closed with its `.done` events, `output_index` and `content_index` on every
item-scoped event, and terminal response objects whose `output` holds every finished item.

Item rules (docs/protocol.md "Chat Completions upstreams"):

- reasoning and message items are sequential: opening one closes the other, and either
  closes when a tool call starts ("text before tool calls");
- function calls stay open until the end, because Chat upstreams interleave the argument
  fragments of parallel calls; they close in output order when the response finishes;
- text that arrives after a tool call opened starts a new message item.

The caller feeds `reasoning()`, `text()`, `refusal()`, `call_open()`, `call_args()`, then
`close_all()` and `finish()`. Each returns the events to forward, serialised.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import wire
from ..api_objects import lifecycle_event, response_object
from ..sse import SSEEvent


@dataclass(slots=True)
class _Part:
    kind: str  # "output_text" | "refusal" | "reasoning_text"
    index: int  # content_index
    chunks: list[str] = field(default_factory=list)

    def text(self) -> str:
        return "".join(self.chunks)

    def done_shape(self) -> dict[str, Any]:
        text = self.text()
        if self.kind == "output_text":
            return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        if self.kind == "refusal":
            return {"type": "refusal", "refusal": text}
        return {"type": "reasoning_text", "text": text}


@dataclass(slots=True)
class _Item:
    index: int  # output_index
    id: str
    type: str  # "message" | "reasoning" | "function_call"
    source: Hashable | None = None  # the upstream's key for it (tool-call index, item id)
    parts: list[_Part] = field(default_factory=list)
    call_id: str = ""
    name: str = ""
    namespace: str | None = None
    args: list[str] = field(default_factory=list)
    done: dict[str, Any] | None = None  # the finished item, once closed

    def part(self, kind: str) -> _Part | None:
        for p in self.parts:
            if p.kind == kind:
                return p
        return None


_ADDED_PART: dict[str, dict[str, Any]] = {
    "output_text": {"type": "output_text", "text": "", "annotations": [], "logprobs": []},
    "refusal": {"type": "refusal", "refusal": ""},
    "reasoning_text": {"type": "reasoning_text", "text": ""},
}
_DELTA_EVENT = {
    "output_text": "response.output_text.delta",
    "refusal": "response.refusal.delta",
    "reasoning_text": "response.reasoning_text.delta",
}


class OutputBuilder:
    def __init__(self, response: dict[str, Any], new_id: Callable[[str], str]) -> None:
        self.response = response  # the in_progress response object, complete
        self._new_id = new_id
        self.seq = 0
        self.items: list[_Item] = []
        self._current: _Item | None = None  # the open reasoning or message item
        self._calls: dict[Hashable, _Item] = {}  # open function calls by upstream key

    # ------------------------------------------------------------ lifecycle

    def start(self) -> list[bytes]:
        resp = self.response
        return [
            self._emit(lifecycle_event("response.created", resp, 0)),
            self._emit(lifecycle_event("response.in_progress", resp, 0)),
        ]

    def finish(
        self,
        status: str,
        *,
        usage: dict[str, Any] | None,
        completed_at: int | None,
        incomplete_reason: str | None = None,
        extra: dict[str, Any] | None = None,
    ) -> tuple[list[bytes], dict[str, Any]]:
        """Close what is open and write the terminal event. Returns it and the final object."""
        out = self.close_all("incomplete" if status == "incomplete" else "completed")
        final = {
            **self.response,
            **(extra or {}),
            "status": status,
            "output": self.output(),
            "usage": usage,
            "completed_at": completed_at if status == "completed" else None,
            "incomplete_details": {"reason": incomplete_reason} if incomplete_reason else None,
        }
        out.append(self._emit(lifecycle_event(f"response.{status}", final, 0)))
        self.response = final
        return out, final

    def output(self) -> list[dict[str, Any]]:
        return [item.done for item in self.items if item.done is not None]

    @property
    def open_count(self) -> int:
        """Items opened and not yet closed (0 at an item boundary)."""
        return sum(1 for item in self.items if item.done is None)

    # ------------------------------------------------------------ content

    def reasoning(self, delta: str, source: Hashable | None = None) -> list[bytes]:
        return self._sequential("reasoning", "reasoning_text", delta, source)

    def text(self, delta: str, source: Hashable | None = None) -> list[bytes]:
        return self._sequential("message", "output_text", delta, source)

    def refusal(self, delta: str, source: Hashable | None = None) -> list[bytes]:
        return self._sequential("message", "refusal", delta, source)

    def call_open(
        self,
        key: Hashable,
        *,
        call_id: str,
        name: str,
        namespace: str | None = None,
        item_id: str | None = None,
    ) -> list[bytes]:
        out = self._close_current()
        item = _Item(len(self.items), item_id or self._new_id("fc"), "function_call", key)
        item.call_id, item.name, item.namespace = call_id, name, namespace
        self.items.append(item)
        self._calls[key] = item
        added = {
            "type": "response.output_item.added",
            "output_index": item.index,
            "item": self._call_shape(item, "in_progress"),
        }
        out.append(self._emit(added))
        return out

    def has_call(self, key: Hashable) -> bool:
        return key in self._calls

    def call_args(self, key: Hashable, delta: str) -> list[bytes]:
        item = self._calls[key]
        if not delta:
            return []
        item.args.append(delta)
        ev = {
            "type": "response.function_call_arguments.delta",
            "item_id": item.id,
            "output_index": item.index,
            "delta": delta,
        }
        return [self._emit(ev)]

    def call_arguments(self, key: Hashable) -> str:
        return "".join(self._calls[key].args)

    def close_source(self, source: Hashable) -> list[bytes]:
        """Close the open item the upstream knows as `source` (its `output_item.done`)."""
        cur = self._current
        if cur is not None and cur.source == source:
            self._current = None
            return self._close(cur, "completed")
        call = self._calls.get(source)
        return self._close(call, "completed") if call is not None else []

    def abandon_call(self, key: Hashable) -> list[bytes]:
        """End the call `key` whose arguments did not parse: its item is done `incomplete`,
        with the arguments streamed so far and no `function_call_arguments.done` (which
        would announce arguments that are whole)."""
        item = self._calls.get(key)
        if item is None:
            return []
        if self._current is item:
            self._current = None
        return self._close(item, "incomplete", arguments_done=False)

    def streamed(self, source: Hashable, part_kind: str) -> str | None:
        """What was streamed so far for the upstream's item `source` (None: never seen);
        `part_kind` is a content part kind, or "arguments" for a function call."""
        for item in self.items:
            if item.source == source:
                if part_kind == "arguments":
                    return "".join(item.args)
                part = item.part(part_kind)
                return part.text() if part is not None else ""
        return None

    def is_open(self, source: Hashable) -> bool:
        cur = self._current
        return (cur is not None and cur.source == source) or source in self._calls

    def close_all(self, status: str = "completed") -> list[bytes]:
        """Close every open item, in output order."""
        open_items = [i for i in self.items if i.done is None]
        out: list[bytes] = []
        for item in open_items:
            out += self._close(item, status)
        self._current = None
        self._calls.clear()
        return out

    # ------------------------------------------------------------ internals

    def _emit(self, ev: dict[str, Any]) -> bytes:
        ev["sequence_number"] = self.seq
        self.seq += 1
        return wire.dumps(ev)

    def _sequential(
        self, kind: str, part_kind: str, delta: str, source: Hashable | None
    ) -> list[bytes]:
        if not delta:
            return []
        out: list[bytes] = []
        cur = self._current
        if cur is None or cur.type != kind or (source is not None and cur.source != source):
            out += self._close_current()
            cur = self._open_sequential(kind, source, out)
        part = cur.part(part_kind)
        if part is None:
            part = _Part(part_kind, len(cur.parts))
            cur.parts.append(part)
            added = {
                "type": "response.content_part.added",
                "item_id": cur.id,
                "output_index": cur.index,
                "content_index": part.index,
                "part": dict(_ADDED_PART[part_kind]),
            }
            out.append(self._emit(added))
        part.chunks.append(delta)
        ev: dict[str, Any] = {
            "type": _DELTA_EVENT[part_kind],
            "item_id": cur.id,
            "output_index": cur.index,
            "content_index": part.index,
            "delta": delta,
        }
        if part_kind == "output_text":
            ev["logprobs"] = []
        out.append(self._emit(ev))
        return out

    def _open_sequential(self, kind: str, source: Hashable | None, out: list[bytes]) -> _Item:
        item_id = source if isinstance(source, str) and source else None
        prefix = "msg" if kind == "message" else "rs"
        item = _Item(len(self.items), item_id or self._new_id(prefix), kind, source)
        self.items.append(item)
        self._current = item
        shape: dict[str, Any] = {"id": item.id, "type": kind}
        if kind == "message":
            shape.update(role="assistant", status="in_progress", content=[])
        else:
            shape.update(summary=[], content=[])
        ev = {"type": "response.output_item.added", "output_index": item.index, "item": shape}
        out.append(self._emit(ev))
        return item

    def _close_current(self) -> list[bytes]:
        cur, self._current = self._current, None
        return self._close(cur, "completed") if cur is not None else []

    def _close(self, item: _Item, status: str, *, arguments_done: bool = True) -> list[bytes]:
        out: list[bytes] = []
        base = {"item_id": item.id, "output_index": item.index}
        if item.type == "function_call":
            if arguments_done:
                args = "".join(item.args)
                ev = {"type": "response.function_call_arguments.done", **base}
                ev.update(name=item.name, arguments=args)
                out.append(self._emit(ev))
            done = self._call_shape(item, status)
            self._calls.pop(item.source, None)
        else:
            for part in item.parts:
                shape = part.done_shape()
                where = {**base, "content_index": part.index}
                if part.kind == "output_text":
                    done_ev = {"type": "response.output_text.done", **where}
                    done_ev.update(text=shape["text"], logprobs=[])
                elif part.kind == "refusal":
                    done_ev = {
                        "type": "response.refusal.done",
                        **where,
                        "refusal": shape["refusal"],
                    }
                else:
                    done_ev = {
                        "type": "response.reasoning_text.done",
                        **where,
                        "text": shape["text"],
                    }
                out.append(self._emit(done_ev))
                out.append(
                    self._emit({"type": "response.content_part.done", **where, "part": shape})
                )
            content = [p.done_shape() for p in item.parts]
            done = {"id": item.id, "type": item.type}
            if item.type == "message":
                done.update(role="assistant", status=status, content=content)
            else:
                done.update(summary=[], content=content)
        item.done = done
        ev_done = {"type": "response.output_item.done", "output_index": item.index, "item": done}
        out.append(self._emit(ev_done))
        return out

    @staticmethod
    def _call_shape(item: _Item, status: str) -> dict[str, Any]:
        shape: dict[str, Any] = {
            "id": item.id,
            "type": "function_call",
            "status": status,
            "call_id": item.call_id,
            "name": item.name,
            "arguments": "".join(item.args),
        }
        if item.namespace is not None:
            shape["namespace"] = item.namespace
        return shape


class BuiltStream:
    """The StreamTranslator members of a stream written by an `OutputBuilder` (the Chat
    translation and the Responses repair): numbering and items come from the builder, and
    the response object is begun and ended here, the same way for both."""

    def __init__(
        self,
        request: dict[str, Any],
        patch: dict[str, Any],
        *,
        clock: Callable[[], float],
        new_id: Callable[[str], str],
    ) -> None:
        self._request = request  # the create body as the client sent it
        self._patch = patch  # fields the response reports differently from the request
        self._clock = clock
        self._new_id = new_id
        self._builder: OutputBuilder | None = None
        self.response_id: str | None = None
        self.response: dict[str, Any] | None = None
        self.outcome: str | None = None
        self.output: list[Any] = []

    @property
    def last_seq(self) -> int:
        return self._builder.seq - 1 if self._builder is not None else -1

    def relay(self, events: Sequence[SSEEvent], start: int, out: list[bytes]) -> int:
        return start  # every event is rewritten: none is relayed as it came

    @property
    def open_items(self) -> int:
        return self._builder.open_count if self._builder is not None else 0

    def finished_items(self) -> list[Any]:
        return self._builder.output() if self._builder is not None else []

    def _begin(self, response_id: str, created_at: int | None, model: Any) -> list[bytes]:
        """Make the response object and the builder; the `response.created` events.
        `created_at` and `model` are the upstream's when it reported them."""
        resp = response_object(
            response_id=response_id,
            request=self._request,
            status="in_progress",
            created_at=int(self._clock()) if created_at is None else created_at,
        )
        resp.update(self._patch)
        if isinstance(model, str) and model:
            resp["model"] = model  # as a Responses upstream reports the model it ran
        self.response_id, self.response = response_id, resp
        self._builder = OutputBuilder(resp, self._new_id)
        return self._builder.start()

    def _end(
        self,
        status: str,
        usage: dict[str, Any] | None,
        completed_at: int | None,
        reason: str | None,
    ) -> list[bytes]:
        """Close what is open and write the terminal event; the stream has its outcome."""
        assert self._builder is not None
        events, final = self._builder.finish(
            status,
            usage=usage,
            completed_at=int(self._clock()) if completed_at is None else completed_at,
            incomplete_reason=reason,
        )
        self.response = final
        self.output = final["output"]
        self.outcome = status
        return events

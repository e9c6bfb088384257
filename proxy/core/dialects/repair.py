"""Repairing a poor upstream `/v1/responses` stream into the canonical sequence.

llama.cpp's server streams Responses events with no `sequence_number`, `output_index` or
`content_index`, no `function_call_arguments.done`, a message item left open while tool
calls stream, a final response object missing most required fields, and `completed` even
when the token limit cut the answer (../shared/upstreams/README.md). The openai SDK's stream
helper crashes on it. `ResponsesStream` detects such a stream on its first event (no
`sequence_number`) and hands it to `ResponsesRepair`, which reads the upstream's events for
their content only and writes the canonical sequence with `OutputBuilder`, keeping the
upstream's response and item ids:

- text, refusal, reasoning (text or summary) and argument deltas are replayed in order;
- a `.done` or `output_item.done` that carries more than its deltas did (or an item that was
  never streamed and appears only in the final `output`) has the missing part replayed as a
  delta first, so the deltas always add up to the final item;
- the final response object is rebuilt complete from the client's request, with the
  upstream's id, `created_at`, model and usage (missing usage details filled with 0);
- `completed` with `usage.output_tokens` at or over the request's `max_output_tokens` becomes
  `incomplete` with reason `max_output_tokens`;
- events it does not know (hosted tools) are dropped: they cannot be placed in the sequence.
"""

from __future__ import annotations

import logging
from typing import Any

from ..api_objects import TERMINAL_TYPES, count, usage_of
from ..errors import UpstreamError
from .builder import BuiltStream

log = logging.getLogger("wsmode.upstream")

_TEXT_DELTAS = {
    "response.output_text.delta": "output_text",
    "response.refusal.delta": "refusal",
    "response.reasoning_text.delta": "reasoning_text",
    "response.reasoning_summary_text.delta": "reasoning_text",
}
_IGNORED = frozenset(
    {
        "response.content_part.added",
        "response.content_part.done",
        "response.output_text.done",
        "response.refusal.done",
        "response.reasoning_text.done",
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_part.done",
        "response.output_text.annotation.added",
    }
)


def fill_usage(usage: Any) -> dict[str, Any] | None:
    """The upstream's usage with every field the shape needs (missing ones 0)."""
    if not isinstance(usage, dict):
        return None
    inp, out = count(usage, "input_tokens"), count(usage, "output_tokens")
    details = usage.get("input_tokens_details")
    return usage_of(
        inp,
        out,
        cached=count(details, "cached_tokens"),
        cache_write=count(details, "cache_write_tokens"),
        reasoning=count(usage.get("output_tokens_details"), "reasoning_tokens"),
        total=count(usage, "total_tokens") or inp + out,
    )


def _as_list(value: Any) -> list[Any]:
    """An upstream's array, or nothing when it sent something else (never a crash)."""
    return value if isinstance(value, list) else []


def _item_texts(item: dict[str, Any]) -> list[tuple[str, str]]:
    """(part kind, text) of a finished message or reasoning item."""
    out: list[tuple[str, str]] = []
    for part in _as_list(item.get("content")):
        if not isinstance(part, dict):
            continue
        kind = part.get("type")
        if kind == "output_text":
            out.append(("output_text", str(part.get("text") or "")))
        elif kind == "refusal":
            out.append(("refusal", str(part.get("refusal") or "")))
        elif kind == "reasoning_text":
            out.append(("reasoning_text", str(part.get("text") or "")))
    if item.get("type") == "reasoning" and not out:
        summary = _as_list(item.get("summary"))
        text = "".join(str(s.get("text") or "") for s in summary if isinstance(s, dict))
        out.append(("reasoning_text", text))
    return out


class ResponsesRepair(BuiltStream):
    def feed_event(self, ev: dict[str, Any]) -> list[bytes]:
        kind = ev.get("type")
        out = self._start(ev.get("response"))
        b = self._builder
        assert b is not None
        if kind in ("response.created", "response.in_progress", "response.queued"):
            return out
        if kind in _TEXT_DELTAS:
            delta = ev.get("delta")
            if isinstance(delta, str):
                out += self._text(_TEXT_DELTAS[kind], delta, ev.get("item_id"))
            return out
        if kind == "response.function_call_arguments.delta":
            key = ev.get("item_id")
            delta = ev.get("delta")
            if isinstance(key, str) and isinstance(delta, str):
                if not b.has_call(key):
                    out += b.call_open(key, call_id=self._new_id("call"), name="", item_id=key)
                out += b.call_args(key, delta)
            return out
        if kind == "response.function_call_arguments.done":
            key = ev.get("item_id")
            if isinstance(key, str) and isinstance(ev.get("arguments"), str):
                out += self._args_tail(key, ev["arguments"])
            return out
        if kind == "response.output_item.added":
            item = ev.get("item")
            if isinstance(item, dict) and item.get("type") == "function_call":
                out += self._call(item)
            return out
        if kind == "response.output_item.done":
            item = ev.get("item")
            if isinstance(item, dict):
                out += self._item_done(item)
            return out
        if kind in TERMINAL_TYPES:
            return out + self._terminal(str(kind), ev.get("response"))
        if kind not in _IGNORED:
            log.debug("repaired upstream stream: %s event dropped", kind)
        return out

    def eof(self) -> list[bytes]:
        if self.outcome is None:
            raise UpstreamError(
                "upstream stream ended before a terminal event", started=True, code="server_error"
            )
        return []

    # ------------------------------------------------------------ internals

    def _start(self, upstream: Any) -> list[bytes]:
        if self._builder is not None:
            return []
        up = upstream if isinstance(upstream, dict) else {}
        rid = up["id"] if isinstance(up.get("id"), str) else self._new_id("resp")
        created = up.get("created_at")
        return self._begin(rid, created if isinstance(created, int) else None, up.get("model"))

    def _text(self, part_kind: str, delta: str, item_id: Any) -> list[bytes]:
        b = self._builder
        assert b is not None
        source = item_id if isinstance(item_id, str) and item_id else None
        if part_kind == "reasoning_text":
            return b.reasoning(delta, source)
        if part_kind == "refusal":
            return b.refusal(delta, source)
        return b.text(delta, source)

    def _call(self, item: dict[str, Any]) -> list[bytes]:
        b = self._builder
        assert b is not None
        key = item.get("id") if isinstance(item.get("id"), str) else self._new_id("fc")
        if b.has_call(key) or b.streamed(key, "arguments") is not None:
            return []
        call_id = item.get("call_id")
        ns = item.get("namespace")
        return b.call_open(
            key,
            call_id=call_id if isinstance(call_id, str) and call_id else self._new_id("call"),
            name=str(item.get("name") or ""),
            namespace=ns if isinstance(ns, str) else None,
            item_id=key,
        )

    def _args_tail(self, key: str, full: str) -> list[bytes]:
        b = self._builder
        assert b is not None
        sent = b.streamed(key, "arguments")
        if sent is None or not b.has_call(key) or not full.startswith(sent):
            return []
        return b.call_args(key, full[len(sent) :])

    def _item_done(self, item: dict[str, Any]) -> list[bytes]:
        b = self._builder
        assert b is not None
        key = item.get("id")
        if not isinstance(key, str) or not key:
            return []
        out: list[bytes] = []
        if item.get("type") == "function_call":
            out += self._call(item)
            if isinstance(item.get("arguments"), str):
                out += self._args_tail(key, item["arguments"])
            return out + b.close_source(key)
        if item.get("type") not in ("message", "reasoning"):
            log.debug("repaired upstream stream: %s item dropped", item.get("type"))
            return out
        seen = b.streamed(key, "output_text") is not None
        if not seen or b.is_open(key):
            for part_kind, text in _item_texts(item):
                sent = b.streamed(key, part_kind) or ""
                if text.startswith(sent) and len(text) > len(sent):
                    out += self._text(part_kind, text[len(sent) :], key)
        return out + b.close_source(key)

    def _terminal(self, kind: str, upstream: Any) -> list[bytes]:
        b = self._builder
        assert b is not None
        up = upstream if isinstance(upstream, dict) else {}
        if kind == "response.failed":
            err: dict[str, Any] = up["error"] if isinstance(up.get("error"), dict) else {}
            code = err.get("code")
            raise UpstreamError(
                str(err.get("message") or "the upstream reported the response failed"),
                started=True,
                code=code if isinstance(code, str) else "server_error",
            )
        out: list[bytes] = []
        for item in _as_list(up.get("output")):  # items (or their tails) only the final has
            if isinstance(item, dict):
                out += self._item_done(item)
        usage = fill_usage(up.get("usage"))
        status = "incomplete" if kind == "response.incomplete" else "completed"
        details = up.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, dict) else None
        limit = self._request.get("max_output_tokens")
        if (
            status == "completed"
            and isinstance(limit, int)
            and usage is not None
            and usage["output_tokens"] >= limit
        ):
            status, reason = "incomplete", "max_output_tokens"
        if status == "incomplete" and not isinstance(reason, str):
            reason = "max_output_tokens"
        completed_at = up.get("completed_at")
        done_at = completed_at if isinstance(completed_at, int) else None
        return out + self._end(status, usage, done_at, reason if status == "incomplete" else None)

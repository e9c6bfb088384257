"""Helpers for feeding recorded Chat / Responses SSE bodies through the dialects."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import orjson
from wsmode.core.dialects import StreamTranslator
from wsmode.core.dialects.chat import ChatDialect
from wsmode.core.dialects.responses import ResponsesDialect
from wsmode.core.sse import SSEDecoder

ROOT = Path(__file__).parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "chat_streams"
# CI and the worktrees have the shared material at ../shared relative to the checkout.
SHARED_UPSTREAMS = ROOT.parent / "shared" / "upstreams"
TRANSCRIPTS = SHARED_UPSTREAMS / "transcripts"


def counter_ids() -> Callable[[str], str]:
    n = itertools.count()
    return lambda prefix: f"{prefix}_{next(n)}"


def translator(kind: str, request: dict[str, Any] | None = None) -> StreamTranslator:
    request = request if request is not None else {"model": "m"}
    patch = {"previous_response_id": request.get("previous_response_id"), "store": False}
    if kind == "chat":
        return ChatDialect(clock=lambda: 1_767_000_000.0, new_id=counter_ids()).translator(
            patch, request
        )
    return ResponsesDialect(clock=lambda: 1_767_000_000.0, new_id=counter_ids()).translator(
        patch, request
    )


def run(t: StreamTranslator, pieces: Iterable[bytes], *, eof: bool = True) -> list[dict[str, Any]]:
    """Decode SSE from `pieces` (any chunking) and translate it; the events as dicts."""
    decoder = SSEDecoder(1 << 24)
    frames: list[bytes] = []
    for piece in pieces:
        for event in decoder.feed(piece):
            frames += t.feed(event)
    if eof:
        frames += t.eof()
    return [orjson.loads(f) for f in frames]


def chunks_of(raw: bytes) -> list[dict[str, Any]]:
    """The JSON chunks of a data-only Chat SSE body, read independently of the proxy."""
    out = []
    for block in raw.replace(b"\r\n", b"\n").split(b"\n\n"):
        for line in block.split(b"\n"):
            if line.startswith(b"data:"):
                data = line[5:].strip()
                if data and data != b"[DONE]":
                    out.append(orjson.loads(data))
    return out


def upstream_content(raw: bytes) -> tuple[str, str, dict[int, str]]:
    """(content text, reasoning text, tool-call arguments by position of first appearance)."""
    text, reasoning = [], []
    args: dict[Any, list[str]] = {}
    for chunk in chunks_of(raw):
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str):
                text.append(delta["content"])
            r = delta.get("reasoning_content") or delta.get("reasoning")
            if isinstance(r, str):
                reasoning.append(r)
            for frag in delta.get("tool_calls") or []:
                key = frag.get("index", frag.get("id"))
                fn = frag.get("function") or {}
                args.setdefault(key, []).append(fn.get("arguments") or "")
    return "".join(text), "".join(reasoning), {i: "".join(v) for i, v in enumerate(args.values())}

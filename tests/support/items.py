"""Conversation items for the unit tests of compaction and context windows."""

from __future__ import annotations

from typing import Any

import orjson

DEV = {"type": "message", "role": "developer", "content": "You are an agent."}


def b(item: dict[str, Any]) -> bytes:
    return orjson.dumps(item)


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": text}


def assistant(text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def call(cid: str) -> dict[str, Any]:
    return {"type": "function_call", "call_id": cid, "name": "run", "arguments": "{}"}


def output(cid: str, text: str = "ok") -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": cid, "output": text}

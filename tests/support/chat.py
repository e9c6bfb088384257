"""Chat Completions bodies built by the dialect, for the unit tests of the Chat request
translation (tests/unit/test_chat_request.py, test_chat_settings.py)."""

from __future__ import annotations

from typing import Any

import orjson
from wsmode.core.dialects.chat import ChatDialect
from wsmode.core.dialects.chat_request import ChatOptions


def body(items: list[Any], options: ChatOptions | None = None, **settings: Any) -> dict[str, Any]:
    dialect = ChatDialect(options)
    raw = b"".join(
        dialect.body(
            {"model": "m", **settings},
            {"stream": True, "store": False},
            [orjson.dumps(i) for i in items],
        )
    )
    doc = orjson.loads(raw)  # also proves the pieces join into valid JSON
    assert isinstance(doc, dict)
    return doc


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": text}

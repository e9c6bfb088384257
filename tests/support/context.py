"""Managers, requests and conversations for the unit tests of the context window
(tests/unit/test_context*.py)."""

from __future__ import annotations

from typing import Any

import orjson
from wsmode.core.context.manager import ContextManager
from wsmode.core.context.sealing import Sealer
from wsmode.core.conversation import EMPTY, CachedResponse, Segment
from wsmode.core.request import CreateRequest, parse_create

from tests.support.items import assistant, b, user
from tests.support.session import context_settings

SEALER = Sealer(bytes(range(32)))
OWNER = "owner-a"


def manager(**kw: Any) -> ContextManager:
    return ContextManager(context_settings(**kw), SEALER)


def request(input: list[dict[str, Any]], **fields: Any) -> CreateRequest:
    return parse_create({"type": "response.create", "model": "m", "input": input, **fields})


def chain(*turns: list[dict[str, Any]]) -> CachedResponse:
    entry = EMPTY
    for i, turn in enumerate(turns):
        entry = entry.child(f"resp_{i}", None, Segment(tuple(b(x) for x in turn)), {})
    return entry


def decoded(items: list[bytes]) -> list[Any]:
    return [orjson.loads(i) for i in items]


def long_chain(turns: int, size: int = 200) -> CachedResponse:
    return chain(
        *[[user(f"q{i} " + "x" * size), assistant(f"a{i} " + "y" * size)] for i in range(turns)]
    )

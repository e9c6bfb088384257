"""Every event wsmode writes, checked against the openai SDK's own pydantic models, strictly.

The SDK (openai 3.51.0) parses events without validation (`construct_type_unchecked`), so a
client never notices a wrong shape until it reads the field. These checks validate instead:
each WebSocket event with the `ResponsesServerEvent` member for its `type`, each HTTP SSE
event with the `ResponseStreamEvent` member, `strict=True` (no coercion: a string where a
number belongs fails), and every response object they carry with `Response`. On top of what
the SDK's models require, the fields its models leave optional but the Responses schema
requires (the Open Responses `ResponseResource`, and in it `FunctionTool` and `Reasoning`)
must be present.

wsmode's own events that are no SDK type are listed in `EXTENSIONS` and only those are
skipped; today there are none: steering's events are SDK types, a cancel ends with an SDK
`response.incomplete`, and errors use the SDK's WebSocket `error` envelope.

`Client` is a WebSocket client that checks every event it receives this way.
"""

from __future__ import annotations

import typing
from collections import Counter
from typing import Any

from openai.types.responses import (
    Response,
    ResponsesServerEvent,
    ResponseStreamEvent,
)
from pydantic import BaseModel
from websockets.asyncio.client import ClientConnection

from tests.support.event_checks import RESPONSE_FIELDS
from tests.support.helpers import TERMINAL, create, recv, send

# wsmode's extension events (not SDK types): skipped by name, nothing else is.
EXTENSIONS: frozenset[str] = frozenset()

_SCHEMA_RESPONSE_FIELDS = RESPONSE_FIELDS | {"user"}
_FUNCTION_TOOL_FIELDS = frozenset({"type", "name", "description", "parameters", "strict"})


def _models(union: Any) -> dict[str, type[BaseModel]]:
    """The SDK's event models by their `type` literal."""
    members = typing.get_args(typing.get_args(union)[0])  # Annotated[Union[...], ...]
    out: dict[str, type[BaseModel]] = {}
    for model in members:
        for kind in typing.get_args(model.model_fields["type"].annotation):
            out[kind] = model
    return out


WS_MODELS = _models(ResponsesServerEvent)
SSE_MODELS = _models(ResponseStreamEvent)


def check_response(resp: Any, where: str = "") -> None:
    """A response object as the SDK and the schema want it."""
    assert isinstance(resp, dict), f"{where}: no response object"
    Response.model_validate(resp, strict=True)
    missing = _SCHEMA_RESPONSE_FIELDS - resp.keys()
    assert not missing, f"{where}: the response object lacks {sorted(missing)}"
    for tool in _all_tools(resp["tools"]):
        if tool.get("type") == "function":
            lacks = _FUNCTION_TOOL_FIELDS - tool.keys()
            assert not lacks, f"{where}: function tool {tool.get('name')} lacks {sorted(lacks)}"
    reasoning = resp["reasoning"]
    if reasoning is not None:
        lacks = {"effort", "summary"} - reasoning.keys()
        assert not lacks, f"{where}: reasoning lacks {sorted(lacks)}"


def _all_tools(tools: list[Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for tool in tools:
        out.append(tool)
        if tool.get("type") == "namespace":
            out += _all_tools(tool.get("tools") or [])
    return out


def _check(ev: dict[str, Any], models: dict[str, type[BaseModel]]) -> str:
    kind = ev.get("type")
    assert isinstance(kind, str), f"an event without a type: {ev}"
    if kind in EXTENSIONS:
        return kind
    model = models.get(kind)
    assert model is not None, f"{kind} is no SDK event type and not a listed extension"
    try:
        model.model_validate(ev, strict=True)
    except ValueError as exc:
        raise AssertionError(f"{kind} does not validate as {model.__name__}: {exc}\n{ev}") from exc
    if "response" in ev:
        check_response(ev["response"], kind)
    return kind


def check_ws_event(ev: dict[str, Any]) -> str:
    """One WebSocket event (`ResponsesServerEvent`); returns its type."""
    return _check(ev, WS_MODELS)


def check_sse_event(ev: dict[str, Any]) -> str:
    """One HTTP SSE event (`ResponseStreamEvent`); returns its type."""
    return _check(ev, SSE_MODELS)


# ------------------------------------------------------------------ a checking client


class Client:
    """A WebSocket client that validates every event it receives and counts their types."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.seen: Counter[str] = Counter()

    async def next(self, timeout: float = 10) -> dict[str, Any]:
        ev = await recv(self.ws, timeout)
        self.seen[check_ws_event(ev)] += 1
        return ev

    async def until(self, *kinds: str, timeout: float = 10) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        while not events or events[-1]["type"] not in kinds:
            events.append(await self.next(timeout))
        return events

    async def turn(self, timeout: float = 10, **fields: Any) -> list[dict[str, Any]]:
        await send(self.ws, create(**{"store": False, **fields}))
        return await self.until(*TERMINAL, timeout=timeout)

"""`response.create` validation and the upstream request body (docs/protocol.md "response.create",
"HTTP and WebSocket side by side", "What carries over").

A create is validated once, on arrival, into a `CreateRequest`: the lane, the chaining
fields, the new input items already serialised, and the settings to send upstream. Fields
that only make sense on the socket or to the client (`type`, `stream_id`, `generate`,
`client_metadata`, `stream`, `background`) never reach the upstream. Other unknown fields are
kept: a Responses upstream may know them (docs/protocol.md "response.create": ignore, do not
reject).

The upstream body for a continuation is the parent's items plus the new input, with the new
request's own settings: `instructions`, `tools` and the rest are never inherited (8.3). It
is returned as pieces of bytes whose concatenation is the JSON body, so the cached history is
copied, never re-serialised.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from . import wire
from .errors import ClientError, invalid, missing, wrong_type
from .records import record

STREAM_ID_RE = re.compile(r"[A-Za-z0-9_.-]{1,256}")
_COMPACTION = b'"compaction'  # in every compaction item and trigger, as its type

# Fields of the socket envelope or of one client, never forwarded upstream.
WS_ONLY_FIELDS = frozenset(
    {"type", "stream_id", "generate", "client_metadata", "stream", "background"}
)
# Fields the proxy itself sets on the upstream body.
REBUILT_FIELDS = frozenset({"input", "previous_response_id", "store"})

_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "model": ((str,), "a string"),
    "instructions": ((str, type(None)), "a string"),
    "previous_response_id": ((str, type(None)), "a string"),
    "store": ((bool, type(None)), "a boolean"),
    "stream": ((bool, type(None)), "a boolean"),
    "generate": ((bool, type(None)), "a boolean"),
    "background": ((bool, type(None)), "a boolean"),
    "parallel_tool_calls": ((bool, type(None)), "a boolean"),
    "tools": ((list, type(None)), "an array"),
    "include": ((list, type(None)), "an array"),
    "metadata": ((dict, type(None)), "an object"),
    "client_metadata": ((dict, type(None)), "an object"),
    "text": ((dict, type(None)), "an object"),
    "reasoning": ((dict, type(None)), "an object"),
    "context_management": ((list, type(None)), "an array"),
    "tool_choice": ((str, dict, type(None)), "a string or an object"),
    "truncation": ((str, type(None)), "a string"),
    "temperature": ((int, float, type(None)), "a number"),
    "top_p": ((int, float, type(None)), "a number"),
    "max_output_tokens": ((int, type(None)), "an integer"),
    "max_tool_calls": ((int, type(None)), "an integer"),
}


@record()
class CreateRequest:
    lane: str | None  # `stream_id`; None is the default lane
    previous_response_id: str | None
    generate: bool
    store: bool  # what the client asked for (default true); the upstream may get false
    model: str
    input_items: tuple[bytes, ...]  # the new input, each item serialised once
    settings: dict[str, Any]  # forwarded fields, without input / previous id / store
    body: dict[str, Any]  # the create as the client sent it (echoed in response objects)
    # nothing in it for the context manager: no `context_management`, no `truncation`, no
    # input item that could be a compaction item or trigger (a byte scan, so an item that
    # only mentions the word is not plain either: the context manager then looks closer)
    plain: bool = False
    # bytes of its message beyond its new input: about what its settings are as JSON, for
    # what their objects are charged while a response made by it is cached
    settings_bytes: int = 0


def check_stream_id(value: object) -> str | None:
    """Validate a `stream_id` (docs/protocol.md "response.create", "Errors"). The bad value is never
    echoed back."""
    if value is None:
        return None
    if not isinstance(value, str) or not STREAM_ID_RE.fullmatch(value):
        raise ClientError(
            "Invalid 'stream_id': use 1 to 256 characters from [A-Za-z0-9_.-], or omit it "
            "for the default lane.",
            code="invalid_stream_id",
            param="stream_id",
        )
    return value


def normalise_input(value: object) -> list[Any]:
    """`input` as a list of items: a string is one user message."""
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    if not isinstance(value, list):
        raise wrong_type("input", "a string or an array of input items")
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise wrong_type(f"input[{i}]", "an object")
    return value


def too_deep(param: str | None) -> ClientError:
    return ClientError(
        f"The message nests arrays and objects more than {wire.MAX_DEPTH} levels deep.",
        code="invalid_json",
        param=param,
    )


def kept_items(items: list[Any]) -> tuple[bytes, ...]:
    """Each input item serialised once, for the cache; the message and its `input` array
    are 2 of the `wire.MAX_DEPTH` levels a message may nest."""
    try:
        return tuple(wire.dumps_within(item, wire.MAX_DEPTH - 2) for item in items)
    except wire.TooDeep:
        raise too_deep("input") from None


def parse_create(body: dict[str, Any], *, socket: bool = True, nbytes: int = 0) -> CreateRequest:
    """Validate a `response.create` message (`socket`), or the body of a plain HTTP
    `POST /v1/responses`, where `stream_id` means nothing and is ignored. `nbytes`: the
    size of the message."""
    for name, value in body.items():  # the fields it has: a few of the ones typed
        spec = _TYPES.get(name)
        if spec is not None and not isinstance(value, spec[0]):
            raise wrong_type(name, spec[1])
        if spec is not None and value.__class__ is bool and bool not in spec[0]:
            raise wrong_type(name, spec[1])  # True is an int in Python, not in JSON
    lane = check_stream_id(body.get("stream_id")) if socket else None
    if body.get("background"):
        raise invalid(
            "'background' is not supported in WebSocket mode; send the request over HTTP.",
            "background",
            code="unsupported_parameter",
        )
    if not body.get("model"):
        raise missing("model")
    generate = body.get("generate") is not False
    raw_input = body.get("input")
    if raw_input is None:
        if generate and "prompt" not in body:
            raise missing("input")
        raw_input = []
    prev = body.get("previous_response_id") or None
    if prev is not None and body.get("conversation") is not None:
        raise invalid(
            "'previous_response_id' and 'conversation' cannot be used together.",
            "conversation",
        )
    items = kept_items(normalise_input(raw_input))
    settings = {
        k: v for k, v in body.items() if k not in WS_ONLY_FIELDS and k not in REBUILT_FIELDS
    }
    try:  # the rest of the message: echoed in response objects, sent upstream
        wire.check_depth({k: v for k, v in body.items() if k != "input"})
    except wire.TooDeep:
        raise too_deep(None) from None
    return CreateRequest(
        lane=lane,
        previous_response_id=prev,
        generate=generate,
        store=body.get("store") is not False,
        model=body["model"],
        input_items=items,
        settings=settings,
        body=body,
        plain=(
            "context_management" not in body
            and "truncation" not in body
            and not any(_COMPACTION in item for item in items)
        ),
        settings_bytes=max(0, nbytes - sum(len(item) for item in items)),
    )


def upstream_body(
    settings: dict[str, Any], extra: dict[str, Any], items: Iterable[bytes]
) -> list[bytes]:
    """The upstream JSON body as pieces: settings (+ `extra`), then `"input": [items]`.

    Only the settings are serialised here; each item is bytes the cache already holds.
    """
    head = wire.dumps({**settings, **extra})
    pieces = [head[:-1], b',"input":[' if len(head) > 2 else b'"input":[']
    first = True
    for item in items:
        if not first:
            pieces.append(b",")
        pieces.append(item)
        first = False
    pieces.append(b"]}")
    return pieces

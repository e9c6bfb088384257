"""The one JSON codec of the project, and small helpers for JSON we hold as bytes.

Everything is orjson: it parses from bytes, writes bytes, and is several times faster than
the standard library on the large `response.completed` objects and request bodies we handle.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Iterable
from typing import Any, TypeGuard

import orjson

JSONDecodeError = orjson.JSONDecodeError
JSONEncodeError = orjson.JSONEncodeError  # a value nested too deeply to write (`MAX_DEPTH`)


def is_int(value: Any) -> TypeGuard[int]:
    """A JSON integer as decoded (`true` decodes to a bool, which Python counts as an int)."""
    return isinstance(value, int) and not isinstance(value, bool)


# orjson's own functions, not wrappers: they run for every event, and a Python frame
# around each call costs more than a small event's parse
loads: Callable[[bytes | bytearray | memoryview | str], Any] = orjson.loads
dumps: Callable[[Any], bytes] = orjson.dumps


def dumps_kept(obj: Any) -> bytes:
    """`dumps` for bytes that stay in memory (the conversation cache), at their exact size.

    orjson returns its result in the buffer it wrote into, sized for the worst case and not
    shrunk: an 8 KB item can hold 64 KB (orjson 3.13, measured). Kept bytes are copied once
    into a bytes object of their own length.
    """
    return bytes(memoryview(orjson.dumps(obj)))


def all_kept(objs: Iterable[Any]) -> list[bytes]:
    """`dumps_kept` of each of `objs`."""
    return [bytes(memoryview(orjson.dumps(obj))) for obj in objs]


# The deepest nesting of arrays and objects the proxy accepts in a client message or in an
# upstream event it parses (the message or event itself is level 1). Far below what orjson
# can write (`_ORJSON_DEPTH`), so that whatever the proxy builds around such a value (a
# response object around a request's `metadata`, an event around a response, a request
# body around cached items) can still be written.
MAX_DEPTH = 128
# orjson.dumps refuses values nested deeper than this ("Recursion limit reached"; orjson
# 3.x; tests/unit/test_wire_depth.py pins it). orjson.loads accepts up to 1,024 levels.
_ORJSON_DEPTH = 254


class TooDeep(ValueError):
    """A value nests arrays and objects deeper than the bound it was checked against."""


_wrappers: dict[int, tuple[list[Any], list[Any]]] = {}


def _wrapper(levels: int) -> tuple[list[Any], list[Any]]:
    """A chain of `levels` one-element arrays, the outermost and the innermost (made once
    per depth; the core runs on one thread, and each use empties it again)."""
    if levels not in _wrappers:
        inner: list[Any] = [None]
        outer = inner
        for _ in range(levels - 1):
            outer = [outer]
        _wrappers[levels] = (outer, inner)
    return _wrappers[levels]


def dumps_within(obj: Any, limit: int = MAX_DEPTH) -> bytes:
    """`dumps_kept` of a value that nests at most `limit` levels, else `TooDeep`."""
    out = _dumps_checked(obj, limit)
    return bytes(memoryview(out))


def check_depth(obj: Any, limit: int = MAX_DEPTH) -> None:
    """`TooDeep` when `obj` nests more than `limit` levels of arrays and objects."""
    _dumps_checked(obj, limit)


def within_depth(data: bytes, limit: int = MAX_DEPTH) -> bool:
    """A cheap sufficient test on serialised JSON: it cannot nest more levels than it has
    opening brackets (those inside strings count too, so this may say False of JSON that
    is shallow: then parse it and ask `check_depth`)."""
    return data.count(b"{") + data.count(b"[") <= limit


def _dumps_checked(obj: Any, limit: int) -> bytes:
    """orjson's own bound does the counting. Most values have fewer opening brackets than
    `limit` and need nothing more than their serialising; the others are written once more
    inside `254 - limit` one-element arrays, which fails exactly when `obj` nests more than
    `limit` levels."""
    try:
        out = orjson.dumps(obj)
    except orjson.JSONEncodeError as exc:
        _too_deep(exc, limit)
    if within_depth(out, limit):
        return out
    outer, inner = _wrapper(_ORJSON_DEPTH - limit)
    inner[0] = obj
    try:
        orjson.dumps(outer)
    except orjson.JSONEncodeError as exc:
        _too_deep(exc, limit)
    finally:
        inner[0] = None
    return out


def _too_deep(exc: orjson.JSONEncodeError, limit: int) -> typing.NoReturn:
    if "ecursion" not in str(exc):  # "Recursion limit reached"; anything else is a bug
        raise exc
    raise TooDeep(f"nested more than {limit} levels deep") from None


def with_field(obj_json: bytes, key_json: bytes, value_json: bytes) -> bytes:
    """Append `"key": value` to a serialised JSON object without parsing it.

    Used on the hot path to stamp `stream_id` onto upstream events we otherwise forward
    untouched. `key_json` and `value_json` are already-serialised JSON (`b'"stream_id"'`).
    The caller guarantees `obj_json` is one JSON object; trailing whitespace is tolerated.
    """
    body = obj_json.rstrip()
    if not body.endswith(b"}"):
        raise ValueError("not a JSON object")
    head = body[:-1].rstrip()
    sep = b"" if head.endswith(b"{") else b","
    return b"".join((head, sep, key_json, b":", value_json, b"}"))


def canonical(obj: Any) -> bytes:
    """A canonical form for hashing and comparing JSON: keys sorted at every level, compact.

    Two values that parse to equal JSON objects get equal bytes, whatever key order or
    whitespace each writer used."""
    return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)


_TYPE_PREFIX = b'{"type":"'


def event_type(data: bytes) -> str | None:
    """The `type` of a serialised event, read without parsing when it comes first (as the
    proxy and every known server write it); parsed otherwise. None if it is not a typed
    JSON object."""
    if data.startswith(_TYPE_PREFIX):
        end = data.find(b'"', len(_TYPE_PREFIX))
        if end > 0 and b"\\" not in data[len(_TYPE_PREFIX) : end]:
            return data[len(_TYPE_PREFIX) : end].decode("utf-8", "replace")
    try:
        ev = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    kind = ev.get("type") if isinstance(ev, dict) else None
    return kind if isinstance(kind, str) else None


_SEQ_KEY = b'"sequence_number":'


def sequence_number(data: bytes) -> int | None:
    """The `sequence_number` of a serialised event, read without parsing it (the hot path
    forwards deltas unparsed and asks only when it must number an event of its own)."""
    at = data.find(_SEQ_KEY)
    if at < 0:
        return None
    i = at + len(_SEQ_KEY)
    while i < len(data) and data[i] == 0x20:
        i += 1
    j = i
    while j < len(data) and 0x30 <= data[j] <= 0x39:
        j += 1
    return int(data[i:j]) if j > i else None

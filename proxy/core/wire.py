"""The one JSON codec of the project, and small helpers for JSON we hold as bytes.

Everything is orjson: it parses from bytes, writes bytes, and is several times faster than
the standard library on the large `response.completed` objects and request bodies we handle.
"""

from __future__ import annotations

from typing import Any

import orjson

JSONDecodeError = orjson.JSONDecodeError


def loads(data: bytes | bytearray | memoryview | str) -> Any:
    return orjson.loads(data)


def dumps(obj: Any) -> bytes:
    return orjson.dumps(obj)


def dumps_kept(obj: Any) -> bytes:
    """`dumps` for bytes that stay in memory (the conversation cache), at their exact size.

    orjson returns its result in the buffer it wrote into, sized for the worst case and not
    shrunk: an 8 KB item can hold 64 KB (orjson 3.13, measured). Kept bytes are copied once
    into a bytes object of their own length.
    """
    return bytes(memoryview(orjson.dumps(obj)))


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

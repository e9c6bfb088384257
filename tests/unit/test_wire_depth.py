"""The nesting bound (core/wire.py `MAX_DEPTH`), URL redaction (core/urls.py, logs.py,
config_view.redacted) and the rate-limit headers of an upstream error: the parts of the hostile
input and upstream checks (tests/integration/test_hostile_inputs.py, test_hostile_upstream.py)
that need no socket."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from wsmode.config import Settings, load_settings
from wsmode.config_view import redacted
from wsmode.core import wire
from wsmode.core.errors import ClientError, rate_limit_headers, upstream_http_error
from wsmode.core.request import parse_create
from wsmode.core.urls import redact_url
from wsmode.logs import redact


def nest(depth: int) -> Any:
    """`depth` levels of arrays: nest(1) is [0]."""
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


def test_orjson_writes_254_levels_and_no_more() -> None:
    """wire.py counts on orjson's own bound: if orjson changes it, this says so."""
    orjson.dumps(nest(254))
    with pytest.raises(orjson.JSONEncodeError, match="ecursion"):
        orjson.dumps(nest(255))


@pytest.mark.parametrize("limit", [4, 10, wire.MAX_DEPTH, 200])
def test_check_depth_is_exact(limit: int) -> None:
    wire.check_depth(nest(limit), limit)
    wire.check_depth({"a": [{"b": nest(limit - 3)}]}, limit)
    with pytest.raises(wire.TooDeep):
        wire.check_depth(nest(limit + 1), limit)
    with pytest.raises(wire.TooDeep):
        wire.check_depth({"a": [{"b": nest(limit - 2)}]}, limit)


def test_dumps_within_returns_the_plain_bytes() -> None:
    value = {"a": [1, {"b": "x[{"}], "c": nest(5)}
    assert wire.dumps_within(value) == orjson.dumps(value)
    assert wire.dumps_within(nest(wire.MAX_DEPTH)) == orjson.dumps(nest(wire.MAX_DEPTH))
    with pytest.raises(wire.TooDeep):
        wire.dumps_within(nest(300))  # deeper than orjson writes at all
    assert wire.within_depth(b'{"a":[1]}') and not wire.within_depth(b"[" * 200 + b"]" * 200)


def test_a_create_may_nest_max_depth_levels_and_no_more() -> None:
    """The message is level 1, its `input` array level 2: an item may nest 126 levels."""
    ok = wire.MAX_DEPTH - 2
    base = {"type": "response.create", "model": "m"}
    parse_create({**base, "input": [{"type": "message", "extra": nest(ok - 1)}]})
    with pytest.raises(ClientError) as err:
        parse_create({**base, "input": [{"type": "message", "extra": nest(ok)}]})
    assert err.value.code == "invalid_json" and err.value.param == "input"
    parse_create({**base, "input": "x", "metadata": {"a": nest(wire.MAX_DEPTH - 2)}})
    with pytest.raises(ClientError) as err:
        parse_create({**base, "input": "x", "metadata": {"a": nest(wire.MAX_DEPTH - 1)}})
    assert err.value.code == "invalid_json" and err.value.status == 400


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://bob:hunter2@h:1/v1", "http://bob:<redacted>@h:1/v1"),
        ("https://:hunter2@h/v1?x=1", "https://:<redacted>@h/v1?x=1"),
        ("http://bob:p:q@[::1]:8/v1", "http://bob:<redacted>@[::1]:8/v1"),
        ("http://sk-token@h/v1", "http://<redacted>@h/v1"),  # a lone user name is a token
        ("http://h/v1", "http://h/v1"),
        ("", ""),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_log_lines_mask_url_passwords() -> None:
    line = "upstream http://bob:hunter2@127.0.0.1:9/v1 (responses dialect), ws://x@y/ ok"
    shown = (
        "upstream http://bob:<redacted>@127.0.0.1:9/v1 (responses dialect), ws://<redacted>@y/ ok"
    )
    assert redact(line) == shown


def test_redacted_settings_hide_url_passwords_and_the_compaction_key() -> None:
    settings: Settings = load_settings(
        None,
        {},
        {
            "upstream.url": "http://bob:hunter2@h/v1",
            "compaction.key": "D2HEGpgjsNx9ZGExYxvHLwrz9oTRGlnVwAT1kZZE3ts=",
        },
    )
    shown = redacted(settings)
    assert shown["upstream"]["url"] == "http://bob:<redacted>@h/v1"
    assert shown["compaction"]["key"] == "<redacted>"
    assert "hunter2" not in json.dumps(shown) and "D2HEG" not in json.dumps(shown)


def test_an_upstream_error_keeps_its_rate_limit_headers() -> None:
    headers = {"Retry-After": "3", "X-RateLimit-Limit-Tokens": "1000", "Server": "gpu-7"}
    assert rate_limit_headers(headers) == {"retry-after": "3", "x-ratelimit-limit-tokens": "1000"}
    assert rate_limit_headers({"Server": "x"}) is None
    err = upstream_http_error(429, b'{"error": {"message": "slow"}}', headers)
    ev = err.event()
    assert ev["status"] == 429
    assert ev["headers"] == ev["error"]["headers"] == rate_limit_headers(headers)


def test_a_steer_nested_too_deeply_is_rejected() -> None:
    """A steer's content part nested 300 deep is refused (`invalid_input`), not a crash."""
    from wsmode.core.steering import SteerRejected, parse_steer

    part = {"type": "input_text", "text": "x", "extra": nest(300)}
    msg = {
        "type": "response.steer",
        "previous_response_id": "resp_1",
        "input": [{"type": "message", "role": "user", "content": [part]}],
    }
    with pytest.raises(SteerRejected) as err:
        parse_steer(msg)
    assert err.value.code == "invalid_input" and "levels deep" in err.value.message

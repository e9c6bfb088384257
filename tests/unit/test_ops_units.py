"""Small pieces of the operations layer: key checks, log masking, the upstream gate."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from pathlib import Path

import pytest
from wsmode.config import AuthSettings, ConfigError, load_settings
from wsmode.config_view import redacted
from wsmode.core.errors import UpstreamError
from wsmode.logs import ContextFilter, JsonFormatter, redact, request_id_var
from wsmode.ops.auth import Authenticator, bearer, read_hashes
from wsmode.ops.metrics import close_class
from wsmode.upstream.client import UpstreamGate


def test_bearer_parsing() -> None:
    assert bearer("Bearer abc") == "abc"
    assert bearer("bearer   abc ") == "abc"
    assert bearer("Basic abc") is None
    assert bearer("Bearer ") is None
    assert bearer(None) is None


def test_authenticator_keys_and_hash_file(tmp_path: Path) -> None:
    f = tmp_path / "h"
    f.write_text(f"{hashlib.sha256(b'k2').hexdigest()}  # ops team\n\n# old\n")
    auth = Authenticator.from_settings(AuthSettings(api_keys=("k1",), api_key_hashes_file=str(f)))
    assert auth is not None and len(auth) == 2
    assert auth.check("Bearer k1") and auth.check("Bearer k2")
    assert not auth.check("Bearer k3") and not auth.check("k1") and not auth.check(None)
    assert Authenticator.from_settings(AuthSettings()) is None
    # a configured but empty file fails closed
    empty = tmp_path / "empty"
    empty.write_text("")
    closed = Authenticator.from_settings(AuthSettings(api_key_hashes_file=str(empty)))
    assert closed is not None and not closed.check("Bearer anything")


def test_bad_hash_files(tmp_path: Path) -> None:
    f = tmp_path / "h"
    f.write_text("not-a-digest\n")
    with pytest.raises(ConfigError, match=r"h:1: expected a SHA-256"):
        read_hashes(str(f))
    with pytest.raises(ConfigError, match="cannot read"):
        read_hashes(str(tmp_path / "missing"))


@pytest.mark.parametrize(
    "text",
    [
        "Authorization: Bearer sk-abcdef123456",
        "auth failed for sk-proj-abcdefgh12345678",
        'headers {"authorization": "Basic dXNlcjpwYXNz"}',
        "api_key=hunter2hunter2",
        '{"api-key": "zzzzzzzzzz"}',
        "upstream http://bob:hunter2@127.0.0.1:8000/v1 (responses dialect)",
        "upstream https://zzzzqqqq@models.example/v1 (responses dialect)",
    ],
)
def test_redact_masks_secrets(text: str) -> None:
    out = redact(text)
    for secret in (
        "sk-abcdef123456",
        "sk-proj-abcdefgh12345678",
        "dXNlcjpwYXNz",
        "hunter2",
        "zzzz",
    ):
        assert secret not in out
    assert "<redacted>" in out


def test_json_log_record_has_request_id_and_masked_message() -> None:
    record = logging.LogRecord(
        "wsmode.x", logging.WARNING, __file__, 1, "key %s", ("sk-abcdefgh1234",), None
    )
    token = request_id_var.set("req-1")
    try:
        assert ContextFilter().filter(record)
    finally:
        request_id_var.reset(token)
    doc = json.loads(JsonFormatter().format(record))
    assert doc["request_id"] == "req-1" and doc["level"] == "WARNING"
    assert "sk-abcdefgh1234" not in doc["message"]


def test_list_settings_from_env_and_redaction() -> None:
    s = load_settings(None, {"WSMODE_AUTH_API_KEYS": "a, b,,c", "WSMODE_UPSTREAM_API_KEY": "u"})
    assert s.auth.api_keys == ("a", "b", "c")
    shown = redacted(s)
    assert shown["auth"]["api_keys"] == ["<redacted>"] * 3
    assert shown["upstream"]["api_key"] == "<redacted>"
    assert shown["server"]["port"] == 8080
    with pytest.raises(ConfigError, match=r"auth\.api_keys: expected list"):
        load_settings(None, {}, {"auth.api_keys": 5})
    with pytest.raises(ConfigError, match="log_format must be one of"):
        load_settings(None, {"WSMODE_SERVER_LOG_FORMAT": "xml"})


def test_close_classes() -> None:
    assert [close_class(c) for c in (1000, 1001, 1009, 1011, 1013, 1006, None, 4000)] == [
        "normal",
        "going_away",
        "client_error",
        "internal_error",
        "overloaded",
        "abnormal",
        "abnormal",
        "other",
    ]


async def test_gate_bounds_active_and_waiting() -> None:
    gate = UpstreamGate(limit=1, max_waiting=1, timeout=5)
    entered = asyncio.Event()
    leave = asyncio.Event()

    async def hold() -> None:
        async with gate.slot():
            entered.set()
            await leave.wait()

    holder = asyncio.create_task(hold())
    await entered.wait()
    waiter = asyncio.create_task(hold())
    await asyncio.sleep(0)
    assert gate.active == 1 and gate.waiting == 1
    with pytest.raises(UpstreamError) as info:
        async with gate.slot():
            pass
    assert info.value.status == 503 and info.value.code == "upstream_overloaded"
    leave.set()
    await asyncio.gather(holder, waiter)
    assert gate.active == 0 and gate.waiting == 0


async def test_gate_without_limit() -> None:
    gate = UpstreamGate(limit=0, max_waiting=0, timeout=0)
    async with gate.slot(), gate.slot():
        assert gate.active == 2

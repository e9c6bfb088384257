"""The authenticated encryption of compaction items (proxy/core/context/sealing.py)."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given
from hypothesis import strategies as st
from wsmode.core.context.sealing import (
    NONCE_BYTES,
    TAG_BYTES,
    Sealer,
    SealError,
    decode_key,
    new_key,
)

KEY = bytes(range(32))
SEALER = Sealer(KEY)


def raw(token: str) -> bytes:
    return base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))


def text(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@given(st.binary(max_size=4096), st.binary(max_size=64))
def test_round_trip(plaintext: bytes, aad: bytes) -> None:
    token = SEALER.seal(plaintext, aad)
    assert SEALER.open(token, aad) == plaintext


def test_format_is_versioned_and_sized() -> None:
    token = SEALER.seal(b"summary", b"owner")
    data = raw(token)
    assert data[0] == 1
    assert len(data) == 1 + NONCE_BYTES + len(b"summary") + TAG_BYTES
    assert b"summary" not in data  # the plaintext is not visible
    assert set(token) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


def test_every_seal_uses_a_fresh_nonce() -> None:
    a, b = SEALER.seal(b"same"), SEALER.seal(b"same")
    assert a != b
    assert raw(a)[1 : 1 + NONCE_BYTES] != raw(b)[1 : 1 + NONCE_BYTES]


@given(st.binary(min_size=1, max_size=256), st.data())
def test_any_flipped_bit_is_rejected(plaintext: bytes, data: st.DataObject) -> None:
    token = raw(SEALER.seal(plaintext, b"aad"))
    index = data.draw(st.integers(0, len(token) - 1))
    bit = data.draw(st.integers(0, 7))
    tampered = bytearray(token)
    tampered[index] ^= 1 << bit
    with pytest.raises(SealError):
        SEALER.open(text(bytes(tampered)), b"aad")


def test_wrong_key_is_rejected() -> None:
    token = SEALER.seal(b"secret summary")
    with pytest.raises(SealError, match="does not authenticate"):
        Sealer(bytes(range(1, 33))).open(token)


def test_other_associated_data_is_rejected() -> None:
    token = SEALER.seal(b"secret summary", b"owner-a")
    with pytest.raises(SealError, match="does not authenticate"):
        SEALER.open(token, b"owner-b")
    with pytest.raises(SealError):
        SEALER.open(token)


@pytest.mark.parametrize("cut", [1, TAG_BYTES, TAG_BYTES + 5])
def test_truncation_is_rejected(cut: int) -> None:
    token = raw(SEALER.seal(b"a summary of forty bytes, give or take!"))
    with pytest.raises(SealError):
        SEALER.open(text(token[:-cut]))


def test_too_short_and_empty_tokens() -> None:
    with pytest.raises(SealError, match="truncated"):
        SEALER.open("")
    with pytest.raises(SealError, match="truncated"):
        SEALER.open(text(b"\x01" + bytes(NONCE_BYTES + TAG_BYTES - 1)))


def test_appended_bytes_are_rejected() -> None:
    token = raw(SEALER.seal(b"summary"))
    with pytest.raises(SealError):
        SEALER.open(text(token + b"\x00"))


def test_unknown_version_is_rejected() -> None:
    token = bytearray(raw(SEALER.seal(b"summary")))
    token[0] = 2
    with pytest.raises(SealError, match="unknown token version 2"):
        SEALER.open(text(bytes(token)))


@pytest.mark.parametrize("bad", ["not base64!", "abc=", "a", "ab cd", "é", "+/+/"])
def test_non_base64url_text_is_rejected(bad: str) -> None:
    with pytest.raises(SealError):
        SEALER.open(bad)


def test_keys() -> None:
    assert len(new_key()) == 32 and new_key() != new_key()
    key = bytes(range(40))
    assert decode_key(base64.b64encode(key).decode()) == key
    assert decode_key(base64.urlsafe_b64encode(key).decode().rstrip("=")) == key
    with pytest.raises(ValueError, match="32 to 64 bytes"):
        decode_key(base64.b64encode(bytes(16)).decode())
    with pytest.raises(ValueError, match="not valid base64"):
        decode_key("%%%")
    with pytest.raises(ValueError):
        Sealer(bytes(8))

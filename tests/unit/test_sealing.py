"""The authenticated encryption of compaction items (proxy/core/context/sealing.py)."""

from __future__ import annotations

import base64

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from hypothesis import given
from hypothesis import strategies as st
from wsmode.core.context.sealing import (
    NONCE_BYTES,
    TAG_BYTES,
    Sealer,
    SealError,
    decode_key,
    encode_key,
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
    assert data[0] == 2
    assert (NONCE_BYTES, TAG_BYTES) == (12, 16)  # AES-GCM's nonce and tag
    assert len(data) == 1 + NONCE_BYTES + len(b"summary") + TAG_BYTES
    assert b"summary" not in data  # the plaintext is not visible
    assert set(token) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


def aes_gcm() -> AESGCM:
    """The cipher of the documented format, built here from the `cryptography` package: the
    key is HKDF-SHA256 of the master key."""
    info = b"wsmode compaction seal v2 aes-256-gcm"
    return AESGCM(HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(KEY))


def made(nonce: bytes, plaintext: bytes, aad: bytes = b"") -> bytes:
    """A version 2 token's bytes made without wsmode: the associated data is the version
    byte followed by the caller's."""
    return b"\x02" + nonce + aes_gcm().encrypt(nonce, plaintext, b"\x02" + aad)


def test_the_token_is_aes_256_gcm_under_an_hkdf_key() -> None:
    data = raw(SEALER.seal(b"summary", b"owner"))
    nonce, sealed = data[1 : 1 + NONCE_BYTES], data[1 + NONCE_BYTES :]
    assert aes_gcm().decrypt(nonce, sealed, b"\x02owner") == b"summary"
    assert SEALER.open(text(made(bytes(12), b"mine", b"owner")), b"owner") == b"mine"


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
    token[0] = 3
    with pytest.raises(SealError, match="unknown token version 3"):
        SEALER.open(text(bytes(token)))


def test_version_1_tokens_are_refused() -> None:
    """A token of the earlier construction: 0x01, a 24-byte nonce, the ciphertext and a
    32-byte tag. It is refused by its version, before any key is tried."""
    old = b"\x01" + bytes(24) + b"summary" + bytes(32)
    with pytest.raises(SealError, match="version 1, sealed by an earlier wsmode"):
        SEALER.open(text(old))


def test_only_the_canonical_spelling_opens() -> None:
    """The same bytes written any other way are refused: padding, the standard alphabet,
    or non-zero unused bits in the last character."""
    data = made(b"\xfb\xff" * 6, b"")  # 29 bytes: 39 characters, with '-' and '_'
    token = text(data)
    assert SEALER.open(token) == b"" and "-" in token and "_" in token
    standard = base64.b64encode(data).decode().rstrip("=")
    padded = token + "="
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    twin = token[:-1] + alphabet[alphabet.index(token[-1]) ^ 1]  # 4 unused bits in the last
    for other in (standard, padded, twin):
        assert other != token and raw(other.replace("+", "-").replace("/", "_")) == data
        with pytest.raises(SealError):
            SEALER.open(other)
    with pytest.raises(SealError, match="canonical"):
        SEALER.open(twin)


def test_keys() -> None:
    assert len(new_key()) == 32 and new_key() != new_key()
    key = bytes(range(32))
    assert decode_key(base64.b64encode(key).decode()) == key
    assert decode_key(" " + encode_key(key) + "\n") == key
    with pytest.raises(ValueError):
        Sealer(bytes(8))
    with pytest.raises(ValueError):
        Sealer(bytes(48))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("%%%", "not standard base64"),
        (base64.b64encode(bytes(16)).decode(), "exactly 32 bytes, not 16"),
        (base64.b64encode(bytes(range(48))).decode(), "exactly 32 bytes, not 48"),
        # the same 32 bytes in another spelling: URL-safe alphabet, no padding
        (base64.urlsafe_b64encode(b"\xfb" * 32).decode(), "not standard base64"),
        (base64.b64encode(bytes(range(32))).decode().rstrip("="), "not standard base64"),
        ("ab cd" * 9, "not standard base64"),
    ],
)
def test_key_spellings_that_are_refused(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        decode_key(text)


def test_a_hex_key_is_refused_not_read_as_48_bytes_of_base64() -> None:
    hex_key = bytes(range(32)).hex()
    assert len(base64.b64decode(hex_key)) == 48  # what a base64 reader would make of it
    with pytest.raises(ValueError, match="looks like 64 hex digits"):
        decode_key(hex_key)
    with pytest.raises(ValueError, match="looks like 64 hex digits"):
        decode_key(hex_key.upper())

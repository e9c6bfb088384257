"""Authenticated encryption for the `encrypted_content` of compaction items (docs/protocol.md
"Compaction").

A compaction item carries the summary of a conversation's older part back to the client,
which hands it in again later. Only this proxy may read it, and nobody may alter it: a
changed item must be rejected, not expanded into something the client wrote.

The construction is the `cryptography` package's AES-256-GCM, a vetted AEAD; nothing here
is built by hand:

- The cipher key is derived from the configured master key (exactly 32 bytes) with
  HKDF-SHA256 and a label naming this use and format version, so the master key itself
  never keys a cipher and a later format can derive a key of its own.
- Each seal draws a fresh random 12-byte nonce. Random GCM nonces stay safe for 2^32
  messages per key (NIST SP 800-38D, 8.3); a proxy seals a compaction item now and then.
- The associated data is `version || aad`: the version byte is authenticated with the
  message, and the caller's `aad` binds a token to its context (here: the credential that
  created it), so a token is useless elsewhere. The version byte is fixed-length, so the
  concatenation is unambiguous.
- Opening checks the text's spelling, the length and the version before GCM checks the
  tag; GCM never returns plaintext that does not authenticate.

Token format, version 2, written in base64url without padding:

    0x02 | nonce (12 bytes) | ciphertext (len(plaintext) bytes) | tag (16 bytes)

Each token has exactly one accepted spelling: another alphabet, padding, whitespace or
non-zero unused bits in the last character are refused, not decoded to the same bytes.
Version 1 tokens (the earlier hand-built construction) and unknown versions are refused;
the client then compacts again.
"""

from __future__ import annotations

import base64
import binascii
import re
import secrets

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

VERSION = 2
NONCE_BYTES = 12
TAG_BYTES = 16
KEY_BYTES = 32
_OVERHEAD = 1 + NONCE_BYTES + TAG_BYTES
_HKDF_INFO = b"wsmode compaction seal v2 aes-256-gcm"
_B64URL = re.compile(r"[A-Za-z0-9_-]*")
_KEY_TEXT = len(base64.b64encode(bytes(KEY_BYTES)))  # 44 characters
_HEX = re.compile(r"[0-9A-Fa-f]*")


class SealError(ValueError):
    """A token that does not open: malformed, truncated, another key, or altered."""


def new_key() -> bytes:
    return secrets.token_bytes(KEY_BYTES)


def encode_key(key: bytes) -> str:
    """The one spelling `decode_key` accepts: standard base64 with its padding."""
    return base64.b64encode(key).decode("ascii")


def decode_key(text: str) -> bytes:
    """A master key from its one accepted spelling: the standard base64 (with its `=`
    padding) of exactly 32 bytes, 44 characters, as `openssl rand -base64 32` prints it.
    Surrounding whitespace is ignored. Anything else is refused with a message saying what
    was found, rather than decoded into some other number of bytes (a 64-digit hex string
    is also valid base64, of 48 bytes)."""
    cleaned = text.strip()
    if len(cleaned) == 2 * KEY_BYTES and _HEX.fullmatch(cleaned):
        raise ValueError(
            f"the key looks like {2 * KEY_BYTES} hex digits; write the same {KEY_BYTES} bytes "
            f"in standard base64 ({_KEY_TEXT} characters, e.g. `openssl rand -base64 32`, or "
            '`python3 -c "import base64,sys; print(base64.b64encode(bytes.fromhex(sys.argv[1]))'
            '.decode())" HEX` to convert)'
        )
    try:
        key = base64.b64decode(cleaned, validate=True)
    except (binascii.Error, ValueError):
        key = None
    if key is None or encode_key(key) != cleaned:
        raise ValueError(
            f"the key is not standard base64 with padding (the {KEY_BYTES} bytes are written in "
            f"{_KEY_TEXT} characters of A-Z a-z 0-9 + /, ending in '=')"
        )
    if len(key) != KEY_BYTES:
        raise ValueError(f"the key must decode to exactly {KEY_BYTES} bytes, not {len(key)}")
    return key


def encode_token(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def decode_token(token: str) -> bytes:
    """The bytes of a token, from its one spelling (base64url without padding)."""
    if not isinstance(token, str) or not _B64URL.fullmatch(token):
        raise SealError("the token is not base64url text")
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    except (binascii.Error, ValueError):  # an impossible length, e.g. 4n+1 characters
        raise SealError("the token is not base64url text") from None
    if encode_token(raw) != token:  # the last character carried non-zero unused bits
        raise SealError("the token is not in its canonical base64url spelling")
    return raw


class Sealer:
    """Seals and opens tokens under one master key."""

    def __init__(self, key: bytes) -> None:
        if len(key) != KEY_BYTES:
            raise ValueError(f"a sealing key has exactly {KEY_BYTES} bytes")
        hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_HKDF_INFO)
        self._aead = AESGCM(hkdf.derive(key))
        self._header = bytes((VERSION,))

    def seal(self, plaintext: bytes, aad: bytes = b"") -> str:
        nonce = secrets.token_bytes(NONCE_BYTES)
        sealed = self._aead.encrypt(nonce, plaintext, self._header + aad)
        return encode_token(self._header + nonce + sealed)

    def open(self, token: str, aad: bytes = b"") -> bytes:
        raw = decode_token(token)
        if len(raw) < _OVERHEAD:
            raise SealError("the token is truncated")
        if raw[0] == 1:
            raise SealError(
                "the token is of version 1, sealed by an earlier wsmode; compact the "
                "conversation again"
            )
        if raw[0] != VERSION:
            raise SealError(f"unknown token version {raw[0]}")
        nonce, sealed = raw[1 : 1 + NONCE_BYTES], raw[1 + NONCE_BYTES :]
        try:
            return self._aead.decrypt(nonce, sealed, self._header + aad)
        except InvalidTag:
            raise SealError(
                "the token does not authenticate (altered, or sealed with another key)"
            ) from None

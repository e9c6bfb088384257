"""Authenticated encryption for the `encrypted_content` of compaction items (PROTOCOL 7).

A compaction item carries the summary of a conversation's older part back to the client,
which hands it in again later. Only this proxy may read it, and nobody may alter it: a
changed item must be rejected, not expanded into something the client wrote. The allowed
dependencies hold no cipher library, so the construction is built from the standard
library's SHA-3 and BLAKE2 primitives, as encrypt-then-MAC:

- Two keys are derived from the configured master key (32 to 64 bytes) with keyed BLAKE2b
  and distinct labels: `ke` for encryption, `km` for authentication. Neither is ever used
  for the other purpose.
- Encryption: a fresh random 24-byte nonce per message; the keystream is the SHAKE-256
  output of `label || ke || nonce` (all fixed-length, so the input is unambiguous), XORed
  with the plaintext. SHAKE-256 keyed this way is a pseudorandom function (it is what KMAC
  builds on; Keccak has no length-extension weakness), and 192 random nonce bits make a
  repeated keystream negligible.
- Authentication: a 32-byte keyed BLAKE2b tag (a PRF and MAC by design) over
  `version || nonce || len(aad) || aad || ciphertext`. The associated data binds a token to
  its context (here: the credential that created it), so a token is useless elsewhere.
- Opening checks the length and version, recomputes the tag and compares it in constant
  time (`hmac.compare_digest`) **before** anything is decrypted.

Token format, version 1, then base64url without padding:

    0x01 | nonce (24 bytes) | ciphertext (len(plaintext) bytes) | tag (32 bytes)

A future format gets a new version byte; tokens of an unknown version are rejected.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import secrets

VERSION = 1
NONCE_BYTES = 24
TAG_BYTES = 32
MIN_KEY_BYTES = 32
MAX_KEY_BYTES = 64  # BLAKE2b's key limit
_OVERHEAD = 1 + NONCE_BYTES + TAG_BYTES
_PERSON = b"wsmode-seal-v1"  # BLAKE2b personalisation (at most 16 bytes)
_STREAM_LABEL = b"wsmode-seal-v1 keystream"
_B64URL = re.compile(r"[A-Za-z0-9_-]*")  # strict: urlsafe_b64decode would skip other bytes


class SealError(ValueError):
    """A token that does not open: malformed, truncated, another key, or altered."""


def new_key() -> bytes:
    return secrets.token_bytes(MIN_KEY_BYTES)


def decode_key(text: str) -> bytes:
    """A master key from its base64 text (standard or URL-safe alphabet, padding optional)."""
    cleaned = "".join(text.split())
    try:
        key = base64.b64decode(_padded(cleaned.replace("-", "+").replace("_", "/")), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError("the key is not valid base64") from exc
    if not MIN_KEY_BYTES <= len(key) <= MAX_KEY_BYTES:
        raise ValueError(
            f"the key must decode to {MIN_KEY_BYTES} to {MAX_KEY_BYTES} bytes, not {len(key)}"
        )
    return key


def _padded(text: str) -> str:
    return text + "=" * (-len(text) % 4)


def _xor(data: bytes, stream: bytes) -> bytes:
    n = len(data)
    if n == 0:
        return b""
    return (int.from_bytes(data, "little") ^ int.from_bytes(stream, "little")).to_bytes(n, "little")


class Sealer:
    """Seals and opens tokens under one master key."""

    def __init__(self, key: bytes) -> None:
        if not MIN_KEY_BYTES <= len(key) <= MAX_KEY_BYTES:
            raise ValueError(f"a sealing key has {MIN_KEY_BYTES} to {MAX_KEY_BYTES} bytes")
        self._ke = hashlib.blake2b(b"encrypt", key=key, person=_PERSON, digest_size=32).digest()
        self._km = hashlib.blake2b(
            b"authenticate", key=key, person=_PERSON, digest_size=32
        ).digest()

    def _keystream(self, nonce: bytes, n: int) -> bytes:
        return hashlib.shake_256(_STREAM_LABEL + self._ke + nonce).digest(n) if n else b""

    def _tag(self, nonce: bytes, aad: bytes, ciphertext: bytes) -> bytes:
        mac = hashlib.blake2b(key=self._km, digest_size=TAG_BYTES, person=_PERSON)
        mac.update(bytes((VERSION,)))
        mac.update(nonce)
        mac.update(len(aad).to_bytes(8, "big"))
        mac.update(aad)
        mac.update(ciphertext)
        return mac.digest()

    def seal(self, plaintext: bytes, aad: bytes = b"") -> str:
        nonce = secrets.token_bytes(NONCE_BYTES)
        ciphertext = _xor(plaintext, self._keystream(nonce, len(plaintext)))
        token = b"".join((bytes((VERSION,)), nonce, ciphertext, self._tag(nonce, aad, ciphertext)))
        return base64.urlsafe_b64encode(token).rstrip(b"=").decode("ascii")

    def open(self, token: str, aad: bytes = b"") -> bytes:
        if not isinstance(token, str) or not _B64URL.fullmatch(token):
            raise SealError("the token is not base64url text")
        try:
            raw = base64.urlsafe_b64decode(_padded(token))
        except (binascii.Error, ValueError):  # an impossible length, e.g. 4n+1 characters
            raise SealError("the token is not base64url text") from None
        if len(raw) < _OVERHEAD:
            raise SealError("the token is truncated")
        if raw[0] != VERSION:
            raise SealError(f"unknown token version {raw[0]}")
        nonce = raw[1 : 1 + NONCE_BYTES]
        ciphertext = raw[1 + NONCE_BYTES : -TAG_BYTES]
        if not hmac.compare_digest(raw[-TAG_BYTES:], self._tag(nonce, aad, ciphertext)):
            raise SealError("the token does not authenticate (altered, or sealed with another key)")
        return _xor(ciphertext, self._keystream(nonce, len(ciphertext)))

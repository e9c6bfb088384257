"""Proxy API keys: who may use this proxy at all (separate from the upstream's credential).

Keys come from `auth.api_keys` and from a file of their SHA-256 hex digests
(`auth.api_key_hashes_file`), so a deployment need not hold plaintext keys. `/metrics` takes
those and `auth.metrics_api_keys` too, keys that open nothing else (`for_metrics`). A
presented key is hashed and compared with every accepted digest using `hmac.compare_digest`,
without stopping at the first match, so the time taken says nothing about which digest was
closest.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping

from ..config import AuthSettings, ConfigError

_HEX64 = re.compile(r"^[0-9a-fA-F]{64}$")


def digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def bearer(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer TOKEN` header."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def credentials(headers: Mapping[str, str]) -> int:
    """How many `Authorization` headers a request has. More than one is refused (400): the
    check would read one of them and the upstream could be sent another."""
    getall = getattr(headers, "getall", None)
    if getall is None:  # a plain mapping holds one value per name
        return 1 if "Authorization" in headers else 0
    return len(getall("Authorization", ()))


def read_hashes(path: str) -> list[bytes]:
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read auth.api_key_hashes_file {path}: {exc}") from exc
    out: list[bytes] = []
    for n, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if not _HEX64.match(line):
            raise ConfigError(f"{path}:{n}: expected a SHA-256 hex digest (64 hex characters)")
        out.append(bytes.fromhex(line))
    return out


class Authenticator:
    def __init__(self, digests: list[bytes]) -> None:
        self._digests = list(dict.fromkeys(digests))

    @classmethod
    def from_settings(cls, settings: AuthSettings) -> Authenticator | None:
        """None when no key is configured (auth is off). Raises ConfigError on a bad file."""
        digests = [digest(k) for k in settings.api_keys]
        if settings.api_key_hashes_file:
            digests += read_hashes(settings.api_key_hashes_file)
        if not digests and not settings.api_key_hashes_file:
            return None
        return cls(digests)

    @classmethod
    def for_metrics(
        cls, settings: AuthSettings, proxy: Authenticator | None
    ) -> Authenticator | None:
        """Who may read /metrics: the holder of a proxy key (`proxy`) or of one of
        `auth.metrics_api_keys`. None, /metrics open, when neither is configured."""
        extra = [digest(k) for k in settings.metrics_api_keys]
        if proxy is None and not extra:
            return None
        return cls([*(proxy._digests if proxy is not None else ()), *extra])

    def __len__(self) -> int:
        return len(self._digests)

    def check(self, authorization: str | None) -> bool:
        token = bearer(authorization)
        presented = digest(token if token is not None else "")
        ok = False
        for d in self._digests:
            ok |= hmac.compare_digest(presented, d)
        return ok and token is not None

"""URLs as they may be shown: in `/healthz`, error messages, log lines, `check-config`.

An upstream URL may carry a credential (`https://user:secret@host/v1`, or a token as the
user name alone, `https://TOKEN@host/v1`). Wherever the proxy shows a URL it shows
`redact_url(url)`: the password replaced by a marker (the user name kept, so an operator
still sees which user it is), or a lone user name replaced, since that is the credential.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

REDACTED = "<redacted>"
_VERSION = re.compile(r"v\d+[a-z0-9]*")


def redact_url(url: str) -> str:
    """`url` without its password (`user:<redacted>@host`) or its lone user name
    (`<redacted>@host`); unchanged when it has neither. A value that does not parse as a URL
    is shown only when it has no `@` at all."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return url if "@" not in url else REDACTED
    user, at, host = parts.netloc.rpartition("@")
    if not at:
        return url
    if password is None:
        return urlunsplit(parts._replace(netloc=f"{REDACTED}@{host}"))
    name = user.partition(":")[0]
    return urlunsplit(parts._replace(netloc=f"{name}:{REDACTED}@{host}"))


def without_userinfo(url: str) -> str:
    """`url` without `user:password@` (requests never carry it: upstream/client.py
    `split_credentials`); unchanged when it has none or does not parse."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    _, at, host = parts.netloc.rpartition("@")
    return urlunsplit(parts._replace(netloc=host)) if at else url


def missing_v1(url: str) -> str | None:
    """A warning when a base URL's path has no `/v1` segment (OpenAI-compatible servers,
    vLLM, llama.cpp and Ollama among them, serve the API under `/v1`), else None."""
    try:
        path = urlsplit(url).path
    except ValueError:
        return None
    if any(_VERSION.fullmatch(seg) for seg in path.split("/")):
        return None  # /v1, or another API version (Gemini's /v1beta/openai)
    return (
        f"the upstream URL {redact_url(url)} has no /v1 in its path: OpenAI-compatible servers "
        f"(vLLM, llama.cpp, Ollama, OpenAI) serve the API under /v1, so requests to "
        f"{redact_url(url.rstrip('/'))}/responses will likely answer 404; did you mean "
        f"{redact_url(url.rstrip('/'))}/v1?"
    )


# a request path with this prefix is the server's own endpoint at its root, not one of its
# OpenAI-compatible API under the base URL (llama.cpp's /completion and /tokenize, SGLang's
# /generate): `server_root` gives the base it is joined to
ROOT = "root:"


def server_root(base: str) -> str:
    """The server's root for a base URL: the base without its trailing API version
    (`http://host:8080/v1` -> `http://host:8080`); a base with no version is the root."""
    base = base.rstrip("/")
    head, _, last = base.rpartition("/")
    return head if _VERSION.fullmatch(last) and "//" in head + "/" else base

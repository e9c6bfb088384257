"""URLs as they may be shown: in `/healthz`, error messages, log lines, `check-config`.

A URL may carry a credential: in its userinfo (`https://user:secret@host/v1`, or a token as
the user name alone, `https://TOKEN@host/v1`) or in its query (`redis://host/0?password=x`,
`https://host/hook?token=x`). Wherever the proxy shows a URL it shows `redact_url(url)`: the
password replaced by a marker (the user name kept, so an operator still sees which user it
is), a lone user name replaced, since that is the credential, and the value of every query
parameter whose name looks like a credential (`credential_parameter`) replaced too.
"""

from __future__ import annotations

import re
from urllib.parse import unquote_plus, urlsplit, urlunsplit

REDACTED = "<redacted>"
_VERSION = re.compile(r"v\d+[a-z0-9]*")


# a query parameter whose name holds one of these (case-insensitive) carries a credential:
# password, passwd, pass, pwd, token, access_token, key, api_key, secret, auth, signature...
_CREDENTIAL_NAME = re.compile(r"(?i)pass|pwd|token|key|secret|auth|sig|credential|session")
_PARAMETER = re.compile(r"([^&;=]*)(=)([^&;]*)")


def credential_parameter(name: str) -> bool:
    """Whether a query parameter of this name (percent-encoded or not) carries a secret."""
    return bool(_CREDENTIAL_NAME.search(unquote_plus(name)))


def _redact_query(query: str) -> str:
    def mask(m: re.Match[str]) -> str:
        name = m.group(1)
        return f"{name}={REDACTED}" if credential_parameter(name) and m.group(3) else m.group(0)

    return _PARAMETER.sub(mask, query)


def redact_url(url: str) -> str:
    """`url` without its password (`user:<redacted>@host`) or its lone user name
    (`<redacted>@host`), and with the value of each credential-bearing query parameter
    replaced (`?password=<redacted>`); unchanged when it has none of them. A value that does
    not parse as a URL is shown only when it has no `@` and no such parameter at all."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        after = url.partition("?")[2]
        return url if "@" not in url and _redact_query(after) == after else REDACTED
    if parts.query:
        parts = parts._replace(query=_redact_query(parts.query))
    user, at, host = parts.netloc.rpartition("@")
    if not at:
        return urlunsplit(parts) if parts.query else url
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


def request_target(raw: str) -> str:
    """The origin form (path and query) of a request target as the client sent it: an
    absolute-form target (`http://host/v1/models?x`, RFC 9112 section 3.2.2, which a client
    may send to a server too) without its scheme and authority; any other target as it is.
    Percent-encoding is kept."""
    if raw.startswith("/"):
        return raw
    try:
        parts = urlsplit(raw)
    except ValueError:
        return "/"
    return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")


def has_dot_segment(path: str) -> bool:
    """Whether a decoded path (`/v1/../x`, `/v1/%2e%2e/x` once decoded) has a `.` or `..`
    segment, which a server further on may resolve to another path than the one forwarded."""
    return any(seg in (".", "..") for seg in path.split("/"))

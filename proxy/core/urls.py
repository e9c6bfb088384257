"""URLs as they may be shown: in `/healthz`, error messages, log lines, `check-config`.

An upstream URL may carry a credential (`https://user:secret@host/v1`). Wherever the proxy
shows a URL it shows `redact_url(url)`: the password replaced by a marker, the rest as
configured, so an operator still sees which host and user it is.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

REDACTED = "<redacted>"


def redact_url(url: str) -> str:
    """`url` without its password (`user:<redacted>@host`); unchanged when it has none. A
    value that does not parse as a URL is shown only when it has no `@` at all."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return url if "@" not in url else REDACTED
    if password is None:
        return url
    user, _, host = parts.netloc.rpartition("@")
    name = user.partition(":")[0]
    return urlunsplit(parts._replace(netloc=f"{name}:{REDACTED}@{host}"))

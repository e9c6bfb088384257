"""URLs as they may be shown: in `/healthz`, error messages, log lines, `check-config`.

An upstream URL may carry a credential (`https://user:secret@host/v1`, or a token as the
user name alone, `https://TOKEN@host/v1`). Wherever the proxy shows a URL it shows
`redact_url(url)`: the password replaced by a marker (the user name kept, so an operator
still sees which user it is), or a lone user name replaced, since that is the credential.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

REDACTED = "<redacted>"


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

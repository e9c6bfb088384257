"""What a network failure between the proxy and an upstream was, in a user's words, whether
the request may have been read before it, and the `UpstreamError` it becomes."""

from __future__ import annotations

import os

import aiohttp

from ..config import UpstreamSettings
from ..core.errors import UpstreamError


class ConnectFailed(UpstreamError):
    """No connection to the upstream could be opened (refused, name not resolved, connect
    timeout): nothing of the request was sent, so another replica may take it
    (upstream/pool.py)."""


def describe(exc: BaseException) -> str:
    """A network failure in a user's words ("connection refused", "name not resolved"),
    never an aiohttp class name."""
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        return "name not resolved"
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        return "its TLS certificate is not trusted"
    if isinstance(exc, aiohttp.ClientSSLError):
        return "the TLS handshake failed"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "the server closed the connection"
    if isinstance(exc, aiohttp.ClientPayloadError):
        return "the answer's body was cut short"
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, aiohttp.ClientConnectorError):
        exc = exc.os_error
    if isinstance(exc, OSError) and exc.errno:
        return os.strerror(exc.errno).lower()
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    if isinstance(exc, ValueError):  # aiohttp would not build the request (a header value)
        return f"the request could not be made: {exc}"
    return "network error"


def sent_then_closed(exc: BaseException) -> bool:
    """The connection failed once the request was on it (closed, reset), not while
    connecting: the server may have read the request."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        return False
    return isinstance(
        exc,
        aiohttp.ServerDisconnectedError
        | aiohttp.ClientOSError
        | aiohttp.ClientConnectionResetError,
    )


def translated(
    exc: BaseException, started: bool, shown: str, settings: UpstreamSettings
) -> UpstreamError:
    """The `UpstreamError` a failure of a request to the upstream at `shown` (its URL as it
    may be shown) is: before its answer's headers, or once it was `started`."""
    if isinstance(exc, aiohttp.ConnectionTimeoutError) and not started:
        return ConnectFailed(
            f"cannot connect to the upstream at {shown} within {settings.connect_timeout:g}s",
            status=504,
            code="upstream_timeout",
        )
    if isinstance(exc, TimeoutError):
        what = "stopped sending" if started else "did not answer"
        return UpstreamError(
            f"the upstream at {shown} {what} within {settings.read_timeout:g}s",
            status=502 if started else 504,
            started=started,
            code="upstream_timeout",
        )
    reason = describe(exc)
    if started:
        message = f"the connection to the upstream at {shown} broke mid-stream ({reason})"
        return UpstreamError(message, status=502, started=True, code="upstream_unavailable")
    if sent_then_closed(exc):
        message = (
            f"the upstream at {shown} closed the connection after the request was sent, "
            f"before answering ({reason}); it was not sent again, since the model may "
            "have taken it"
        )
        return UpstreamError(message, status=502, code="upstream_unavailable")
    message = f"cannot reach the upstream at {shown} ({reason})"
    kind = ConnectFailed if isinstance(exc, aiohttp.ClientConnectorError) else UpstreamError
    return kind(message, status=502, code="upstream_unavailable")


__all__ = ["ConnectFailed", "describe", "sent_then_closed", "translated"]

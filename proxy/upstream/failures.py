"""What a network failure between the proxy and an upstream was, in a user's words, and
whether the request may have been read before it."""

from __future__ import annotations

import os

import aiohttp


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


__all__ = ["describe", "sent_then_closed"]

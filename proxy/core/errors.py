"""The error vocabulary (docs/protocol.md "Errors"), split by who made the mistake.

`ClientError` is the client's fault: the request is rejected, the socket stays open and no
conversation changes. `UpstreamError` is the model server's fault (or its network's): the
response fails, and the same-lane eviction rule of docs/protocol.md "Continuing and eviction"
applies. Each renders the WebSocket `error` event (always with `status`, which Codex needs to treat
it as fatal or retryable) and the HTTP error body. Any other exception inside the proxy is a bug.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import wire
from .urls import missing_v1


class ProxyError(Exception):
    status = 500
    type = "server_error"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        status: int | None = None,
        type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.param = param
        if status is not None:
            self.status = status
        if type is not None:
            self.type = type
        self.headers = headers

    def body(self) -> dict[str, Any]:
        """The `error` object shared by the WS envelope and the HTTP error body."""
        err: dict[str, Any] = {
            "type": self.type,
            "code": self.code,
            "message": self.message,
            "param": self.param,
        }
        if self.headers:
            err["headers"] = self.headers
        return err

    def event(
        self, stream_id: str | None = None, sequence_number: int | None = None
    ) -> dict[str, Any]:
        """The WebSocket `error` event (docs/protocol.md "WebSocket-only events")."""
        ev: dict[str, Any] = {"type": "error", "status": self.status, "error": self.body()}
        if stream_id is not None:
            ev["stream_id"] = stream_id
        if sequence_number is not None:
            ev["sequence_number"] = sequence_number
        # Codex reads rate-limit headers at the top level (docs/protocol.md "WebSocket-only events")
        if self.headers:
            ev["headers"] = self.headers
        return ev


class ClientError(ProxyError):
    """A malformed or unacceptable client request. Always non-fatal for the socket."""

    status = 400
    type = "invalid_request_error"


class UpstreamError(ProxyError):
    """The upstream failed: an HTTP error status, a broken or stalled stream, bad SSE."""

    status = 502
    type = "server_error"

    def __init__(self, message: str, *, started: bool = False, **kw: Any) -> None:
        super().__init__(message, **kw)
        # True once the upstream answered 200 and the stream began: the client is owed a
        # `response.failed` terminal if it already saw `response.created`.
        self.started = started


class ServerDraining(ProxyError):
    """A `response.create` while the server drains (SIGTERM): responses in flight finish,
    nothing new starts, and the client should reconnect (to another instance)."""

    status = 503
    type = "server_error"

    def __init__(self) -> None:
        super().__init__(
            "The server is shutting down and takes no new responses; reconnect.",
            code="server_draining",
        )


class ServerShuttingDown(ProxyError):
    """The drain's grace ran out (SIGTERM, `server.drain_grace_seconds`) while a response was
    still queued or in flight: it is cancelled upstream and fails, so the client knows to
    send it again, on a new connection (to another instance)."""

    status = 503
    type = "server_error"

    def __init__(self) -> None:
        super().__init__(
            "The server shut down before this response finished; send it again on a new "
            "connection.",
            code="server_shutting_down",
        )


class ClientTooSlow(ProxyError):
    """The client read nothing for `server.send_timeout` while a response was being written:
    the response is cancelled upstream and fails, as an upstream failure would (the
    eviction of docs/protocol.md "Continuing and eviction" included); the client finds the events
    once it reads again."""

    status = 408
    type = "invalid_request_error"

    def __init__(self, timeout: float) -> None:
        super().__init__(
            f"The response was cancelled: the client did not read its events for {timeout:g}s.",
            code="client_too_slow",
        )


def invalid(message: str, param: str | None, code: str = "invalid_value") -> ClientError:
    return ClientError(message, code=code, param=param)


def missing(param: str) -> ClientError:
    return ClientError(
        f"Missing required parameter: '{param}'.", code="missing_required_parameter", param=param
    )


def wrong_type(param: str, expected: str) -> ClientError:
    return ClientError(
        f"Invalid type for '{param}': expected {expected}.", code="invalid_type", param=param
    )


def previous_response_not_found(response_id: str) -> ClientError:
    return ClientError(
        f"Previous response with id '{response_id}' not found.",
        code="previous_response_not_found",
        param="previous_response_id",
    )


def stored_response_unavailable(response_id: str) -> ClientError:
    """The documented not-found (400 `previous_response_not_found`) when the shared store
    (docs/store.md) could not answer in time: the id may exist, the store is unavailable."""
    return ClientError(
        f"Previous response with id '{response_id}' not found: the response store is "
        "unavailable right now; retry later, or send the whole conversation.",
        code="previous_response_not_found",
        param="previous_response_id",
    )


def no_tool_call(what: str, call_id: str) -> ClientError:
    """A tool output whose call is not in the conversation: OpenAI's own words and code."""
    return ClientError(
        f"No tool call found for {what} with call_id {call_id[:200]}.", code=None, param="input"
    )


def rate_limit_headers(headers: Mapping[str, str] | None) -> dict[str, str] | None:
    """The headers of an upstream answer a client needs to back off: `Retry-After`,
    `retry-after-ms` and every `x-ratelimit-*`, names in lower case; None when there is none.
    They travel in the WebSocket `error` event's `headers` and on the HTTP error answer."""
    if not headers:
        return None
    kept = {
        k.lower(): v
        for k, v in headers.items()
        if k.lower() in ("retry-after", "retry-after-ms") or k.lower().startswith("x-ratelimit-")
    }
    return kept or None


def reused_response_id(response_id: str) -> UpstreamError:
    """The upstream named a new response with an id this connection already holds."""
    return UpstreamError(
        f"The upstream gave this response the id '{response_id[:200]}', which already names "
        "another response on this connection; it failed, so that the other stays as it was.",
        started=True,
        code="upstream_reused_response_id",
    )


def upstream_redirect(status: int) -> UpstreamError:
    """The model server answered with a redirect, which the proxy never follows."""
    return UpstreamError(
        f"The upstream answered HTTP {status}, a redirect; wsmode does not follow redirects "
        "from the model server. Set upstream.url to the address it redirects to.",
        code="upstream_redirect",
    )


def upstream_http_error(
    status: int, body: bytes, headers: Mapping[str, str] | None = None, url: str | None = None
) -> UpstreamError:
    """Turn an upstream's non-2xx answer into our error, keeping its status and error body.

    OpenAI-compatible servers answer `{"error": {message, type, param, code}}`; some answer
    `{"error": "text"}`, `{"detail": ...}` or plain text. Whatever arrived is preserved as
    far as the envelope allows, so the client sees the upstream's own words, and its
    rate-limit headers (`rate_limit_headers`). With `url` (redacted), a 404 or 405, or an
    answer without an error object, also says which server answered.
    """
    message = body.decode("utf-8", "replace").strip()[:2000] or f"upstream answered HTTP {status}"
    code: str | None = None
    param: str | None = None
    etype = "invalid_request_error" if 400 <= status < 500 else "server_error"
    try:
        doc = wire.loads(body)
    except (wire.JSONDecodeError, ValueError):
        doc = None
    if isinstance(doc, dict):
        err = doc.get("error", doc.get("detail"))
        if isinstance(err, dict):
            message = str(err.get("message") or message)
            code = err.get("code") if isinstance(err.get("code"), str) else None
            param = err.get("param") if isinstance(err.get("param"), str) else None
            if isinstance(err.get("type"), str):
                etype = err["type"]
        elif isinstance(err, str):
            message = err
    worded = isinstance(doc, dict) and isinstance(doc.get("error", doc.get("detail")), dict)
    if url is not None and (status in (404, 405) or not worded):
        # which server answered: a wrong base URL (404 to every request) shows itself. An
        # upstream's own error object otherwise (a 429, a 400) passes on as it was written.
        said = f"the upstream at {url} answered HTTP {status}"
        message = f"{message} ({said})" if body.strip() else said
        if status == 404 and missing_v1(url) is not None:
            message += "; its base URL has no /v1, which OpenAI-compatible servers need"
    return UpstreamError(
        message,
        status=status,
        code=code,
        param=param,
        type=etype,
        headers=rate_limit_headers(headers),
    )


def response_failure(response: dict[str, Any]) -> ProxyError | None:
    """The error of a `response.failed` the upstream sent, as the proxy's own error type."""
    err = response.get("error")
    if not isinstance(err, dict):
        return None
    code = err.get("code")
    message = err.get("message")
    return UpstreamError(
        message if isinstance(message, str) else "The response failed.",
        code=code if isinstance(code, str) else None,
        started=True,
    )

"""What both simulated endpoints share: the OpenAI-shaped error and reading a JSON body."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from aiohttp import web

from ..core import wire

if TYPE_CHECKING:
    from .state import SimState


def error(status: int, message: str, code: str | None, param: str | None = None) -> web.Response:
    body = {
        "error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}
    }
    return web.Response(status=status, body=wire.dumps(body), content_type="application/json")


async def read_request(
    request: web.Request, state: SimState, *, record: bool = True
) -> dict[str, Any] | web.Response:
    """The request's JSON object (recorded for the tests, unless `record` is false: the
    tokenizer's endpoints, which generate nothing), or the 400 a real server gives."""
    raw = await request.read()
    state.bytes_received += len(raw)
    try:
        body = wire.loads(raw)
    except wire.JSONDecodeError:
        return error(400, "We could not parse the JSON body of your request.", "invalid_json")
    if not isinstance(body, dict):
        return error(400, "The body must be a JSON object.", "invalid_json")
    if record:
        state.requests.append({"body": body, "headers": dict(request.headers)})
    return body


async def inject_fault(
    kind: str, request: web.Request, resp: web.StreamResponse, pending: bytes, error_event: bytes
) -> web.StreamResponse:
    """A mid-stream fault, in place of the `pending` SSE bytes: `cut` (half of them, then the
    connection drops), `stall` (silence until the client leaves), `error` (`error_event`,
    the endpoint's own SSE error), or `eof` (the body ends here)."""
    if kind == "cut":
        await resp.write(pending[: len(pending) // 2])
        assert request.transport is not None
        request.transport.abort()
        raise ConnectionResetError("simulated cut")
    if kind == "stall":
        await asyncio.Event().wait()  # until the client goes away and the handler is cancelled
    if kind == "error":
        await resp.write(error_event)
    return resp

"""The HTTP client for the model server: one pooled aiohttp session per app.

Timeouts are connect and read-idle only: a long generation is fine as long as bytes keep
coming. Bodies are read as raw chunks (`iter_any`) into our own SSE decoder, because
aiohttp's line reader fails on lines over 128 KiB. Foreign exceptions become `UpstreamError`
here, at the boundary, so the core never sees an aiohttp type.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

import aiohttp

from proxy.config import UpstreamSettings
from proxy.core.errors import UpstreamError, upstream_http_error

# Request headers a client may send that the upstream should see too.
FORWARDED_HEADERS = ("authorization", "openai-organization", "openai-project", "x-request-id")


def request_body(pieces: list[bytes]) -> bytes:
    """The upstream request body from the session's pieces (cached history bytes)."""
    return b"".join(pieces)


class UpstreamClient:
    def __init__(self, base_url: str, settings: UpstreamSettings) -> None:
        self.base_url = base_url.rstrip("/")
        self.settings = settings
        self.session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=self.settings.max_connections)
        timeout = aiohttp.ClientTimeout(
            total=None,
            connect=self.settings.connect_timeout,
            sock_read=self.settings.read_timeout,
        )
        # auto_decompress off: passthrough relays bodies byte for byte, encoding included
        self.session = aiohttp.ClientSession(
            connector=connector, timeout=timeout, auto_decompress=False
        )

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()

    @asynccontextmanager
    async def stream(
        self, path: str, body: bytes, headers: Mapping[str, str]
    ) -> AsyncIterator[AsyncIterator[bytes]]:
        """POST `body` and yield an iterator over the raw chunks of a 200 answer.

        A non-200 answer raises `UpstreamError` with its status and error body. Network
        failures and timeouts raise `UpstreamError` too, from the request or from the chunk
        iterator (then `started` is true). Exceptions of the caller's own pass untouched.
        Leaving early (a terminal event, a cancellation) closes the upstream connection, which
        tells the model server to stop generating.
        """
        assert self.session is not None, "UpstreamClient.start() was not awaited"
        send = {
            "Content-Type": "application/json",
            "Accept": "text/event-stream",
            "Accept-Encoding": "identity",
            **headers,
        }
        try:
            resp = await self.session.post(self.base_url + path, data=body, headers=send)
            if resp.status != 200:
                try:
                    raise upstream_http_error(resp.status, await self._error_body(resp))
                finally:
                    resp.release()
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise self._translate(exc, started=False) from exc
        complete = False
        try:
            yield self._chunks(resp)
            complete = await self._drain(resp)
        finally:
            if complete:
                resp.release()
            else:
                resp.close()

    def _translate(self, exc: BaseException, started: bool) -> UpstreamError:
        if isinstance(exc, TimeoutError):
            what = "stopped sending" if started else "did not answer"
            return UpstreamError(
                f"upstream {what} within {self.settings.read_timeout:g}s",
                status=502 if started else 504,
                started=started,
                code="upstream_timeout",
            )
        reason = type(exc).__name__
        message = (
            f"upstream connection broke mid-stream ({reason})"
            if started
            else f"cannot reach the upstream at {self.base_url} ({reason})"
        )
        return UpstreamError(message, status=502, started=started, code="upstream_unavailable")

    async def _chunks(self, resp: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
        it = resp.content.iter_any().__aiter__()
        while True:
            try:
                chunk = await it.__anext__()
            except StopAsyncIteration:
                return
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                raise self._translate(exc, started=True) from exc
            yield chunk

    async def _error_body(self, resp: aiohttp.ClientResponse) -> bytes:
        limit = self.settings.max_error_body_bytes
        buf = bytearray()
        while len(buf) < limit:
            chunk = await resp.content.read(limit - len(buf))
            if not chunk:
                break
            buf += chunk
        return bytes(buf)

    async def _drain(self, resp: aiohttp.ClientResponse) -> bool:
        """Read what follows the terminal event (a `[DONE]`) so the connection can be reused.

        Bounded in bytes and time. True when the body ended cleanly."""
        budget = 64 * 1024
        try:
            async with asyncio.timeout(1.0):
                while budget > 0:
                    chunk = await resp.content.readany()
                    if not chunk:
                        return resp.content.at_eof()
                    budget -= len(chunk)
        except (TimeoutError, aiohttp.ClientError, OSError):
            pass
        return False

"""The HTTP client for the model server: one pooled aiohttp session per app.

Timeouts are connect and read-idle only: a long generation is fine as long as bytes keep
coming. Bodies are read as raw chunks into our own SSE decoder, because aiohttp's line
reader fails on lines over 128 KiB. Foreign exceptions become `UpstreamError` here, at the
boundary, so the core never sees an aiohttp type.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from types import TracebackType

import aiohttp
from aiohttp.streams import EofStream
from yarl import URL

from ..config import UpstreamSettings
from ..core.errors import UpstreamError, upstream_http_error, upstream_redirect
from ..core.urls import ROOT, redact_url, server_root, without_userinfo
from ..logs import request_id_var
from ..telemetry.context import ON, OUTGOING, HttpSpan
from .connector import CheckedConnector
from .failures import translated

log = logging.getLogger("wsmode.upstream")

# Request headers a client may send that the upstream should see too.
FORWARDED_HEADERS = ("authorization", "openai-organization", "openai-project", "x-request-id")


REDIRECTS = frozenset({301, 302, 303, 307, 308})


class RedirectRefused(aiohttp.ClientError):
    """The model server answered with a redirect. It is never followed: on 307/308 the
    whole request body and the configured credential would go to wherever it points."""

    def __init__(self, status: int) -> None:
        super().__init__(f"the upstream answered HTTP {status} (a redirect)")
        self.status = status


async def refuse_redirects(
    request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
) -> aiohttp.ClientResponse:
    """Client middleware: a redirect answer ends the request with `RedirectRefused`.

    aiohttp runs the middlewares once per hop and decides to follow only after they
    returned, so raising here stops every request of the session, whatever
    `allow_redirects` its caller passed (`ws_connect` has no such parameter)."""
    resp = await handler(request)
    if resp.status in REDIRECTS:
        resp.release()
        raise RedirectRefused(resp.status)
    return resp


def overloaded(message: str) -> UpstreamError:
    return UpstreamError(message, status=503, code="upstream_overloaded")


class UpstreamGate:
    """At most `limit` upstream requests at once (0: no limit); at most `max_waiting` wait,
    each for at most `timeout` seconds. Beyond either bound: `upstream_overloaded` (503)."""

    def __init__(self, limit: int, max_waiting: int, timeout: float) -> None:
        self.limit = limit
        self.max_waiting = max_waiting
        self.timeout = timeout
        self.active = 0
        self.waiting = 0
        self._sem = asyncio.Semaphore(limit) if limit > 0 else None

    def slot(self) -> UpstreamGate:
        """`async with gate.slot():` holds one slot for the block (the gate is its own
        context manager: no generator to make and step through for every request)."""
        return self

    async def __aenter__(self) -> None:
        sem = self._sem
        if sem is not None:
            if sem.locked():
                if self.waiting >= self.max_waiting:
                    raise overloaded(
                        f"the proxy has {self.limit} upstream requests in flight and "
                        f"{self.waiting} waiting; try again later"
                    )
                self.waiting += 1
                try:
                    async with asyncio.timeout(self.timeout or None):
                        await sem.acquire()
                except TimeoutError:
                    raise overloaded(
                        f"no upstream connection became free within {self.timeout:g}s"
                    ) from None
                finally:
                    self.waiting -= 1
            else:
                await sem.acquire()
        self.active += 1

    async def __aexit__(self, *exc: object) -> None:
        self.active -= 1
        if self._sem is not None:
            self._sem.release()


def split_credentials(url: str) -> tuple[str, str | None]:
    """`url` without its userinfo, and the Basic `Authorization` the userinfo stands for
    (None when it has none; a lone user name is a user with an empty password, as aiohttp
    and curl send it). aiohttp sends a URL's userinfo itself, but refuses (ValueError) a
    request that also has an Authorization header, as every forwarded client request may:
    so requests never see the userinfo, and `UpstreamClient.credential` chooses."""
    try:
        u = URL(url)
    except (TypeError, ValueError):
        return url, None
    if u.raw_user is None and u.raw_password is None:
        return url, None
    pair = f"{u.user or ''}:{u.password or ''}".encode()
    return without_userinfo(url), "Basic " + base64.b64encode(pair).decode("ascii")


class _Chunks:
    """The raw chunks of an answer's body, a network failure raised as `UpstreamError`.
    A class, not an async generator: asyncio finalizes an unfinished generator (a run
    leaves at its terminal event) with a wake-up of the loop through its self-pipe.

    `silence` (`upstream.read_timeout`) bounds the wait for each next chunk with one timer
    per answer, which fails a read waiting that long with aiohttp's timeout error. aiohttp's
    own bound (`sock_read`, which guards the wait for the headers) re-arms a timer on every
    socket read: once the headers are in, it is off for this answer."""

    def __init__(
        self,
        resp: aiohttp.ClientResponse,
        translate: Callable[[BaseException, bool], UpstreamError],
        silence: float | None,
    ) -> None:
        self._content = resp.content
        self._read = resp.content.readany
        self._translate = translate
        self._silence = silence or 0.0
        self._waiting_since = 0.0  # when the pending read began; 0.0 when none is
        self._timer: asyncio.TimerHandle | None = None
        protocol = resp.connection.protocol if resp.connection is not None else None
        if self._silence and protocol is not None:
            protocol.read_timeout = None  # its armed timer goes at the next read or the end
            self._loop = asyncio.get_running_loop()
            self._timer = self._loop.call_later(self._silence, self._check)

    def __aiter__(self) -> _Chunks:
        return self

    async def __anext__(self) -> bytes:
        if self._timer is not None:
            self._waiting_since = self._loop.time()
        try:
            chunk = await self._read()
        except EofStream:
            raise StopAsyncIteration from None
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise self._translate(exc, True) from exc
        finally:
            self._waiting_since = 0.0
        if not chunk:
            raise StopAsyncIteration
        return chunk

    def _check(self) -> None:
        since, now = self._waiting_since, self._loop.time()
        if since and now - since >= self._silence:
            self._timer = None
            self._content.set_exception(
                aiohttp.SocketTimeoutError("Timeout on reading data from socket")
            )
            return
        due = since + self._silence - now if since else self._silence
        self._timer = self._loop.call_later(due, self._check)

    def close(self) -> None:
        """Stop the timer (the answer ended or was left)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def request_body(pieces: list[bytes]) -> bytes:
    """The upstream request body from the session's pieces (cached history bytes)."""
    return b"".join(pieces)


@dataclass(slots=True, eq=False)
class UpstreamRequest:
    """One model request (`UpstreamClient.stream`), an async context manager: entering it
    sends the request and gives the chunks of its 200 answer; leaving drains the rest for
    the connection's reuse, or closes it when the caller left early or failed. A class, not
    a generator-based context manager: a model call makes no generator to step through, to
    register with the event loop and to finalize."""

    client: UpstreamClient
    path: str
    body: bytes
    headers: Mapping[str, str]
    on_sent: Callable[[], None] | None
    base: str
    gate: UpstreamGate
    span: HttpSpan | None = field(default=None, init=False)
    resp: aiohttp.ClientResponse | None = field(default=None, init=False)
    chunks: _Chunks | None = field(default=None, init=False)

    async def __aenter__(self) -> _Chunks:
        client, base, path = self.client, self.base, self.path
        send = {
            "Content-Type": "application/json",
            "Accept": "text/event-stream",
            "Accept-Encoding": "identity",
            **self.headers,
        }
        client._outgoing_headers(send, base)  # the session's middleware's work (`_post`)
        traced = OUTGOING.get() if ON[0] else None  # tracing on: the span it belongs to
        if path.startswith(ROOT):  # the server's own endpoint, beside its /v1 API
            base, path = server_root(base), path[len(ROOT) :]
        await self.gate.__aenter__()
        try:
            if self.on_sent is not None:
                self.on_sent()
            # the request's own span, its context written into `traceparent`
            span = self.span = None if traced is None else traced.request("POST", base + path, send)
            try:
                resp = await client._post(client._url(base + path), self.body, send)
                if span is not None:
                    span.answered(resp.status)
                if resp.status != 200:
                    try:
                        body = await client._error_body(resp)
                        raise upstream_http_error(
                            resp.status, body, resp.headers, url=redact_url(base + path)
                        )
                    finally:
                        resp.release()
            except RedirectRefused as exc:
                raise upstream_redirect(exc.status) from None
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                raise client._translate(exc, started=False, base=base) from exc
        except BaseException as exc:
            await self._left(exc)
            raise
        self.resp = resp
        self.chunks = _Chunks(resp, client._translate, client.settings.read_timeout)
        return self.chunks

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        resp, chunks = self.resp, self.chunks
        assert resp is not None and chunks is not None
        complete, error = False, exc
        try:
            if kind is None:  # read to its terminal event: what follows, for reuse
                complete = await self.client._drain(resp)
        except BaseException as err:
            error = err
            raise
        finally:
            chunks.close()
            if complete:
                resp.release()
            else:
                resp.close()
            await self._left(error)

    async def _left(self, error: BaseException | None) -> None:
        """The request is over (answered and read, or failed): its span ends, its slot of
        the gate is free."""
        if self.span is not None:
            self.span.end(error)
        await self.gate.__aexit__(None, None, None)


class UpstreamClient:
    def __init__(self, base_url: str, settings: UpstreamSettings) -> None:
        self.settings = settings
        # each base URL that had userinfo (taken out): its server and its credential
        self._credentials: dict[str, tuple[URL, str]] = {}
        self._shown: dict[str, str] = {}  # each registered URL as logs and errors name it
        self.base_url = self.register(base_url)
        self.session: aiohttp.ClientSession | None = None
        self._urls: dict[str, URL] = {}  # each endpoint's URL, parsed once, not per request
        self.gate = UpstreamGate(
            settings.max_connections, settings.max_queued_requests, settings.queue_timeout
        )

    def register(self, url: str) -> str:
        """`url` as requests are sent to it: without its userinfo, which becomes the
        credential of requests to it (`credential`). Every upstream URL goes through here."""
        bare, credential = split_credentials(url.rstrip("/"))
        bare = bare.rstrip("/")
        self._shown[bare] = redact_url(url.rstrip("/"))
        if credential is not None:
            self._credentials[bare] = (URL(bare).origin(), credential)
        return bare

    def shown(self, url: str) -> str:
        """`url` as the operator configured it, its secrets redacted: a registered URL keeps
        its user name and says a password is set (`bob:<redacted>@`), though requests go
        to it without either."""
        return self._shown.get(url.rstrip("/"), redact_url(url))

    def credential(self, url: str | URL) -> str | None:
        """The Authorization a request to `url` carries instead of the client's, or None
        (the client's goes as it is). `upstream.api_key` first; else the userinfo of the
        upstream URL the request is under (the longest one), or of one on the same server
        (its root endpoints: llama.cpp's /tokenize, a health path). Never both, and never
        the client's with a URL's: the operator's credential replaces the client's."""
        if self.settings.api_key:
            return f"Bearer {self.settings.api_key}"
        if not self._credentials:
            return None
        text = str(url)
        under = [b for b in self._credentials if text == b or text.startswith((b + "/", b + "?"))]
        if under:
            return self._credentials[max(under, key=len)][1]
        origin = URL(text).origin()
        return next((c for o, c in self._credentials.values() if o == origin), None)

    async def _outgoing(
        self, request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
    ) -> aiohttp.ClientResponse:
        """Client middleware for the session's other requests (passthrough, probes, health
        checks): the configured credential replaces the client's, and the request id travels
        along. Model calls (`_post`) do the same without the middleware chain."""
        self._outgoing_headers(request.headers, request.url)
        return await handler(request)

    def _outgoing_headers(self, headers: MutableMapping[str, str], url: str | URL) -> None:
        credential = self.credential(url)
        if credential is not None:
            # whatever its case: a plain dict of forwarded headers may hold `authorization`
            for name in [k for k in headers if k.lower() == "authorization"]:
                headers.pop(name, None)
            headers["Authorization"] = credential
        rid = request_id_var.get()
        if rid:
            headers["X-Request-Id"] = rid

    @property
    def middlewares(self) -> tuple[aiohttp.ClientMiddlewareType, ...]:
        """What every session to the upstream runs: redirects refused, our credential."""
        return (refuse_redirects, self._outgoing)

    async def start(self) -> None:
        # upstream.max_connections bounds each replica (its gate, upstream/pool.py); the one
        # connector and its keep-alive pool are shared by them all
        replicas = max(1, len(self.settings.replicas))
        # a pooled connection the server closed is never used (upstream/connector.py)
        connector = CheckedConnector(limit=self.settings.max_connections * replicas)
        timeout = aiohttp.ClientTimeout(
            total=None,
            connect=self.settings.connect_timeout,
            sock_read=self.settings.read_timeout,
        )
        # auto_decompress off: passthrough relays bodies byte for byte, encoding included
        self.session = aiohttp.ClientSession(
            connector=connector,
            timeout=timeout,
            auto_decompress=False,
            middlewares=self.middlewares,
        )

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()

    def stream(
        self,
        path: str,
        body: bytes,
        headers: Mapping[str, str],
        on_sent: Callable[[], None] | None = None,
        *,
        base_url: str | None = None,
        gate: UpstreamGate | None = None,
    ) -> UpstreamRequest:
        """POST `body`; `async with` the request for an iterator over the raw chunks of a
        200 answer.

        `base_url` and `gate`: a replica's (upstream/pool.py); by default the client's own.
        The request first waits for a slot of the gate (`upstream_overloaded` if it cannot
        get one); `on_sent` is called when it has one and the request goes out. No
        connection at all raises `ConnectFailed`.

        A non-200 answer raises `UpstreamError` with its status and error body. Network
        failures and timeouts raise `UpstreamError` too, from the request or from the chunk
        iterator (then `started` is true). Exceptions of the caller's own pass untouched.
        Leaving early (a terminal event, a cancellation) closes the upstream connection, which
        tells the model server to stop generating.
        """
        assert self.session is not None, "UpstreamClient.start() was not awaited"
        base = self.base_url if base_url is None else base_url
        return UpstreamRequest(self, path, body, headers, on_sent, base, gate or self.gate)

    def _url(self, url: str) -> URL:
        """`url` parsed, once per endpoint (a replica's responses, chat or token path)."""
        parsed = self._urls.get(url)
        if parsed is None:
            if len(self._urls) >= 256:  # bounded: replicas come and go
                self._urls.clear()
            parsed = self._urls[url] = URL(url)
        return parsed

    async def _post(
        self, url: URL, body: bytes, headers: Mapping[str, str]
    ) -> aiohttp.ClientResponse:
        """POST once. A model call is never sent twice: a request that was written may have
        been read (and started a generation) however the connection failed after it. The
        one failure that leaves nothing sent on a live-looking connection, a pooled
        keep-alive connection the server closed as it was handed out (llama.cpp closes idle
        ones after a few seconds), is caught before the write by the connector
        (upstream/connector.py), which takes another connection."""
        assert self.session is not None
        try:
            # the session's middlewares' work is done here (`stream` set the credential, a
            # redirect is refused below) without aiohttp building their chain per model call
            resp = await self.session.post(
                url, data=body, headers=headers, allow_redirects=False, middlewares=()
            )
        except ValueError as exc:  # aiohttp refused to build it: never a 500 of ours
            shown = redact_url(str(url))
            message = f"the request to the upstream at {shown} could not be made ({exc})"
            raise UpstreamError(message, status=502, code="upstream_unavailable") from None
        if resp.status in REDIRECTS:
            resp.release()
            raise RedirectRefused(resp.status)
        return resp

    def _translate(
        self, exc: BaseException, started: bool, base: str | None = None
    ) -> UpstreamError:
        shown = self.shown(self.base_url if base is None else base)
        return translated(exc, started, shown, self.settings)

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
        if resp.content.at_eof():  # it all came with the terminal event: no timer needed
            return True
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

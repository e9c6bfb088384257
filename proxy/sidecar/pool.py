"""The sidecar's upstream WebSockets: one per active conversation, per credential, reused.

A socket is opened with the credential headers of the request that needs it and only ever
carries that credential's requests, one at a time (the request that holds it is its only
reader). It remembers the last response it completed, since the remote server's
connection-local cache holds that one (docs/protocol.md "The connection cache"). A request for a new
conversation gets a new socket while the pool has room, else the least recently used idle socket of
its credential, else an idle socket of another credential is closed to make room; when every
socket is busy the caller goes over plain HTTP instead of waiting.

Sockets that end badly are closed, idle ones after `idle_timeout`; the closing is done by
the pool's janitor task, so giving a socket back never waits. An upgrade refused with 404 or
426 marks the upstream WebSocket-less for `refusal_memory` seconds (docs/protocol.md "Endpoint and
handshake": 426 means "use HTTP").
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import aiohttp

from ..config import SidecarSettings
from ..core.urls import redact_url
from ..upstream.client import RedirectRefused, refuse_redirects
from ..upstream.failures import describe

log = logging.getLogger("wsmode.sidecar")

REFUSAL_STATUSES = frozenset({404, 426})


class NoSocket(Exception):
    """No WebSocket for this request: the caller sends it over plain HTTP."""


class UpgradeRefused(NoSocket):
    def __init__(self, status: int) -> None:
        super().__init__(f"the upstream refused the WebSocket upgrade with HTTP {status}")
        self.status = status


class CannotOpen(NoSocket):
    pass


class PoolExhausted(NoSocket):
    pass


@dataclass(eq=False)
class UpstreamSocket:
    serial: int
    credential: bytes
    ws: aiohttp.ClientWebSocketResponse[bool]
    busy: bool = True
    last_response_id: str | None = None
    idle_since: float = 0.0
    retired: bool = False

    @property
    def usable(self) -> bool:
        return not self.retired and not self.ws.closed


class SocketPool:
    def __init__(
        self,
        url: str,
        settings: SidecarSettings,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url  # ws:// or wss:// URL of the upstream's /responses
        self.settings = settings
        self.clock = clock
        self.session: aiohttp.ClientSession | None = None
        self.refused_until = float("-inf")
        self.opened = 0  # sockets opened so far
        self.refusals = 0
        self._serials = itertools.count(1)
        self._sockets: dict[int, UpstreamSocket] = {}
        self._opening = 0  # slots reserved by opens in progress
        self._doomed: list[UpstreamSocket] = []
        self._wake = asyncio.Event()
        self._janitor: asyncio.Task[None] | None = None

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        s = self.settings
        self.session = aiohttp.ClientSession(
            # the pool bounds open sockets; the connector leaves room for ones being closed
            connector=aiohttp.TCPConnector(limit=2 * s.max_connections),
            timeout=aiohttp.ClientTimeout(
                total=None, connect=s.connect_timeout, sock_read=s.read_timeout
            ),
            middlewares=(refuse_redirects,),  # an upgrade answered 3xx is not followed
        )
        self._janitor = asyncio.create_task(self._sweep(), name="sidecar-pool-janitor")

    async def close(self) -> None:
        if self._janitor is not None:
            self._janitor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._janitor
        for sock in list(self._sockets.values()):
            self._retire(sock)
        await self._close_doomed()
        if self.session is not None:
            await self.session.close()

    @property
    def open_count(self) -> int:
        return len(self._sockets)

    def websocket_refused(self) -> bool:
        return self.clock() < self.refused_until

    # ------------------------------------------------------------ taking sockets

    def take_holder(
        self, credential: bytes, response_id: str, serial: int | None = None
    ) -> UpstreamSocket | None:
        """The idle socket whose last response is `response_id`, if it is still open."""
        if serial is not None:
            candidates = [self._sockets[serial]] if serial in self._sockets else []
        else:
            candidates = list(self._sockets.values())
        for sock in candidates:
            if (
                sock.credential == credential
                and not sock.busy
                and sock.usable
                and sock.last_response_id == response_id
            ):
                sock.busy = True
                return sock
        return None

    async def acquire(self, credential: bytes, headers: Mapping[str, str]) -> UpstreamSocket:
        """A socket for a new conversation. Raises `NoSocket` when there is none to be had."""
        if self.websocket_refused():
            raise UpgradeRefused(426)
        self._prune()
        limit = self.settings.max_connections
        if len(self._sockets) + self._opening >= limit:
            idle = [s for s in self._sockets.values() if not s.busy]
            mine = [s for s in idle if s.credential == credential]
            if mine:
                sock = min(mine, key=lambda s: s.idle_since)
                sock.busy = True
                sock.last_response_id = None  # it starts another conversation
                return sock
            if not idle:
                raise PoolExhausted(f"all {limit} upstream WebSockets are busy")
            self._retire(min(idle, key=lambda s: s.idle_since))
        return await self._open(credential, headers)

    async def _open(self, credential: bytes, headers: Mapping[str, str]) -> UpstreamSocket:
        assert self.session is not None, "SocketPool.start() was not awaited"
        s = self.settings
        self._opening += 1
        try:
            async with asyncio.timeout(s.connect_timeout or None):
                ws = await self.session.ws_connect(
                    self.url,
                    headers=dict(headers),
                    max_msg_size=s.max_message_bytes,
                    autoping=True,
                    decode_text=False,
                    timeout=aiohttp.ClientWSTimeout(
                        ws_receive=None, ws_close=s.connect_timeout or 10.0
                    ),
                )
        except aiohttp.WSServerHandshakeError as exc:
            if exc.status in REFUSAL_STATUSES:
                self.refusals += 1
                self.refused_until = self.clock() + s.refusal_memory
                log.warning(
                    "upstream %s refused WebSocket mode (HTTP %s): plain HTTP for %gs",
                    redact_url(self.url),
                    exc.status,
                    s.refusal_memory,
                )
                raise UpgradeRefused(exc.status) from exc
            raise CannotOpen(
                f"the WebSocket upgrade at {redact_url(self.url)} answered HTTP {exc.status}"
            ) from exc
        except RedirectRefused as exc:
            raise CannotOpen(
                f"the WebSocket upgrade at {redact_url(self.url)} answered HTTP {exc.status}"
            ) from exc
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise CannotOpen(
                f"cannot open a WebSocket to {redact_url(self.url)} ({describe(exc)})"
            ) from exc
        finally:
            self._opening -= 1
        sock = UpstreamSocket(next(self._serials), credential, ws)
        self._sockets[sock.serial] = sock
        self.opened += 1
        return sock

    # ------------------------------------------------------------ giving back

    def release(self, sock: UpstreamSocket, keep: bool) -> None:
        """The request is done with `sock`. Never waits: closing is the janitor's job."""
        if keep and sock.usable:
            sock.busy = False
            sock.idle_since = self.clock()
            self._wake.set()  # the earliest idle deadline may have changed
        else:
            self._retire(sock)

    def _retire(self, sock: UpstreamSocket) -> None:
        sock.retired = True
        if self._sockets.pop(sock.serial, None) is not None:
            self._doomed.append(sock)
            self._wake.set()

    def _prune(self) -> None:
        for sock in list(self._sockets.values()):
            if sock.ws.closed:
                self._retire(sock)

    # ------------------------------------------------------------ janitor

    async def _sweep(self) -> None:
        idle_timeout = self.settings.idle_timeout
        while True:
            self._wake.clear()
            wait: float | None = None
            if idle_timeout > 0:
                now = self.clock()
                for sock in list(self._sockets.values()):
                    if not sock.busy:
                        left = sock.idle_since + idle_timeout - now
                        if left <= 0:
                            log.debug("closing upstream WebSocket %d: idle", sock.serial)
                            self._retire(sock)
                        else:
                            wait = left if wait is None else min(wait, left)
            await self._close_doomed()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._wake.wait()

    async def _close_doomed(self) -> None:
        doomed, self._doomed = self._doomed, []
        if doomed:
            await asyncio.gather(*(self._close(s) for s in doomed))

    async def _close(self, sock: UpstreamSocket) -> None:
        try:
            await sock.ws.close()
        except (aiohttp.ClientError, OSError, TimeoutError):
            pass  # it is gone either way
        except Exception:
            log.exception("closing upstream WebSocket %d failed", sock.serial)

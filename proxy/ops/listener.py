"""The listening socket, with an accept loop that survives running out of descriptors.

asyncio's own accept loop (Python 3.11's `_accept_connection`) handles EMFILE badly: for
each queued connection in one tick it logs a traceback and schedules another retry, so a
process at its descriptor limit writes thousands of log lines a second and keeps the event
loop busy re-failing. Here one task accepts: when the process is out of descriptors (or
memory for sockets) it stops accepting for a while, starting at 50 ms and doubling up to
1 s, logging one warning per pause; waiting connections stay in the kernel's backlog until
descriptors free up (a closed WebSocket, a connection cut by `server.header_timeout`).
With a TLS context (`server.tls_cert_file`), each accepted connection's handshake runs in a
task of its own, so a slow or silent client never holds up the accept loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
import ssl

from aiohttp import web

log = logging.getLogger("wsmode.listener")

OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_FIRST_PAUSE = 0.05
_LONGEST_PAUSE = 1.0


class _AcceptServer(asyncio.AbstractServer):
    """What aiohttp's runner needs of a server (`sockets`, `close`): the listening sockets
    (one per address of the host, as `loop.create_server` binds) and a task accepting on
    each."""

    def __init__(
        self, socks: list[socket.socket], factory: web.Server, tls: ssl.SSLContext | None = None
    ) -> None:
        self._socks = socks
        self._tasks = [
            asyncio.create_task(self._accept(sock, factory, tls), name="wsmode-accept")
            for sock in socks
        ]

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        return tuple(self._socks)

    def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for sock in self._socks:
            sock.close()

    async def wait_closed(self) -> None:
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def is_serving(self) -> bool:
        return any(not task.done() for task in self._tasks)

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._tasks[0].get_loop()

    async def start_serving(self) -> None:
        pass  # serving since it was made

    async def serve_forever(self) -> None:
        await self.wait_closed()

    @staticmethod
    async def _accept(sock: socket.socket, factory: web.Server, tls: ssl.SSLContext | None) -> None:
        loop = asyncio.get_running_loop()
        pause = _FIRST_PAUSE
        while True:
            try:
                conn, _ = await loop.sock_accept(sock)
            except OSError as exc:
                if exc.errno in OUT_OF_RESOURCES:
                    log.warning(
                        "cannot accept connections: %s; pausing accept for %gs",
                        exc.strerror,
                        pause,
                    )
                    await asyncio.sleep(pause)
                    pause = min(2 * pause, _LONGEST_PAUSE)
                elif exc.errno in (errno.EBADF, errno.EINVAL):
                    return  # the listener was closed
                else:  # the peer gave up before we accepted (ECONNABORTED...): next one
                    log.info("accept failed: %s", exc)
                continue
            pause = _FIRST_PAUSE
            if tls is None:
                await _connect(loop, factory, conn, None)
            else:  # a TLS handshake takes round trips: never make the next client wait for it
                task = asyncio.create_task(_connect(loop, factory, conn, tls))
                _HANDSHAKES.add(task)
                task.add_done_callback(_HANDSHAKES.discard)


_HANDSHAKES: set[asyncio.Task[None]] = set()  # TLS handshakes under way (held, not collected)


async def _connect(
    loop: asyncio.AbstractEventLoop,
    factory: web.Server,
    conn: socket.socket,
    tls: ssl.SSLContext | None,
) -> None:
    try:
        await loop.connect_accepted_socket(factory, conn, ssl=tls)
    except (OSError, TimeoutError) as exc:  # ssl.SSLError is an OSError: a failed handshake
        log.info("accepted connection failed: %s", exc)
        conn.close()


class Listener(web.BaseSite):
    """A TCP site for `web.AppRunner` (in place of `web.TCPSite`) that owns its accept loop."""

    __slots__ = ("_accept", "_host", "_port", "_reuse_port")

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        *,
        reuse_port: bool = False,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        super().__init__(runner, ssl_context=ssl_context)
        self._host = host
        self._port = port
        self._reuse_port = reuse_port
        self._accept: _AcceptServer | None = None

    @property
    def name(self) -> str:
        scheme = "https" if self._ssl_context is not None else "http"
        return f"{scheme}://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(
            self._host or None, self._port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
        # every address of the host, once each (getaddrinfo repeats them per protocol)
        addresses = dict.fromkeys((family, sockaddr[:2]) for family, *_, sockaddr in infos)
        socks: list[socket.socket] = []
        try:
            for family, address in addresses:
                sock = socket.create_server(
                    address, family=family, backlog=self._backlog, reuse_port=self._reuse_port
                )  # an AF_INET6 socket is IPV6_V6ONLY: "::" and "0.0.0.0" may both be bound
                sock.setblocking(False)
                socks.append(sock)
        except OSError:
            for sock in socks:
                sock.close()
            raise
        self._accept = _AcceptServer(socks, server, self._ssl_context)
        self._server = self._accept

    async def stop(self) -> None:
        await super().stop()  # closes the socket and cancels the accept task
        if self._accept is not None:
            await self._accept.wait_closed()

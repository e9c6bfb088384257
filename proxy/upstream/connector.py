"""The connector of the upstream session: a pooled keep-alive connection that the server has
closed is never given to a request.

A model call is not idempotent: it costs tokens and time, and a request that the server (or a
balancer in front of it) read and then dropped unanswered must not be sent again. So the
client never resends a request that was written (upstream/client.py `_post`), and this is the
one case it need not: a server that closes an idle keep-alive connection (llama.cpp does
after a few seconds) just as the pool hands it out. Its FIN is in the kernel already, but the
event loop has not read it yet, so aiohttp still takes the connection for a live one; a
request written on it is never read, and fails.

How it is known that nothing of the request was sent, with aiohttp 3.14: aiohttp's own
signals do not tell. `on_request_headers_sent` and `on_request_chunk_sent` fire *before* the
bytes are handed to the transport (the headers are buffered and written with the body, by a
task of their own), and when the request fails nothing says how far the write got; a
connection reused from the pool (`on_connection_reuseconn`) that fails after the write may
well have been read. What is certain is the socket's state before anything is written: the
kernel has the server's FIN or RST as soon as it arrives. So `connect` asks the kernel about
every pooled connection before handing it out (`peer_closed`: TCP_INFO's state on Linux, a
non-blocking MSG_PEEK elsewhere), and a closed one is closed here and the next one taken, or a
new one opened: the request then goes once, on a live connection. A server that closes in
the instant between that check and the write costs the turn (an `upstream_unavailable`
error), never a second model call.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import weakref

import aiohttp
from aiohttp.client_proto import ResponseHandler
from aiohttp.connector import Connection
from aiohttp.tracing import Trace

log = logging.getLogger("wsmode.upstream")

_TCP_ESTABLISHED = 1  # tcpi_state, the first byte of struct tcp_info (linux/tcp.h)
_INET = (socket.AF_INET, socket.AF_INET6)


def peer_closed(transport: asyncio.BaseTransport | None) -> bool:
    """True when the server has closed (FIN) or reset (RST) the connection of `transport`,
    as the kernel knows it now, whatever the event loop has read so far."""
    if transport is None or transport.is_closing():
        return True
    sock = transport.get_extra_info("socket")
    if sock is None or sock.family not in _INET:
        return False  # nothing to ask: taken for live, as aiohttp takes it
    try:
        if hasattr(socket, "TCP_INFO"):  # Linux: the TCP state, TLS or not
            state = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)
            return bool(state) and state[0] != _TCP_ESTABLISHED
        with sock.dup() as dup:  # elsewhere: an end of stream waiting to be read
            dup.setblocking(False)
            peeked: bytes = dup.recv(1, socket.MSG_PEEK)
            return peeked == b""
    except BlockingIOError:
        return False  # nothing to read: open
    except OSError:
        return True  # reset


class CheckedConnector(aiohttp.TCPConnector):
    """`aiohttp.TCPConnector` whose `connect` never returns a pooled connection the server
    has closed (the module's docstring says why and how)."""

    def __init__(self, *, limit: int) -> None:
        super().__init__(limit=limit)
        self._handed_out: weakref.WeakSet[ResponseHandler] = weakref.WeakSet()
        self.replaced = 0  # pooled connections found closed and not used (for tests, logs)

    async def connect(
        self, req: aiohttp.ClientRequest, traces: list[Trace], timeout: aiohttp.ClientTimeout
    ) -> Connection:
        while True:
            conn = await super().connect(req, traces, timeout)
            proto = conn.protocol
            if proto is None:
                return conn
            if proto not in self._handed_out:  # just opened: nothing to check
                self._handed_out.add(proto)
                return conn
            if not peer_closed(conn.transport):
                return conn
            # closed by the server while it idled in the pool: nothing was written on it
            self.replaced += 1
            log.info(
                "the upstream %s:%s had closed a pooled keep-alive connection; the request "
                "goes on another one",
                req.url.host,
                req.url.port,
            )
            conn.close()


__all__ = ["CheckedConnector", "peer_closed"]

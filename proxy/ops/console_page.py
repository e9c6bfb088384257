"""`GET /console` and its feed, for any server that has a console (the proxy's,
proxy/console/routes.py; the sidecar's, proxy/sidecar/console.py): the routes, the policy
of when it is on, and the feed's writer. What a snapshot holds is the server's own.

The page, its scripts and its style sheet are files of the console package
(proxy/console/static/; the sidecar has a page of its own there), read once
when the app is built and served from memory; they load nothing else (their
Content-Security-Policy says so to the browser too). They hold no data, so they are served
without proxy auth; everything the page shows comes from `GET /console/feed`, a stream of
Server-Sent Events that stays behind the proxy's auth and its Origin/Host policy like every
other route. A browser's `EventSource` cannot send an `Authorization` header, so the page
reads the feed with `fetch` and a streamed body: when the feed answers 401 the page asks for
the key, keeps it in the tab's sessionStorage and sends it as `Authorization: Bearer KEY`,
never in a URL (where access logs and the browser's history would keep it).

When the console is on (`enabled_on`, `check_auth`): `console.enabled = "auto"` (the
default) turns it on only when the server's host is a loopback address; `true` turns it on
anywhere, and on a non-loopback listener only with proxy auth configured (the server refuses
to start without).

The feed: a `hello` event (the console's settings), a `state` snapshot (proxy/console/
state.py), the ring's recent events, then each new event as it is published and a snapshot
every `console.state_interval` (one per interval for every page: ops/console_feed.py). A
page that falls `console.subscriber_queue` events behind, or whose socket takes no byte for
`_STALL` seconds, is dropped (its socket closed; the page reconnects); while the server
drains, feeds end. Every write is bounded by the feed's buffer, the first one too (the ring
goes in pieces), and a feed that ends never waits on its page: what cannot be flushed within
`_CLOSE_BOUND` seconds is cut (the socket aborted), so a page that never reads holds neither
a socket nor memory, nor a drain past its grace.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from importlib import resources
from typing import Any

from aiohttp import web

from ..config import ConfigError, Settings
from ..core import wire
from .console_feed import ConsoleFeed, Subscriber
from .middleware import client_left
from .origin import host_name, is_loopback

STATIC_PACKAGE = __package__.rpartition(".")[0] + ".console"  # wsmode.console
PAGE = "/console"
FEED = "/console/feed"
# path -> (file in static/, content type)
FILES = {
    PAGE: ("index.html", "text/html; charset=utf-8"),
    "/console/charts.js": ("charts.js", "text/javascript; charset=utf-8"),
    "/console/console.js": ("console.js", "text/javascript; charset=utf-8"),
    "/console/console.css": ("console.css", "text/css; charset=utf-8"),
}
# the browser loads nothing but these files and reads nothing but the feed
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
# what a feed may hold in the proxy's and the kernel's buffers for a page not reading
_FEED_BUFFER = 256 * 1024
_PIECE = _FEED_BUFFER // 4  # the ring a page opening the feed gets, at most this per write
_CLOSE_BOUND = 1.0  # seconds a feed's socket may take to flush once it is closed
_STALL = 10.0  # seconds a write may wait on a page that takes nothing before it is dropped


@dataclass(frozen=True)
class Served:
    """What the feed's route needs of the server it is part of (the proxy's `Ops`, the
    sidecar's state): the feed, and where an open feed is known to the drain."""

    feed: ConsoleFeed
    register: Callable[[Any], None]
    unregister: Callable[[Any], None]


SERVED = web.AppKey("wsmode_console", Served)


def enabled_on(settings: Settings, host: str) -> bool:
    """Whether the console is on for a server listening on `host`: `console.enabled`,
    where "auto" means on a loopback address only."""
    on = settings.console.enabled
    if on == "auto":
        return is_loopback(host_name(host))
    return bool(on)


def check_auth(settings: Settings, host: str, has_auth: bool) -> None:
    """Raises ConfigError when the console is on for a non-loopback `host` without auth."""
    if not is_loopback(host_name(host)) and not has_auth:
        raise ConfigError(
            f"console.enabled = true on a non-loopback listener ({host}) "
            "needs proxy auth: set auth.api_keys or auth.api_key_hashes_file, or listen "
            "on 127.0.0.1"
        )


def add_routes(app: web.Application, served: Served, page: str = "index.html") -> list[str]:
    """The page (`page`, a file of static/), its scripts and style sheet, and the feed; the
    paths that need no auth (the page's files, which hold no data) are returned."""
    app[SERVED] = served
    # the files are data of the console package (proxy/console/static/), read, not imported
    static = resources.files(STATIC_PACKAGE) / "static"
    files = {**FILES, PAGE: (page, FILES[PAGE][1])}
    for path, (name, content_type) in files.items():
        body = (static / name).read_bytes()
        app.router.add_get(path, _file(body, content_type))
    app.router.add_get(FEED, _feed)
    return list(files)


def _file(body: bytes, content_type: str) -> Any:
    async def handler(_: web.Request) -> web.Response:
        return web.Response(body=body, headers={"Content-Type": content_type, **HEADERS})

    return handler


def _sse(event: bytes) -> bytes:
    return b"data: " + event + b"\n\n"


class _Reader:
    """One open feed, known to the drain like a connection: a drain ends it, and cuts its
    socket if its writer still waits on the page `_CLOSE_BOUND` seconds later."""

    def __init__(self, sub: Subscriber, transport: asyncio.Transport | None) -> None:
        self.sub = sub
        self.transport = transport
        self.closing = False
        self.done = False

    def begin_drain(self, grace: float) -> None:
        self.closing = True
        self.sub.ready.set()
        loop = asyncio.get_running_loop()
        loop.call_later(min(grace, _CLOSE_BOUND), self._cut_if_stuck)

    def _cut_if_stuck(self) -> None:
        transport = self.transport
        if transport is not None and (not self.done or transport.get_write_buffer_size()):
            transport.abort()

    def queued_creates(self) -> int:
        return 0


def hang_up(transport: asyncio.Transport | None) -> None:
    """Close a feed's socket now, and abort it if what is buffered for the page cannot be
    flushed within `_CLOSE_BOUND` seconds (a page that does not read would keep it open
    for good: `close()` waits for the flush)."""
    if transport is None or transport.is_closing():
        return
    transport.close()
    asyncio.get_running_loop().call_later(_CLOSE_BOUND, transport.abort)


async def _feed(request: web.Request) -> web.StreamResponse:
    served = request.app[SERVED]
    console = served.feed
    transport = request.transport
    joined = console.subscribe(lambda: hang_up(transport))  # a page too slow for the feed
    if joined is None:
        body = {
            "error": {
                "type": "server_error",
                "code": "console_busy",
                "message": f"{console.settings.max_subscribers} console pages are open "
                "already (console.max_subscribers); close one and retry.",
                "param": None,
            }
        }
        return web.Response(status=503, body=wire.dumps(body), content_type="application/json")
    sub, backlog = joined
    reader = _Reader(sub, transport if isinstance(transport, asyncio.Transport) else None)
    served.register(reader)
    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", **HEADERS, "X-Accel-Buffering": "no"}
    )
    resp.force_close()  # a feed's connection ends with it: nothing may wait on it after
    try:
        await resp.prepare(request)
        _bound_buffers(request)
        hello = {
            "type": "hello",
            "show_content": console.show_content,
            "ring_size": console.settings.ring_size,
            "state_interval": console.settings.state_interval,
            "backlog": len(backlog),  # the ring's events that follow the first snapshot
        }
        write = _Writer(resp, console, sub)
        tick, state = console.state(asyncio.get_running_loop().time())
        await write([wire.dumps(hello), state])
        for piece in _pieces(backlog, _PIECE):
            if sub.dropped or reader.closing:
                return resp
            await write(piece)
        await _stream(write, console, sub, reader, tick)
    except ConnectionError:
        pass  # the page left, or was dropped for being too slow
    except asyncio.CancelledError:
        # aiohttp cancels the handler of a client that left: for a feed, which never ends
        # by itself, that is its ordinary end (no "left before its answer" line)
        task = asyncio.current_task()
        if not client_left(request) or task is None:
            raise  # the server is stopping
        task.uncancel()
    finally:
        reader.done = True
        console.unsubscribe(sub)
        served.unregister(reader)
    return resp


class _Writer:
    """Writes frames to one page; a write that waits `_STALL` seconds on a page that takes
    nothing drops the page (ConnectionError)."""

    def __init__(self, resp: web.StreamResponse, console: ConsoleFeed, sub: Subscriber) -> None:
        self.resp = resp
        self.console = console
        self.sub = sub

    async def __call__(self, frames: list[bytes]) -> None:
        try:
            async with asyncio.timeout(_STALL):
                await self.resp.write(b"".join(_sse(f) for f in frames))
        except TimeoutError:
            self.console.drop(self.sub)
            raise ConnectionResetError("the console page took nothing") from None


def _pieces(frames: list[bytes], size: int) -> Iterator[list[bytes]]:
    """`frames` in runs of at most `size` bytes (a frame larger than that is a run alone)."""
    run: list[bytes] = []
    held = 0
    for frame in frames:
        if run and held + len(frame) > size:
            yield run
            run, held = [], 0
        run.append(frame)
        held += len(frame)
    if run:
        yield run


async def _stream(
    write: Callable[[list[bytes]], Awaitable[None]],
    console: ConsoleFeed,
    sub: Subscriber,
    reader: _Reader,
    sent: int,
) -> None:
    """New events as they come, and each interval's snapshot (shared by every page) once
    its interval begins, until the page leaves, is dropped, or the server drains. `sent`:
    the interval of the last snapshot sent."""
    loop = asyncio.get_running_loop()
    interval = console.settings.state_interval
    while True:
        wait = (sent + 1) * interval - loop.time()
        if wait > 0:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await sub.ready.wait()
        if sub.dropped or reader.closing:
            return
        frames = sub.take()
        tick, state = console.state(loop.time())
        if tick > sent:
            frames.append(state)
            sent = tick
        if frames:
            await write(frames)


def _bound_buffers(request: web.Request) -> None:
    """A page that stops reading holds at most this much in our write buffer and the
    kernel's; past it a write waits, the page's queue fills, and the page is dropped."""
    transport = request.transport
    if transport is None:
        return
    transport.set_write_buffer_limits(high=_FEED_BUFFER // 2)
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _FEED_BUFFER // 2)

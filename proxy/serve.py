"""Running the proxy as a process: listen, and on SIGTERM (or SIGINT) drain, then exit 0.

Drain, in order: `/healthz` answers 503 `draining` and every new request but /healthz and
/metrics gets 503 (the listener stays open so load balancers can see it); each WebSocket
refuses new creates and closes with 1001 as soon as it has nothing in flight; at the end of
`server.drain_grace_seconds` whatever is still running is cut and its socket closed with 1001.
A cut response ends with `response.failed` and an `error` (503 `server_shutting_down`);
`POST /v1/responses` is waited for and cut the same way. Then the listener closes and the
process exits 0. A second signal cuts the grace short (the drain's log line says so).

Start-up: the "listening on" line is logged once the socket is bound (in the log format the
settings ask for); a port that cannot be bound is one `ListenError` line, not a traceback.
With `server.tls_cert_file` and `server.tls_key_file` the listener speaks TLS itself
(`tls_context`): clients then use wss:// and https://.

Descriptors: `server.max_connections` is first fitted to the descriptor limit
(`ops/descriptors.py`); the listener's accept loop pauses when descriptors run out anyway
(`ops/listener.py`); a connection that does not send a complete request head within
`server.header_timeout` is closed (aiohttp's keep-alive timer, which also runs before the
first request).
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import multiprocessing
import os
import signal
import socket
import ssl
import time
from collections.abc import Callable
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess

from aiohttp import web

from .config import ServerSettings, Settings
from .core.context.sealing import encode_key, new_key
from .ops import descriptors
from .ops.listener import Listener
from .ops.middleware import OPS

log = logging.getLogger("wsmode")

# After the grace: time for the 1001 closing handshakes and the last HTTP responses.
_CLOSE_MARGIN = 5.0
_AIOHTTP_KEEPALIVE = 3630.0  # aiohttp's own default, for server.header_timeout = 0
_LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost"})
_ANY = frozenset({"0.0.0.0", "::", ""})


class ListenError(Exception):
    """The listening socket could not be made (the port in use, an address not ours...)."""


def tls_context(server: ServerSettings) -> ssl.SSLContext | None:
    """The server-side TLS context of `server.tls_cert_file`/`tls_key_file`, or None."""
    if not server.tls_cert_file:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        ctx.load_cert_chain(server.tls_cert_file, server.tls_key_file or None)
    except (OSError, ssl.SSLError) as exc:
        raise ListenError(
            f"cannot load server.tls_cert_file {server.tls_cert_file} / server.tls_key_file "
            f"{server.tls_key_file}: {exc}"
        ) from None
    return ctx


def is_loopback(host: str) -> bool:
    return host in _LOOPBACK or host.startswith("127.")


def client_host(host: str) -> str:
    """The host a client on this machine uses for a listener on `host`: a wildcard address
    (0.0.0.0, ::) is no address to connect to, so loopback stands in for it."""
    if host in _ANY:
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


def bind_error(host: str, port: int, exc: OSError) -> ListenError:
    why = os.strerror(exc.errno) if exc.errno else str(exc)
    return ListenError(f"cannot listen on {host}:{port}: {why.lower()}")


def check_bindable(host: str, port: int) -> None:
    """Raise `ListenError` now if `host:port` cannot be bound with SO_REUSEPORT (for the
    supervisor, before it starts workers that would each fail the same way)."""
    try:
        with socket.create_server((host, port), reuse_port=True):
            pass
    except OSError as exc:
        raise bind_error(host, port, exc) from None


async def start_listener(
    runner: web.AppRunner,
    host: str,
    port: int,
    *,
    reuse_port: bool = False,
    ssl_context: ssl.SSLContext | None = None,
) -> Listener:
    site = Listener(runner, host, port, reuse_port=reuse_port, ssl_context=ssl_context)
    try:
        await site.start()
    except OSError as exc:
        raise bind_error(host, port, exc) from None
    return site


# The collector's first generation, in container allocations (Python's default is 700).
GC_GEN0_THRESHOLD = 10_000


def tune_collector() -> None:
    """Tune the cycle collector for a server, once its app is built. Everything that exists
    then (modules, the app, its settings) lives as long as the process: `gc.freeze` takes
    it out of every later collection. And the young generation is collected every 10,000
    allocations instead of 700: a turn's many short-lived objects are freed by their
    reference counts before a collection can promote them, so the full collections, which
    walk every connection's state, become rare (docs/bench.md "The event path: profiled,
    then cut")."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, middle, old)


async def run_site(
    app: web.Application,
    host: str,
    port: int,
    announce: Callable[[], None],
    *,
    ssl_context: ssl.SSLContext | None = None,
    header_timeout: float = 30.0,
) -> None:
    """Serve `app` (the sidecar, the simulated model) until SIGTERM or SIGINT: bind, then
    `announce`, then wait. No drain: these hold nothing a client would lose."""
    runner = web.AppRunner(
        app,
        access_log=None,
        shutdown_timeout=_CLOSE_MARGIN,
        handler_cancellation=True,
        keepalive_timeout=header_timeout or _AIOHTTP_KEEPALIVE,
    )
    await runner.setup()
    tune_collector()
    try:
        await start_listener(runner, host, port, ssl_context=ssl_context)
        announce()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        await runner.cleanup()


def announce_serve(settings: Settings, version: str) -> None:
    """The start-up line, and what a user must know about where it listens."""
    s = settings.server
    tls = bool(s.tls_cert_file)
    host = client_host(s.host)
    ws, http = ("wss", "https") if tls else ("ws", "http")
    log.info(
        "wsmode %s listening on %s://%s:%d/v1/responses (clients use base URL %s://%s:%d/v1)",
        version,
        ws,
        host,
        s.port,
        http,
        host,
        s.port,
    )
    from .app import console_on

    if console_on(settings):
        log.info("console (open it in a browser): %s://%s:%d/console", http, host, s.port)
    if s.listen_file:
        try:
            with open(s.listen_file, "w", encoding="utf-8") as f:
                f.write(f"{http}://{host}:{s.port}/v1\n")
        except OSError as exc:
            log.warning("cannot write server.listen_file %s: %s", s.listen_file, exc)
    if s.host in _ANY:
        log.info(
            "listening on every address (%s): clients on other machines use this machine's "
            "address or name in place of %s",
            s.host or "*",
            host,
        )
    auth = settings.auth.api_keys or settings.auth.api_key_hashes_file
    if not is_loopback(s.host) and not auth:
        log.warning(
            "listening on %s without proxy auth: anyone who can reach port %d can use the "
            "upstream through this proxy; set auth.api_keys (or auth.api_key_hashes_file)",
            s.host or "*",
            s.port,
        )


async def serve(settings: Settings, announce: Callable[[], None] | None = None) -> None:
    # the proxy's app, imported here: `run_site` (the sidecar, the simulated model) needs
    # none of it, and a process starts faster without it
    from .app import HANDLER_CANCELLATION, create_app

    fitted = descriptors.budget(settings)
    if fitted.warning:
        log.warning("%s", fitted.warning)
    settings = dataclasses.replace(
        settings,
        server=dataclasses.replace(settings.server, max_connections=fitted.connections),
    )
    app = create_app(settings)
    runner = web.AppRunner(
        app,
        access_log=None,
        shutdown_timeout=_CLOSE_MARGIN,
        handler_cancellation=HANDLER_CANCELLATION,
        keepalive_timeout=settings.server.header_timeout or _AIOHTTP_KEEPALIVE,
    )
    await runner.setup()
    tune_collector()
    try:
        await start_listener(
            runner,
            settings.server.host,
            settings.server.port,
            reuse_port=settings.server.reuse_port,
            ssl_context=tls_context(settings.server),
        )
        if announce is not None:
            announce()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        signals = (signal.SIGTERM, signal.SIGINT)
        for sig in signals:
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        stop.clear()
        ops = app[OPS]
        ops.begin_drain()
        grace = settings.server.drain_grace_seconds
        drained = asyncio.create_task(ops.wait_drained(grace + _CLOSE_MARGIN))
        second = asyncio.create_task(stop.wait())
        await asyncio.wait({drained, second}, return_when=asyncio.FIRST_COMPLETED)
        if second.done():
            log.warning("second signal: cutting the drain short")
            for conn in list(ops.connections):
                conn.begin_drain(0.0)
            await ops.wait_drained(_CLOSE_MARGIN)
        second.cancel()
        drained.cancel()
        for sig in signals:
            loop.remove_signal_handler(sig)
        log.info("drained; stopping")
    finally:
        await runner.cleanup()


def run(settings: Settings, *, version: str = "") -> int:
    """Serve in this process, or supervise `server.workers` processes sharing the port."""
    if settings.server.workers <= 1:
        asyncio.run(serve(settings, lambda: announce_serve(settings, version)))
        return 0
    check_bindable(settings.server.host, settings.server.port)
    tls_context(settings.server)  # a bad certificate is one line here, not one per worker
    announce_serve(settings, version)
    return supervise(settings)


def _worker(settings: Settings) -> None:
    from .logs import configure

    configure(
        settings.server.log_level,
        settings.server.log_format,
        settings.server.log_repeat_limit,
    )
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor forwards SIGTERM instead
    asyncio.run(serve(settings))


def shared_compaction_key(settings: Settings) -> Settings:
    """`settings` with a `compaction.key` every worker shares: the configured one, else one
    made here, once, and handed to each worker (a restarted one too) with its settings. A
    compaction item sealed by one worker then opens on every other; it still does not open
    after the supervisor restarts, nor on another replica, without a configured key."""
    c = settings.compaction
    if not c.enabled or c.key:
        return settings
    log.warning(
        "compaction.key is not set: the %d workers share a key made at start-up, so a "
        "conversation compacted now cannot continue after a restart or on another replica; "
        "set compaction.key (docs/deployment.md) to keep them working",
        settings.server.workers,
    )
    key = encode_key(new_key())
    return dataclasses.replace(settings, compaction=dataclasses.replace(c, key=key))


def supervise(settings: Settings) -> int:
    """Start the workers, each listening with SO_REUSEPORT; restart one that dies (at most
    once a second); on SIGTERM or SIGINT pass SIGTERM on, so each drains, and wait for all.
    Exit 0 when every worker exited 0 after the signal."""
    count = settings.server.workers
    child = dataclasses.replace(
        shared_compaction_key(settings),
        server=dataclasses.replace(settings.server, workers=1, reuse_port=True),
    )
    spawn = multiprocessing.get_context("spawn")
    stopping = False
    forwarded = False
    workers: list[BaseProcess] = []

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True
        if forwarded:  # a second signal: pass it on, so each worker cuts its grace short
            for w in workers:
                if w.is_alive():
                    w.terminate()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)

    def start() -> BaseProcess:
        proc = spawn.Process(target=_worker, args=(child,), name="wsmode-worker", daemon=False)
        proc.start()
        return proc

    workers += [start() for _ in range(count)]
    log.info("supervising %d workers: %s", count, ", ".join(str(w.pid) for w in workers))
    last_restart = 0.0
    while not stopping:
        wait([w.sentinel for w in workers], timeout=0.5)
        for i, w in enumerate(workers):
            if w.is_alive() or stopping:
                continue
            log.error("worker %s exited with %s; starting another", w.pid, w.exitcode)
            time.sleep(max(0.0, 1.0 - (time.monotonic() - last_restart)))
            last_restart = time.monotonic()
            workers[i] = start()
    for w in workers:
        if w.is_alive() and w.pid is not None:
            w.terminate()  # SIGTERM: the worker drains
    forwarded = True
    codes = []
    for w in workers:
        w.join()
        codes.append(w.exitcode)
    log.info("workers exited: %s", codes)
    return 0 if all(c == 0 for c in codes) else 1

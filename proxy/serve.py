"""Running the proxy as a process: listen, and on SIGTERM (or SIGINT) drain, then exit 0.

Drain, in order: `/healthz` answers 503 `draining` and every new request but /healthz and
/metrics gets 503 (the listener stays open so load balancers can see it); each WebSocket
refuses new creates and closes with 1001 as soon as it has nothing in flight; at the end of
`server.drain_grace_seconds` whatever is still running is cut and its socket closed with 1001.
A cut response ends with `response.failed` and an `error` (503 `server_shutting_down`);
`POST /v1/responses` is waited for and cut the same way. Then the listener closes and the
process exits 0. A second signal cuts the grace short.

Descriptors: `server.max_connections` is first fitted to the descriptor limit
(`ops/descriptors.py`); the listener's accept loop pauses when descriptors run out anyway
(`ops/listener.py`); a connection that does not send a complete request head within
`server.header_timeout` is closed (aiohttp's keep-alive timer, which also runs before the
first request).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import multiprocessing
import signal
import time
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess

from aiohttp import web

from .app import HANDLER_CANCELLATION, create_app
from .config import Settings
from .ops import descriptors
from .ops.listener import Listener
from .ops.middleware import OPS

log = logging.getLogger("wsmode")

# After the grace: time for the 1001 closing handshakes and the last HTTP responses.
_CLOSE_MARGIN = 5.0
_AIOHTTP_KEEPALIVE = 3630.0  # aiohttp's own default, for server.header_timeout = 0


async def serve(settings: Settings) -> None:
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
    try:
        site = Listener(
            runner,
            settings.server.host,
            settings.server.port,
            reuse_port=settings.server.reuse_port,
        )
        await site.start()
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


def run(settings: Settings) -> int:
    """Serve in this process, or supervise `server.workers` processes sharing the port."""
    if settings.server.workers <= 1:
        asyncio.run(serve(settings))
        return 0
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


def supervise(settings: Settings) -> int:
    """Start the workers, each listening with SO_REUSEPORT; restart one that dies (at most
    once a second); on SIGTERM or SIGINT pass SIGTERM on, so each drains, and wait for all.
    Exit 0 when every worker exited 0 after the signal."""
    count = settings.server.workers
    child = dataclasses.replace(
        settings, server=dataclasses.replace(settings.server, workers=1, reuse_port=True)
    )
    spawn = multiprocessing.get_context("spawn")
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)

    def start() -> BaseProcess:
        proc = spawn.Process(target=_worker, args=(child,), name="wsmode-worker", daemon=False)
        proc.start()
        return proc

    workers = [start() for _ in range(count)]
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
    codes = []
    for w in workers:
        w.join()
        codes.append(w.exitcode)
    log.info("workers exited: %s", codes)
    return 0 if all(c == 0 for c in codes) else 1

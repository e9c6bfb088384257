"""Running the proxy as a process: listen, and on SIGTERM (or SIGINT) drain, then exit 0.

Drain, in order: `/healthz` answers 503 `draining` and every new request but /healthz and
/metrics gets 503 (the listener stays open so load balancers can see it); each WebSocket
refuses new creates and closes with 1001 as soon as it has nothing in flight; at the end of
`server.drain_grace_seconds` whatever is still running is cut and its socket closed with 1001.
Then the listener closes and the process exits 0. A second signal cuts the grace short.
"""

from __future__ import annotations

import asyncio
import logging
import signal

from aiohttp import web

from proxy.app import create_app
from proxy.config import Settings
from proxy.ops import OPS

log = logging.getLogger("wsmode")

# After the grace: time for the 1001 closing handshakes and the last HTTP responses.
_CLOSE_MARGIN = 5.0


async def serve(settings: Settings) -> None:
    app = create_app(settings)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=_CLOSE_MARGIN)
    await runner.setup()
    try:
        site = web.TCPSite(runner, settings.server.host, settings.server.port)
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

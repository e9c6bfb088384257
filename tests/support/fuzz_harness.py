"""A proxy and an upstream served on a background event loop, for hypothesis examples.

Hypothesis drives synchronous test functions, so the servers live on their own loops in
threads for the whole module (the proxy and the upstream on separate loops, so the proxy's
loop holds only the proxy's tasks) and each example runs its clients with `asyncio.run` over
real sockets. `Stack.on_server` runs a coroutine on the proxy's loop to inspect its state.

The upstream is the simulated model, plus a middleware: a request whose metadata carries
`fuzz` gets the bytes the current example chose, cut into the chosen chunks, instead of the
model's stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from aiohttp import web
from aiohttp.typedefs import Handler
from wsmode.app import create_app
from wsmode.config import load_settings
from wsmode.core import wire
from wsmode.ops.middleware import OPS
from wsmode.runtime import APP_STATE
from wsmode.sim.app import SIM_STATE, create_sim_app

from tests.support.helpers import FAST_SIM, Served, serve, until

T = TypeVar("T")


@dataclass
class Script:
    chunks: list[bytes] = field(default_factory=list)
    status: int = 200


@dataclass
class Stack:
    loop: asyncio.AbstractEventLoop
    thread: threading.Thread
    sim_loop: asyncio.AbstractEventLoop
    sim_thread: threading.Thread
    sim: Served
    proxy: Served
    script: Script
    rest: dict[str, int] | None = None  # the idle server's snapshot, taken once

    @property
    def ws(self) -> str:
        return f"ws://127.0.0.1:{self.proxy.port}/v1/responses"

    def on_server(self, coro: Coroutine[Any, Any, T], timeout: float = 30) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def snapshot(self) -> dict[str, int]:
        """What must return to its baseline after every example."""
        app = self.proxy.runner.app
        ops, state = app[OPS], app[APP_STATE]
        return {
            "tasks": len(asyncio.all_tasks()),
            "connections": len(ops.connections),
            "upstream_active": state.pool.active,
            "upstream_waiting": state.pool.waiting,
            "sim_active": self.sim.runner.app[SIM_STATE].active,
            "cache_entries": state.cache_budget.entries,
        }

    async def at_rest(self) -> dict[str, int]:
        """The idle server's snapshot, once what the previous example left winding down
        (a closing connection's handler) has ended: every example starts from it."""
        if self.rest is None:
            self.rest = await self.snapshot()
        return await self.settled(self.rest)

    async def settled(self, baseline: dict[str, int], timeout: float = 3) -> dict[str, int]:
        """The snapshot once it is back at `baseline`, or after `timeout` whatever it is (the
        caller compares, so hypothesis reports the difference)."""

        async def back() -> bool:
            return await self.snapshot() == baseline

        with contextlib.suppress(AssertionError):
            await until(back, timeout)
        snap = await self.snapshot()
        if snap != baseline:  # name what is left, for the failure message
            snap["leftover"] = [repr(t.get_coro())[:200] for t in asyncio.all_tasks()]  # type: ignore[assignment]
        return snap

    def stop(self) -> None:
        self.on_server(self.proxy.runner.cleanup())
        asyncio.run_coroutine_threadsafe(self.sim.runner.cleanup(), self.sim_loop).result(30)
        for loop, thread in ((self.loop, self.thread), (self.sim_loop, self.sim_thread)):
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
            if not thread.is_alive():  # stopped: close it, or its self-pipe outlives the test
                loop.close()


def _loop() -> tuple[asyncio.AbstractEventLoop, threading.Thread]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    return loop, thread


def start_stack(**overrides: Any) -> Stack:
    loop, thread = _loop()
    sim_loop, sim_thread = _loop()
    script = Script()

    @web.middleware
    async def scripted(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method == "POST" and request.path == "/v1/responses":
            body = wire.loads(await request.read())
            meta = body.get("metadata") if isinstance(body, dict) else None
            if isinstance(meta, dict) and meta.get("fuzz"):
                resp = web.StreamResponse(
                    status=script.status, headers={"Content-Type": "text/event-stream"}
                )
                await resp.prepare(request)
                for chunk in script.chunks:
                    await resp.write(chunk)
                await resp.write_eof()
                return resp
        return await handler(request)

    async def sim_up() -> Served:
        sim_app = create_sim_app(replace(FAST_SIM))
        sim_app.middlewares.append(scripted)
        return await serve(sim_app, handler_cancellation=True)

    async def proxy_up(sim: Served) -> Served:
        # no active health checks (docs/pool.md): each round's short-lived tasks would be
        # counted by the leak check below
        flat = {
            "upstream.url": f"{sim.base}/v1",
            "upstream.read_timeout": 5.0,
            "upstream.health_interval": 0,
        }
        flat.update({k.replace("__", "."): v for k, v in overrides.items()})
        return await serve(create_app(load_settings(None, {}, flat)))

    sim = asyncio.run_coroutine_threadsafe(sim_up(), sim_loop).result(30)
    proxy = asyncio.run_coroutine_threadsafe(proxy_up(sim), loop).result(30)
    return Stack(loop, thread, sim_loop, sim_thread, sim, proxy, script)

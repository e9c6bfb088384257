"""What the tests share: the scaled time unit, servers on 127.0.0.1, WebSocket and HTTP
clients, `wsmode` subprocesses, /metrics scraping, and `until(...)` for waiting.

Test files import from here (or from the other helper modules of `tests.support`:
`chat_streams`, `event_checks`, `items`, `session`, ...), never from one another, so a test
module can be renamed, split or deleted without breaking others; `tests/conftest.py` holds
only the fixtures.

Time has one unit, `seconds(n)`, scaled by TEST_TIME_SCALE on slow machines. It bounds how
long a broken test waits (a timeout, a poll's deadline) and stretches the waits that are part
of the behaviour under test (past an idle timeout); it never asserts speed.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp
import orjson
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families
from websockets.asyncio.client import ClientConnection
from wsmode.config import Settings, load_settings
from wsmode.core.sse import SSEDecoder
from wsmode.runtime import AppState
from wsmode.sidecar.app import SidecarState
from wsmode.sim.app import SimState
from wsmode.sim.settings import SimSettings

T = TypeVar("T")

TIME_SCALE = float(os.environ.get("TEST_TIME_SCALE", "1"))
TERMINAL = {"response.completed", "response.failed", "response.incomplete", "error"}


def seconds(n: float) -> float:
    """`n` seconds on this machine: the one time unit of the suite. A sleep that is part of
    the behaviour under test (past an idle timeout) is `asyncio.sleep(seconds(n))`; waiting
    *for* something is `until(...)`."""
    return n * TIME_SCALE


# ------------------------------------------------------------------ waiting

POLL = 0.01  # unscaled: how often `until` looks; the deadline is what scales


async def until(
    check: Callable[[], T | Awaitable[T]],
    timeout: float = 10,
    *,
    every: float = POLL,
    ignore: tuple[type[BaseException], ...] = (),
    message: str = "the condition never held",
) -> T:
    """Poll `check` (sync or async) until it returns something truthy, and return that.

    Fails with AssertionError after `seconds(timeout)`; exceptions in `ignore` count as "not
    yet" (a server that is still starting refuses connections). Callers keep their own
    `assert` of the condition afterwards when it says more than "it happened".
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds(timeout)
    while True:
        try:
            value = check()
            if inspect.isawaitable(value):
                value = await value
        except ignore:
            value = None
        if value:
            return value  # type: ignore[return-value]
        if loop.time() >= deadline:
            raise AssertionError(f"{message} (waited {seconds(timeout):g} s)")
        await asyncio.sleep(seconds(every))


def until_sync(
    check: Callable[[], T],
    timeout: float = 10,
    *,
    every: float = POLL,
    message: str = "the condition never held",
) -> T:
    """`until` for code outside an event loop (fixtures that start processes, hypothesis)."""
    deadline = time.monotonic() + seconds(timeout)
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"{message} (waited {seconds(timeout):g} s)")
        time.sleep(seconds(every))


# ------------------------------------------------------------------ servers on 127.0.0.1


@dataclass
class Served:
    runner: web.AppRunner
    port: int

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"


async def serve(app: web.Application, *, handler_cancellation: bool = False) -> Served:
    runner = web.AppRunner(app, handler_cancellation=handler_cancellation, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return Served(runner, runner.addresses[0][1])


@dataclass
class Sim:
    served: Served
    state: SimState

    @property
    def url(self) -> str:
        return f"{self.served.base}/v1"

    def bodies(self) -> list[dict[str, Any]]:
        return [r["body"] for r in self.state.requests]


@dataclass
class Proxy:
    served: Served
    state: AppState

    @property
    def http(self) -> str:
        return f"{self.served.base}/v1"

    @property
    def ws(self) -> str:
        return f"ws://127.0.0.1:{self.served.port}/v1/responses"


@dataclass
class Sidecar:
    served: Served
    state: SidecarState

    @property
    def http(self) -> str:
        return f"{self.served.base}/v1"


FAST_SIM = SimSettings(ttft_ms=0, tokens_per_second=0, output_tokens=8, seed=1)


def proxy_settings(upstream: str, **overrides: Any) -> Settings:
    """Settings for a proxy in front of `upstream`; `section__key=value` sets `section.key`."""
    flat = {"upstream.url": upstream, **{k.replace("__", "."): v for k, v in overrides.items()}}
    return load_settings(None, {}, flat)


def sidecar_settings(upstream: str, **overrides: Any) -> Settings:
    """Settings for a sidecar in front of `upstream`; `key=value` sets `sidecar.key`, and
    `section__key=value` sets `section.key` (`telemetry__enabled=True`)."""
    flat = {
        "sidecar.upstream": upstream,
        **{k.replace("__", ".") if "__" in k else f"sidecar.{k}": v for k, v in overrides.items()},
    }
    return load_settings(None, {}, flat)


# ------------------------------------------------------------------ WebSocket clients


async def send(ws: ClientConnection, event: dict[str, Any]) -> None:
    await ws.send(orjson.dumps(event).decode())


async def recv(ws: ClientConnection, timeout: float = 10) -> dict[str, Any]:
    raw = await asyncio.wait_for(ws.recv(), seconds(timeout))
    assert isinstance(raw, str), "the proxy must send text frames only"
    event = orjson.loads(raw)
    assert isinstance(event, dict)
    return event


async def until_terminal(ws: ClientConnection, timeout: float = 10) -> list[dict[str, Any]]:
    """Every event up to and including the first terminal event or error."""
    events: list[dict[str, Any]] = []
    while True:
        ev = await recv(ws, timeout)
        events.append(ev)
        if ev["type"] in TERMINAL:
            return events


def create(**fields: Any) -> dict[str, Any]:
    return {"type": "response.create", "model": "sim", **fields}


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": text}


async def sdk_terminal(conn: Any, timeout: float = 10) -> Any:
    """The next terminal event (or error) from an openai SDK `responses.connect()` connection."""

    async def loop() -> Any:
        async for ev in conn:
            if ev.type in TERMINAL:
                return ev
        raise AssertionError("connection ended before a terminal event")

    return await asyncio.wait_for(loop(), seconds(timeout))


async def sdk_chain(conn: Any, words: tuple[str, ...], **fields: Any) -> list[Any]:
    """On an openai SDK connection, one turn per word, each continuing the last (`fields`
    added to every create); every turn must complete. The response objects, in order."""
    done: list[Any] = []
    previous = None
    for word in words:
        await conn.response.create(
            model="sim",
            input=[{"role": "user", "content": f"please remember {word}"}],
            previous_response_id=previous,
            **fields,
        )
        ev = await sdk_terminal(conn)
        assert ev.type == "response.completed", ev
        done.append(ev.response)
        previous = ev.response.id
    return done


# ------------------------------------------------------------------ HTTP clients


async def post_responses(
    proxy: Proxy, body: dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    """POST /v1/responses over plain HTTP: (status, SSE events) for a stream, else (status,
    the JSON body)."""
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{proxy.http}/responses", json=body, headers=headers) as r,
    ):
        raw = await r.read()
        if r.headers.get("Content-Type", "").startswith("text/event-stream"):
            return r.status, SSEDecoder(1 << 24).feed(raw)
        return r.status, orjson.loads(raw)


Metrics = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def scrape(proxy: Proxy | str) -> Metrics:
    """Every sample on /metrics (of `proxy`, or of the server at the base URL `proxy`),
    keyed by (name, sorted labels); with a key when the proxy has one (a metrics key, else
    a proxy key)."""
    headers: dict[str, str] = {}
    if isinstance(proxy, str):
        base = proxy
    else:
        base = proxy.served.base
        auth = proxy.state.core.settings.auth
        keys = (*auth.metrics_api_keys, *auth.api_keys)
        headers = {"Authorization": f"Bearer {keys[0]}"} if keys else {}
    url = f"{base}/metrics"
    async with aiohttp.ClientSession() as http, http.get(url, headers=headers) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain")
        text = await r.text()
    out: Metrics = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def sample(metrics: dict[Any, float], name: str, **labels: str) -> float:
    return metrics.get((name, tuple(sorted(labels.items()))), 0.0)


async def scrape_until(
    proxy: Proxy, check: Callable[[Metrics], bool], timeout: float = 10
) -> Metrics:
    """/metrics as soon as `check` holds for it (polled with `until`)."""

    async def scraped() -> Metrics | None:
        metrics = await scrape(proxy)
        return metrics if check(metrics) else None

    return await until(scraped, timeout, message="the metrics never matched")


# ------------------------------------------------------------------ the `wsmode` command


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def running(args: list[str], env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[str]]:
    """`python -m wsmode ARGS` as a child process, terminated on the way out."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "wsmode", *args],
        env={**os.environ, **(env or {})},
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=seconds(10))
        if proc.stderr is not None:  # read by `communicate`, or not at all
            proc.stderr.close()


async def wait_healthy(base: str, timeout: float = 10) -> dict[str, object]:
    """/healthz of a server that may still be starting (connection refused until it listens)."""

    async def health() -> dict[str, object]:
        async with aiohttp.ClientSession() as http, http.get(f"{base}/healthz") as r:
            return dict(await r.json())

    return await until(
        health,
        timeout,
        every=0.05,
        ignore=(aiohttp.ClientConnectionError,),
        message="server never became healthy",
    )


# ------------------------------------------------------------------ `wsmode sim` processes


@dataclass
class SimProcess:
    """A `wsmode sim` child process on a port of its own: one replica of a model server.
    It can be stopped, killed and started again on the same port."""

    port: int
    args: tuple[str, ...] = ()
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def name(self) -> str:
        """The replica's name in the proxy's metrics and /readyz (upstream/pool.py)."""
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        assert self.proc is None, "already running"
        fast = ("--ttft-ms", "0", "--tokens-per-second", "0", "--output-tokens", "8")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "wsmode", "sim", "--port", str(self.port), *fast, *self.args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def stop(self, *, kill: bool = False) -> None:
        """Terminate (SIGTERM), or SIGKILL it: a replica that dies without closing."""
        if self.proc is None:
            return
        if kill:
            self.proc.kill()
        else:
            self.proc.terminate()
        self.proc.wait(timeout=seconds(10))
        self.proc = None

    async def stats(self) -> dict[str, Any]:
        """The sim's own counters (`GET /sim/stats`): `started` counts model streams."""
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://127.0.0.1:{self.port}/sim/stats") as r,
        ):
            return dict(await r.json())

    async def ready(self) -> None:
        """Until it answers (a Python process starting on a loaded machine takes a while)."""

        async def answers() -> bool:
            return bool(await self.stats())

        await until(
            answers,
            30,
            every=0.05,
            ignore=(aiohttp.ClientConnectionError,),
            message=f"sim on port {self.port} never answered",
        )


@contextmanager
def sim_processes(n: int, *args: str) -> Iterator[list[SimProcess]]:
    """`n` `wsmode sim` processes (fast: no time to first token, no pacing), stopped after."""
    sims = [SimProcess(free_port(), args) for _ in range(n)]
    try:
        for s in sims:
            s.start()
        yield sims
    finally:
        for s in sims:
            s.stop()


async def streams_started(sims: list[SimProcess]) -> list[int]:
    """How many model streams each sim has started (its own count)."""
    return [int((await s.stats())["started"]) for s in sims]

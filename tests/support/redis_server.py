"""A real `redis-server` (Debian's package; .ci/run installs it) for the shared-store tests:
started on a free loopback port without persistence, stopped on the way out. The
`redis_server` fixture (conftest.py) runs one per session and flushes it between tests; a
test that stops Redis mid-conversation starts one of its own (`redis_server_process`).
Without the binary the tests skip, unless REQUIRE_REDIS_SERVER is set (CI), when they fail.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, NoReturn

import pytest
import redis

from tests.support.helpers import free_port, running, seconds, until_sync

BINARY = shutil.which("redis-server") or "/usr/bin/redis-server"
_NO_PERSISTENCE = ("--save", "", "--appendonly", "no", "--protected-mode", "no")


def _missing() -> NoReturn:
    message = f"{BINARY} is not installed (apt-get install redis-server; .ci/run does)"
    if os.environ.get("REQUIRE_REDIS_SERVER"):
        pytest.fail(message)
    pytest.skip(message)


@dataclass
class RedisServer:
    port: int
    args: tuple[str, ...] = ()  # more of redis-server's arguments (`--maxmemory 4mb`)
    proc: subprocess.Popen[bytes] | None = None
    client: redis.Redis = field(init=False)

    def __post_init__(self) -> None:
        self.client = redis.Redis(port=self.port, socket_timeout=seconds(5))

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start (or restart, on the same port) and wait until it answers."""
        self.proc = subprocess.Popen(
            [BINARY, "--port", str(self.port), "--bind", "127.0.0.1", *_NO_PERSISTENCE, *self.args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        until_sync(self.answers, every=0.05, message="redis-server never answered")

    def answers(self) -> bool:
        try:
            return bool(self.client.ping())
        except redis.ConnectionError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=seconds(10))
        self.client.connection_pool.disconnect()

    def pause(self) -> None:
        """Redis stops answering without closing anything: a slow or hung server."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def reset(self) -> None:
        """Empty, and its command statistics at zero: what each test starts from."""
        self.client.flushall()
        self.client.config_resetstat()

    def stored_keys(self) -> list[bytes]:
        return list(self.client.scan_iter(count=1000))


@contextmanager
def redis_server_process(*args: str) -> Iterator[RedisServer]:
    """A redis-server of its own, with `args` added to its command line."""
    if not os.path.exists(BINARY):
        _missing()
    server = RedisServer(free_port(), args)
    server.start()
    try:
        yield server
    finally:
        if server.proc is not None and server.proc.poll() is None:
            server.resume()  # a paused server cannot stop
        server.stop()


_STOP = "wsmode-tests-monitor-stop"


@contextmanager
def monitored(server: RedisServer) -> Iterator[list[dict[str, Any]]]:
    """Every command clients send to `server` while the block runs (Redis MONITOR), in the
    order it ran them; the commands a Lua script runs are marked `client_type: lua`."""
    seen: list[dict[str, Any]] = []
    watcher = redis.Redis(port=server.port)
    ready = threading.Event()

    def watch() -> None:
        with watcher.monitor() as m:
            ready.set()
            for command in m.listen():
                if command["command"] == f"ECHO {_STOP}":
                    return
                seen.append(command)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    assert ready.wait(seconds(5))
    try:
        yield seen
    finally:
        server.client.echo(_STOP)
        thread.join(seconds(5))
        watcher.close()


def _healthz(base: str) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"{base}/healthz", timeout=5) as r:
            doc: dict[str, Any] = json.loads(r.read())
            return doc
    except urllib.error.HTTPError as err:  # answered, but not 200: not ready yet
        err.close()
        return None
    except OSError:
        return None


def start_replica(
    stack: contextlib.ExitStack, redis_url: str, upstream: str | None = None, **env: str
) -> str:
    """`wsmode serve` with `store.backend = "redis"` in front of `upstream` (a `/v1` URL), or
    of its own `wsmode sim`, as child processes; the replica's base URL once it answers
    /healthz."""
    port = free_port()
    if upstream is None:
        sim_port = free_port()
        stack.enter_context(running(["sim", "--port", str(sim_port), "--ttft-ms", "0"]))
        sim_base = f"http://127.0.0.1:{sim_port}"
        until_sync(lambda: _healthz(sim_base), 30, every=0.05, message="the sim never started")
        upstream = f"{sim_base}/v1"
    store = {"WSMODE_STORE_BACKEND": "redis", "WSMODE_STORE_REDIS_URL": redis_url}
    args = ["serve", "--port", str(port), "--upstream", upstream, "--log-level", "WARNING"]
    stack.enter_context(running(args, {**store, **env}))
    base = f"http://127.0.0.1:{port}"
    until_sync(lambda: _healthz(base), 30, every=0.05, message="the replica never started")
    return base

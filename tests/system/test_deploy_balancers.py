"""The reference HAProxy, nginx and Caddy configs of deploy/, run for real in front of two
wsmode replicas on 127.0.0.1: only their listen and server addresses are changed (and, for
Caddy, its admin endpoint turned off and its state kept in the test's folder). WebSocket mode
(the openai SDK), streamed HTTP, and a replica that drains, through each balancer (the drain
through HAProxy and nginx, which retry a refused upgrade on the other replica).

A balancer that is not installed is skipped, except in CI: .ci/run installs them and sets
REQUIRE_DEPLOY_BALANCERS, and a missing one fails there."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from wsmode.core.sse import SSEDecoder
from wsmode.ops.middleware import OPS
from yarl import URL

from tests.support.deploy_files import CADDYFILE, HAPROXY_CFG, NGINX_CONF
from tests.support.helpers import (
    Proxy,
    Sim,
    free_port,
    sample,
    scrape,
    sdk_terminal,
    seconds,
    until,
)

Replicas = list[Proxy]
REQUIRE = "REQUIRE_DEPLOY_BALANCERS"  # CI: a balancer missing is a failure


@pytest.fixture
async def replicas(sim: Sim, proxy_factory: Callable[..., Awaitable[Proxy]]) -> Replicas:
    return [await proxy_factory(sim.url) for _ in range(2)]


def with_local_addresses(text: str, listen: str, servers: list[str], port: int) -> str:
    """The config with its listen address and its server addresses on 127.0.0.1: the first
    `server` lines get the replicas' ports, the others are left out."""
    ports = iter(servers)
    out: list[str] = []
    for line in text.splitlines():
        words = line.split()
        if words[:1] == ["server"] and re.search(r"\d+\.\d+\.\d+\.\d+:\d+", line):
            address = next(ports, None)
            if address is None:
                continue
            line = re.sub(r"\d+\.\d+\.\d+\.\d+:\d+", address, line)
        elif words[:1] == [listen]:
            line = re.sub(r"\S*\d+(;?)$", rf"127.0.0.1:{port}\1", line)
        out.append(line)
    assert next(ports, None) is None, "the config has fewer servers than the test replicas"
    return "\n".join(out) + "\n"


@contextmanager
def process(
    args: list[str], log: Path, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    if shutil.which(args[0]) is None:
        pytest.fail(f"{args[0]} is missing and {REQUIRE} is set (.ci/run installs it)")
    with log.open("wb") as out:
        proc = subprocess.Popen(
            args, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
        try:
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=seconds(10))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise


async def answering(base: str) -> bool:
    async with aiohttp.ClientSession() as http, http.get(f"{base}/healthz") as r:
        return r.status == 200


@asynccontextmanager
async def haproxy(replicas: Replicas, tmp_path: Path) -> AsyncIterator[str]:
    port = free_port()
    text = with_local_addresses(
        HAPROXY_CFG.read_text(), "bind", [f"127.0.0.1:{r.served.port}" for r in replicas], port
    )
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(text)
    with process(["haproxy", "-db", "-f", str(cfg)], tmp_path / "haproxy.log"):
        base = f"http://127.0.0.1:{port}"
        await until(lambda: answering(base), ignore=(aiohttp.ClientConnectionError,))
        yield base


@asynccontextmanager
async def nginx(replicas: Replicas, tmp_path: Path) -> AsyncIterator[str]:
    port = free_port()
    conf = tmp_path / "wsmode.conf"
    conf.write_text(
        with_local_addresses(
            NGINX_CONF.read_text(), "listen", [f"127.0.0.1:{r.served.port}" for r in replicas], port
        )
    )
    main = tmp_path / "nginx.conf"
    main.write_text(
        "daemon off;\nworker_processes 1;\n"
        f"pid {tmp_path}/nginx.pid;\n"
        "events { worker_connections 256; }\n"
        f"http {{\n    access_log off;\n    include {conf};\n}}\n"
    )
    args = ["nginx", "-p", str(tmp_path), "-e", "stderr", "-c", str(main)]
    with process(args, tmp_path / "nginx.log"):
        base = f"http://127.0.0.1:{port}"
        await until(lambda: answering(base), ignore=(aiohttp.ClientConnectionError,))
        yield base


def caddy_config(text: str, servers: list[str], port: int) -> str:
    """The Caddyfile on 127.0.0.1: its site address on `port`, its upstreams the replicas,
    no admin endpoint (its default port may be taken by another Caddy)"""
    # and a stop that waits at most a second for the streams still open
    text = text.replace(
        "\tauto_https off\n", "\tauto_https off\n\tadmin off\n\tgrace_period 1s\n", 1
    )
    text, sites = re.subn(r"(?m)^:\d+ \{", f"http://127.0.0.1:{port} {{", text)
    assert sites == 1, "the Caddyfile has one site"
    text, proxies = re.subn(
        r"(?m)^(\s*reverse_proxy)( \d+\.\d+\.\d+\.\d+:\d+)+ \{",
        lambda m: f"{m.group(1)} {' '.join(servers)} {{",
        text,
    )
    assert proxies == 1, "the Caddyfile has one reverse_proxy"
    return text


@asynccontextmanager
async def caddy(replicas: Replicas, tmp_path: Path) -> AsyncIterator[str]:
    port = free_port()
    servers = [f"127.0.0.1:{r.served.port}" for r in replicas]
    cfg = tmp_path / "Caddyfile"
    cfg.write_text(caddy_config(CADDYFILE.read_text(), servers, port))
    args = ["caddy", "run", "--config", str(cfg), "--adapter", "caddyfile"]
    env = {"HOME": str(tmp_path), "XDG_DATA_HOME": str(tmp_path / "data")}
    env["XDG_CONFIG_HOME"] = str(tmp_path / "config")
    with process(args, tmp_path / "caddy.log", env):
        base = f"http://127.0.0.1:{port}"
        await until(lambda: answering(base), ignore=(aiohttp.ClientConnectionError,))
        yield base


def installed(tool: str) -> pytest.MarkDecorator:
    """Skip without `tool`, unless REQUIRE_DEPLOY_BALANCERS is set (CI): then the test runs
    and `process` fails it."""
    missing = shutil.which(tool) is None and not os.environ.get(REQUIRE)
    return pytest.mark.skipif(missing, reason=f"{tool} is not installed (apt-get install {tool})")


BALANCERS = [
    pytest.param(haproxy, marks=installed("haproxy"), id="haproxy"),
    pytest.param(nginx, marks=installed("nginx"), id="nginx"),
]
# Caddy carries WebSocket mode and streams like the others; it does not retry a refused
# upgrade (its active health check takes a draining replica out within `health_interval`)
EVERY_BALANCER = [*BALANCERS, pytest.param(caddy, marks=installed("caddy"), id="caddy")]
Balancer = Callable[[Replicas, Path], Any]


async def conversation(client: Any) -> str:
    """Two chained turns on one socket: the second response's text."""
    async with client.responses.connect() as conn:
        await conn.response.create(model="sim", input="hello", store=False)
        first = await sdk_terminal(conn)
        assert first.type == "response.completed", first
        await conn.response.create(
            model="sim", input="and then?", previous_response_id=first.response.id, store=False
        )
        second = await sdk_terminal(conn)
    assert second.type == "response.completed", second
    assert second.response.previous_response_id == first.response.id
    return str(second.response.output_text)


@pytest.mark.parametrize("balancer", EVERY_BALANCER)
async def test_websocket_mode_through_the_balancer(
    balancer: Balancer,
    replicas: Replicas,
    sim: Sim,
    openai_client: Callable[..., Any],
    tmp_path: Path,
) -> None:
    async with balancer(replicas, tmp_path) as base:
        text = await conversation(openai_client(f"{base}/v1", api_key="sk-test"))
    assert text
    # the second turn was rebuilt from the connection cache, which is per process: the socket
    # stayed on one replica
    assert sim.bodies()[-1]["input"][0]["content"] == "hello"


@pytest.mark.parametrize("balancer", EVERY_BALANCER)
async def test_streamed_http_through_the_balancer(
    balancer: Balancer, replicas: Replicas, tmp_path: Path
) -> None:
    async with balancer(replicas, tmp_path) as base, aiohttp.ClientSession() as http:
        body = {"model": "sim", "input": "hi", "stream": True}
        async with http.post(f"{base}/v1/responses", json=body) as r:
            assert r.status == 200
            assert r.headers["Content-Type"].startswith("text/event-stream")
            events = SSEDecoder(1 << 24).feed(await r.read())
        assert events[0].event == "response.created"
        assert events[-1].event == "response.completed"
        async with http.get(f"{base}/metrics") as r:
            assert r.status == 404  # kept for the internal scraper
        for spelling in ("/%6detrics", "/metric%73", "/%6D%65trics"):  # any spelling of it
            async with http.get(URL(base + spelling, encoded=True)) as r:
                assert r.status == 404, spelling
                assert "wsmode_" not in await r.text(), spelling
        async with http.get(f"{base}/healthz") as r:
            assert r.status == 200


@pytest.mark.parametrize("balancer", EVERY_BALANCER)
async def test_events_pass_the_balancer_as_they_come(
    balancer: Balancer, replicas: Replicas, sim: Sim, tmp_path: Path
) -> None:
    """The model goes silent after a few events and the stream stays open: the client has
    the first ones already, as a client reading a long generation sees its start."""
    body = {"model": "sim", "input": "hi", "stream": True, "metadata": {"sim_fault": "stall:3"}}
    async with (
        balancer(replicas, tmp_path) as base,
        aiohttp.ClientSession() as http,
        http.post(f"{base}/v1/responses", json=body) as r,
    ):
        assert r.status == 200
        first = await asyncio.wait_for(r.content.readuntil(b"\n\n"), seconds(10))
        assert SSEDecoder(1 << 24).feed(first)[0].event == "response.created"
        assert sim.state.completed == 0  # the answer is still being written


@pytest.mark.parametrize("balancer", BALANCERS)
async def test_a_draining_replica_gets_no_new_socket(
    balancer: Balancer,
    replicas: Replicas,
    openai_client: Callable[..., Any],
    tmp_path: Path,
) -> None:
    """One socket held open on one replica makes the other the least loaded; that one then
    drains. The next socket is offered to it, refused with 503, and retried on the first."""
    async with balancer(replicas, tmp_path) as base:
        client = openai_client(f"{base}/v1", api_key="sk-test")
        async with client.responses.connect() as held:
            await held.response.create(model="sim", input="hold", store=False)
            assert (await sdk_terminal(held)).type == "response.completed"
            ops = [r.served.runner.app[OPS] for r in replicas]
            (idle,) = [o for o in ops if o.ws_open == 0]  # the other holds `held`
            idle.begin_drain()
            await conversation(client)
            # the draining replica refused it, and never held a socket
            (drained,) = [r for r, o in zip(replicas, ops, strict=True) if o is idle]
            m = await scrape(drained)
            assert sample(m, "wsmode_connections_rejected_total", reason="draining") >= 1
            closed = [v for (name, _), v in m.items() if name == "wsmode_connections_total"]
            assert idle.ws_open == 0 and sum(closed) == 0

"""Graceful drain of a real `wsmode serve` process on SIGTERM, with JSON logs."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
from collections.abc import Awaitable, Callable

import aiohttp
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus
from wsmode.core.sse import SSEDecoder
from wsmode.ops.middleware import OPS

from tests.support.helpers import (
    Proxy,
    Sim,
    create,
    free_port,
    recv,
    running,
    seconds,
    send,
    until,
    until_terminal,
    wait_healthy,
)

KEY = "sk-drain-test-key-123456"
AUTH = {"Authorization": f"Bearer {KEY}"}


async def _health(base: str) -> tuple[int, dict[str, object]]:
    async with aiohttp.ClientSession() as http, http.get(f"{base}/healthz") as r:
        return r.status, dict(await r.json())


async def _draining(base: str) -> tuple[int, dict[str, object]] | None:
    """/healthz once it answers 503 (the server got SIGTERM), else None: for `until`."""
    status, doc = await _health(base)
    return (status, doc) if status == 503 else None


async def test_sigterm_drains_then_exits_0(sim_factory: Callable[..., Awaitable[Sim]]) -> None:
    # ~2 s per answer: long enough to be in flight when the signal arrives
    sim = await sim_factory(ttft_ms=0, tokens_per_second=20, output_tokens=40)
    port = free_port()
    env = {
        "WSMODE_SERVER_DRAIN_GRACE_SECONDS": str(seconds(20)),
        "WSMODE_AUTH_API_KEYS": KEY,
    }
    args = ["serve", "--port", str(port), "--upstream", sim.url, "--log-format", "json"]
    with running([*args, "--log-level", "DEBUG"], env) as proc:
        base = f"http://127.0.0.1:{port}"
        await wait_healthy(base)
        url = f"ws://127.0.0.1:{port}/v1/responses"
        async with (
            connect(url, additional_headers=AUTH) as busy,
            connect(url, additional_headers=AUTH) as idle,
        ):
            await send(busy, create(input="long", store=False))
            assert (await recv(busy))["type"] == "response.created"
            proc.send_signal(signal.SIGTERM)
            status, doc = await until(lambda: _draining(base))
            assert status == 503 and doc["status"] == "draining"
            # no new connections
            with pytest.raises(InvalidStatus) as info:
                async with connect(url, additional_headers=AUTH):
                    pass
            assert info.value.response.status_code == 503
            # the idle socket goes at once, with 1001
            with pytest.raises(ConnectionClosed):
                await asyncio.wait_for(idle.recv(), seconds(5))
            assert idle.close_code == 1001
            # the busy one takes no new create, but its response finishes
            await send(busy, create(input="one more"))
            events = await until_terminal(busy, timeout=30)
            drained_error = next(e for e in events if e["type"] == "error")
            assert drained_error["status"] == 503
            assert drained_error["error"]["code"] == "server_draining"
            events += await until_terminal(busy, timeout=30)
            assert events[-1]["type"] == "response.completed"
            with pytest.raises(ConnectionClosed):
                await asyncio.wait_for(busy.recv(), seconds(5))
            assert busy.close_code == 1001
        _, err = await asyncio.to_thread(proc.communicate, timeout=seconds(20))
        assert proc.returncode == 0
    assert sim.state.completed == 1 and sim.state.cancelled == 0
    lines = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    assert lines and all({"ts", "level", "logger", "message"} <= set(doc) for doc in lines)
    messages = " ".join(d["message"] for d in lines)
    assert "draining" in messages and "closed code=1001" in messages
    assert any(d["level"] == "DEBUG" for d in lines)
    assert any(d.get("request_id") for d in lines)
    assert KEY not in err


async def test_grace_over_cuts_in_flight_and_exits_0(
    sim_factory: Callable[..., Awaitable[Sim]],
) -> None:
    sim = await sim_factory(ttft_ms=0, tokens_per_second=0)
    port = free_port()
    env = {"WSMODE_SERVER_DRAIN_GRACE_SECONDS": str(seconds(0.5))}
    with running(["serve", "--port", str(port), "--upstream", sim.url], env) as proc:
        await wait_healthy(f"http://127.0.0.1:{port}")
        async with connect(f"ws://127.0.0.1:{port}/v1/responses") as ws:
            await send(ws, create(input="x", metadata={"sim_fault": "stall:3"}))
            seen = [await recv(ws)]
            proc.send_signal(signal.SIGTERM)
            with pytest.raises(ConnectionClosed):
                while True:
                    seen.append(json.loads(await asyncio.wait_for(ws.recv(), seconds(10))))
            assert ws.close_code == 1001
        # the cut response ended with its terminal event and an error before the close
        failed, error = seen[-2:]
        assert failed["type"] == "response.failed"
        # the API's code on the response object, wsmode's own beside it and in the error
        assert failed["response"]["error"]["code"] == "server_error"
        assert failed["response"]["error"]["wsmode_code"] == "server_shutting_down"
        assert error["type"] == "error" and error["status"] == 503
        assert error["error"]["code"] == "server_shutting_down"
        numbers = [e["sequence_number"] for e in seen]
        assert numbers == list(range(len(seen)))  # nothing lost in between
        await asyncio.to_thread(proc.communicate, timeout=seconds(20))
        assert proc.returncode == 0
    await until(lambda: sim.state.cancelled == 1)  # the stalled upstream request was closed
    assert sim.state.cancelled == 1


async def test_grace_over_cuts_http_responses_with_a_terminal_event(
    sim_factory: Callable[..., Awaitable[Sim]],
) -> None:
    """POST /v1/responses cut by the drain: a stream ends with response.failed and an SSE
    error, a request without stream gets the 503; both upstream requests are closed."""
    sim = await sim_factory(ttft_ms=0, tokens_per_second=0)
    port = free_port()
    env = {"WSMODE_SERVER_DRAIN_GRACE_SECONDS": str(seconds(0.5))}
    url = f"http://127.0.0.1:{port}/v1/responses"
    stalled = {"model": "sim", "input": "x", "metadata": {"sim_fault": "stall:3"}}
    with running(["serve", "--port", str(port), "--upstream", sim.url], env) as proc:
        await wait_healthy(f"http://127.0.0.1:{port}")
        async with aiohttp.ClientSession() as http:
            async with http.post(url, json={**stalled, "stream": True}) as streaming:
                assert streaming.status == 200
                first = await asyncio.wait_for(streaming.content.readuntil(b"\n\n"), seconds(10))
                assert first.startswith(b"event: response.created")
                plain = asyncio.create_task(http.post(url, json=stalled))
                await until(lambda: sim.state.active == 2)
                proc.send_signal(signal.SIGTERM)
                rest = await asyncio.wait_for(streaming.content.read(), seconds(10))
            async with await plain as answer:
                status, doc = answer.status, await answer.json()
        await asyncio.to_thread(proc.communicate, timeout=seconds(20))
        assert proc.returncode == 0
    events = SSEDecoder(1 << 20).feed(first + rest)
    assert [e.event for e in events[-2:]] == ["response.failed", "error"]
    failed, error = (json.loads(e.data) for e in events[-2:])
    assert failed["response"]["error"]["code"] == "server_error"
    assert failed["response"]["error"]["wsmode_code"] == "server_shutting_down"
    assert error["code"] == "server_shutting_down"
    assert [json.loads(e.data)["sequence_number"] for e in events] == list(range(len(events)))
    assert status == 503 and doc["error"]["code"] == "server_shutting_down"
    await until(lambda: sim.state.cancelled == 2)  # both stalled upstream requests were closed
    assert sim.state.cancelled == 2 and sim.state.active == 0


def test_check_config_prints_effective_settings_redacted(tmp_path: object) -> None:
    import os
    import sys
    from pathlib import Path

    path = Path(str(tmp_path)) / "c.toml"
    path.write_text('[server]\nport = 9000\n[auth]\napi_keys = ["sk-file-key-aaaaaaaa"]\n')
    env = {**os.environ, "WSMODE_UPSTREAM_API_KEY": "sk-env-key-bbbbbbbb", "WSMODE_PORT": "9100"}
    out = subprocess.run(
        [sys.executable, "-m", "wsmode", "check-config", "--config", str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=seconds(30),
    )
    assert out.returncode == 0, out.stderr
    assert "port = 9100" in out.stdout and 'api_keys = ["<redacted>"]' in out.stdout
    assert 'api_key = "<redacted>"' in out.stdout
    assert "sk-file-key" not in out.stdout + out.stderr
    assert "sk-env-key" not in out.stdout + out.stderr
    import tomllib

    assert tomllib.loads(out.stdout)["server"]["port"] == 9100  # the output is valid TOML
    bad = subprocess.run(
        [sys.executable, "-m", "wsmode", "check-config"],
        env={**os.environ, "WSMODE_AUTH_API_KEY_HASHES_FILE": str(path)},
        capture_output=True,
        text=True,
        timeout=seconds(30),
    )
    assert bad.returncode == 2 and "expected a SHA-256 hex digest" in bad.stderr


async def test_drain_in_process_metrics(proxy: Proxy) -> None:
    from tests.support.helpers import sample, scrape

    ops = proxy.served.runner.app[OPS]
    async with connect(proxy.ws) as ws:
        await send(ws, create(input="x"))
        await until_terminal(ws)
        ops.begin_drain()
        with pytest.raises(ConnectionClosed):
            await asyncio.wait_for(ws.recv(), seconds(5))
        assert ws.close_code == 1001
    assert await ops.wait_drained(seconds(5))
    status, doc = await _health(proxy.served.base)
    assert status == 503 and doc["status"] == "draining"
    m = await scrape(proxy)
    assert sample(m, "wsmode_connections_total", close_class="going_away") == 1
    assert sample(m, "wsmode_draining") == 1


async def test_a_drain_that_reaches_a_closing_connection_goes_on(proxy: Proxy) -> None:
    """A SIGTERM can fall between a connection's reader ending (its client left, its task
    group finished) and the connection leaving the registry: the drain must pass over it,
    not fail on it (it raised "TaskGroup ... is finished" out of the server's drain)."""
    ops = proxy.served.runner.app[OPS]
    async with connect(proxy.ws) as ws:
        await send(ws, create(input="x"))
        await until_terminal(ws)
        (conn,) = list(ops.connections)
    await until(lambda: not ops.connections)
    ops.connections[conn] = None  # still listed, as in that window
    ops.begin_drain()
    ops.unregister(conn)
    assert await ops.wait_drained(seconds(5))


def test_every_setting_is_a_flag() -> None:
    import os
    import sys

    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "wsmode",
            "check-config",
            "--set",
            "server.max_connections=9",
            "--set",
            "usage.queue_size=3",
        ],
        env={**os.environ, "WSMODE_SERVER_MAX_CONNECTIONS": "5"},
        capture_output=True,
        text=True,
        timeout=seconds(30),
    )
    assert out.returncode == 0, out.stderr
    assert "max_connections = 9" in out.stdout and "queue_size = 3" in out.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "wsmode", "serve", "--set", "server.prot=1"],
        capture_output=True,
        text=True,
        timeout=seconds(30),
    )
    assert bad.returncode == 2 and "unknown config key server.prot" in bad.stderr

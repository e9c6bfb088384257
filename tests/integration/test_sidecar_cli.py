"""`wsmode sidecar` as a user runs it: a real process in front of a real front."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import aiohttp

from tests.support.helpers import Proxy, Sim, free_port, running, seconds, user, wait_healthy


async def test_sidecar_command_serves_http_over_websocket_mode(proxy: Proxy, sim: Sim) -> None:
    port = free_port()
    with running(["sidecar", "--upstream", proxy.http, "--port", str(port)]) as proc:
        health = await wait_healthy(f"http://127.0.0.1:{port}")
        assert health["mode"] == "sidecar" and health["upstream"] == proxy.http
        history = [user("go")]
        async with aiohttp.ClientSession() as http:
            for _ in range(2):
                body = {"model": "sim", "input": history, "store": False}
                async with http.post(f"http://127.0.0.1:{port}/v1/responses", json=body) as r:
                    assert r.status == 200
                    doc = await r.json()
                sent, history = history, [*history, *doc["output"], user("more")]
        assert proxy.state.client_bytes_received > 0  # it went over WebSocket mode
        assert sim.bodies()[1]["input"] == sent
        proc.terminate()
        # waited for in a thread: the front in this loop answers the sidecar's closing
        _, err = await asyncio.to_thread(proc.communicate, timeout=seconds(10))
    assert f"sidecar on http://127.0.0.1:{port}/v1" in err


def test_sidecar_without_upstream_is_a_usage_error() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WSMODE_")}
    out = subprocess.run(
        [sys.executable, "-m", "wsmode", "sidecar"],
        env=env,
        capture_output=True,
        text=True,
        timeout=seconds(30),
    )
    assert out.returncode == 2
    assert "the sidecar needs --upstream" in out.stderr


def test_sidecar_upstream_from_the_environment_is_checked() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "wsmode", "sidecar"],
        env={**os.environ, "WSMODE_SIDECAR_UPSTREAM": "ftp://example.com"},
        capture_output=True,
        text=True,
        timeout=seconds(30),
    )
    assert out.returncode == 2
    assert "sidecar.upstream must start with http:// or https://" in out.stderr

"""Refused proxy auth is logged (rate-limited, never the key), and the sidecar has what
`wsmode serve` has: proxy auth, /metrics, `--set` and `--log-format`."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus
from wsmode.config import load_settings
from wsmode.sidecar.app import create_sidecar_app

from tests.support.helpers import (
    Proxy,
    Served,
    Sim,
    free_port,
    running,
    seconds,
    serve,
    wait_healthy,
)

RIGHT = "sk-right-proxy-key-0123456789"
WRONG = "sk-wrong-proxy-key-9876543210"
UPSTREAM_KEY = "sk-upstream-key-5555555555"


async def test_refused_auth_is_logged_rate_limited_never_the_key() -> None:
    port = free_port()
    args = ["serve", "--port", str(port), "--set", "server.log_repeat_limit=2"]
    env = {"WSMODE_AUTH_API_KEYS": RIGHT, "WSMODE_SIM_TTFT_MS": "0"}
    with running(args, env) as proc:
        base = f"http://127.0.0.1:{port}"
        await wait_healthy(base)
        bad = {"Authorization": f"Bearer {WRONG}"}
        async with aiohttp.ClientSession() as http:
            for _ in range(3):
                async with http.get(f"{base}/v1/models", headers=bad) as r:
                    assert r.status == 401
        for _ in range(2):
            with pytest.raises(InvalidStatus):
                async with connect(f"ws://127.0.0.1:{port}/v1/responses", additional_headers=bad):
                    pass
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.to_thread(proc.communicate, timeout=seconds(20))
    refused = [line for line in err.splitlines() if "missing or incorrect proxy API key" in line]
    assert len(refused) == 2, err  # five refusals, server.log_repeat_limit = 2
    assert all("WARNING" in line and "from 127.0.0.1" in line for line in refused)
    assert "refused GET /v1/{tail} from" in refused[0]  # the route, not the raw path
    assert WRONG not in err and RIGHT not in err


@pytest.fixture
async def guarded_sidecar(proxy: Proxy) -> AsyncIterator[Served]:
    """A sidecar with proxy auth and an upstream key, in front of the proxy (and its sim)."""
    settings = load_settings(
        None,
        {},
        {
            "sidecar.upstream": proxy.http,
            "sidecar.api_key": UPSTREAM_KEY,
            "auth.api_keys": RIGHT,
        },
    )
    served = await serve(create_sidecar_app(settings), handler_cancellation=True)
    yield served
    await served.runner.cleanup()


async def _post(base: str, key: str | None, body: dict[str, Any]) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{base}/v1/responses", json=body, headers=headers) as r,
    ):
        return r.status, await r.json()


async def test_the_sidecar_checks_proxy_auth_and_sends_its_own_key_upstream(
    guarded_sidecar: Served, sim: Sim, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    body = {"model": "sim", "input": "hi", "store": False}
    for key in (None, WRONG):
        status, doc = await _post(guarded_sidecar.base, key, body)
        assert status == 401 and doc["error"]["code"] == "invalid_api_key"
    assert not sim.state.requests  # nothing went upstream
    refused = [r for r in caplog.records if "proxy API key" in r.getMessage()]
    assert len(refused) == 2 and all(r.levelno == logging.WARNING for r in refused)
    status, doc = await _post(guarded_sidecar.base, RIGHT, body)
    assert status == 200 and doc["status"] == "completed"
    # the proxy key is the sidecar's own: the upstream got the configured key instead
    assert sim.state.last_headers["Authorization"] == f"Bearer {UPSTREAM_KEY}"
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert RIGHT not in logged and WRONG not in logged


async def test_the_sidecar_serves_metrics(guarded_sidecar: Served) -> None:
    body = {"model": "sim", "input": "hi", "store": False}
    assert (await _post(guarded_sidecar.base, RIGHT, body))[0] == 200
    assert (await _post(guarded_sidecar.base, None, body))[0] == 401
    url = f"{guarded_sidecar.base}/metrics"
    async with aiohttp.ClientSession() as http:
        async with http.get(url) as r:
            assert r.status == 401  # behind the key, as the proxy's /metrics is
        async with http.get(url, headers={"Authorization": f"Bearer {RIGHT}"}) as r:
            assert r.status == 200
            text = await r.text()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[("wsmode_sidecar_responses_total", (("via", "full"),))] == 1
    assert samples[("wsmode_sidecar_upstream_websockets", ())] == 1
    requests = "wsmode_sidecar_http_requests_total"
    route = (("method", "POST"), ("route", "/v1/responses"))
    assert samples[(requests, (*route, ("status", "200")))] == 1
    assert samples[(requests, (*route, ("status", "401")))] == 1


async def test_sidecar_command_takes_set_and_log_format(proxy: Proxy) -> None:
    port = free_port()
    args = [
        "sidecar",
        "--upstream",
        proxy.http,
        "--port",
        str(port),
        "--log-format",
        "json",
        "--set",
        "server.metrics=false",
    ]
    with running(args) as proc:
        base = f"http://127.0.0.1:{port}"
        await wait_healthy(base)
        async with aiohttp.ClientSession() as http, http.get(f"{base}/metrics") as r:
            assert r.status == 404  # server.metrics = false, set with --set
        proc.send_signal(signal.SIGTERM)
        # waited for in a thread: the front in this loop answers the sidecar's closing
        _, err = await asyncio.to_thread(proc.communicate, timeout=seconds(20))
    docs = [json.loads(line) for line in err.splitlines()]  # every line is JSON
    assert any(f"sidecar on http://127.0.0.1:{port}/v1" in d["message"] for d in docs)

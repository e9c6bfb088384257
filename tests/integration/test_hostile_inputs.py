"""Client input and configuration that reached the wrong code path: JSON nested too deeply,
two `Authorization` headers, and a password in the upstream URL or a compaction key that was
shown to whoever asked."""

from __future__ import annotations

import base64
import json
import logging
import os
import subprocess
import sys
from typing import Any

import aiohttp
import pytest
from multidict import CIMultiDict
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from tests.support.helpers import (
    Proxy,
    Sim,
    create,
    free_port,
    post_responses,
    seconds,
    send,
    until_terminal,
    user,
)


def nest(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


# ------------------------------------------------------------------ 8: nesting


async def test_json_nested_too_deeply_is_invalid_json_and_the_socket_stays_open(
    sim: Sim, proxy: Proxy
) -> None:
    """A message nested 260 deep parses (orjson reads 1,024 levels) but cannot be written
    again (254; the standard library writes it here): it is refused as `invalid_json`
    (400), in an input item or in `metadata`, over WebSocket and HTTP; the socket stays
    open and the next turn works. Nesting well inside the bound (100) is accepted."""
    async with connect(proxy.ws, max_size=None) as ws:
        await ws.send(json.dumps(create(input=[{**user("x"), "extra": nest(260)}])))
        (error,) = await until_terminal(ws)
        assert error["status"] == 400 and error["error"]["code"] == "invalid_json"
        assert error["error"]["param"] == "input" and "128" in error["error"]["message"]
        await ws.send(json.dumps(create(input="x", metadata={"a": nest(260)})))
        (error,) = await until_terminal(ws)
        assert error["status"] == 400 and error["error"]["code"] == "invalid_json"
        assert len(sim.state.requests) == 0  # nothing reached the model
        await send(ws, create(input=[{**user("x"), "extra": nest(100)}]))
        assert (await until_terminal(ws))[-1]["type"] == "response.completed"
    status, body = await post_responses(
        proxy, {"model": "sim", "input": [{**user("x"), "extra": nest(260)}]}
    )
    assert status == 400 and body["error"]["code"] == "invalid_json"
    status, body = await post_responses(proxy, {"model": "sim", "input": "x", "tools": nest(300)})
    assert status == 400 and body["error"]["code"] == "invalid_json"


# ------------------------------------------------------------------ 14: Authorization


@pytest.mark.parametrize("auth", [False, True])
async def test_two_authorization_headers_are_refused(
    sim: Sim, proxy_factory: Any, auth: bool
) -> None:
    """The check would read the first and the upstream be sent the last: a request with
    two is refused with 400 (a WebSocket upgrade too), whether proxy auth is on or off."""
    key = "sk-proxy-key-0123456789"
    proxy = await proxy_factory(sim.url, **({"auth__api_keys": (key,)} if auth else {}))
    two = CIMultiDict([("Authorization", f"Bearer {key}"), ("Authorization", "Bearer sk-other")])
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{proxy.http}/responses", json={"model": "sim", "input": "x"}, headers=two) as r,
    ):
        assert r.status == 400
        assert "more than one Authorization" in (await r.json())["error"]["message"]
    with pytest.raises(InvalidStatus) as refused:
        async with connect(proxy.ws, additional_headers=list(two.items())):
            pass
    assert refused.value.response.status_code == 400
    assert len(sim.state.requests) == 0
    one = {"Authorization": f"Bearer {key}"}
    status, _ = await post_responses(proxy, {"model": "sim", "input": "x"}, headers=one)
    assert status == 200


async def test_the_sidecar_refuses_two_authorization_headers(
    sim: Sim, proxy: Proxy, sidecar_factory: Any
) -> None:
    sidecar = await sidecar_factory(proxy.http)
    two = CIMultiDict([("Authorization", "Bearer sk-a"), ("Authorization", "Bearer sk-b")])
    async with aiohttp.ClientSession() as http:
        for method, path in (("POST", "/responses"), ("GET", "/models")):
            body = {"model": "sim", "input": "x"} if method == "POST" else None
            async with http.request(method, f"{sidecar.http}{path}", json=body, headers=two) as r:
                assert r.status == 400
    assert len(sim.state.requests) == 0


# ------------------------------------------------------------------ 10: redaction


async def test_a_password_in_the_upstream_url_is_never_shown(
    proxy_factory: Any, sidecar_factory: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """`/healthz` (unauthenticated), the client's error message and the log lines show the
    upstream URL with its password replaced by a marker."""
    caplog.set_level(logging.DEBUG)
    port = free_port()  # nothing listens there: the error message names the URL
    url = f"http://bob:hunter2@127.0.0.1:{port}/v1"
    shown = f"http://bob:<redacted>@127.0.0.1:{port}/v1"
    proxy = await proxy_factory(url)
    sidecar = await sidecar_factory(url)
    async with aiohttp.ClientSession() as http:
        for base in (proxy.served.base, sidecar.served.base):
            async with http.get(f"{base}/healthz") as r:
                text = await r.text()
                assert "hunter2" not in text
                assert (await r.json())["upstream"] == shown
    async with connect(proxy.ws) as ws:
        await send(ws, create(input="x"))
        (error,) = await until_terminal(ws)
    assert error["error"]["code"] == "upstream_unavailable"
    assert shown in error["error"]["message"] and "hunter2" not in error["error"]["message"]
    assert not [r for r in caplog.records if "hunter2" in r.getMessage()]


def test_check_config_redacts_url_passwords_and_the_compaction_key() -> None:
    key = base64.b64encode(os.urandom(32)).decode()
    env = {
        **os.environ,
        "WSMODE_UPSTREAM": "http://bob:hunter2@127.0.0.1:9/v1",
        "WSMODE_COMPACTION_KEY": key,
        "WSMODE_SIDECAR_UPSTREAM": "https://ann:swordfish@example.invalid/v1",
    }
    out = subprocess.run(
        [sys.executable, "-m", "wsmode", "check-config"],
        env=env,
        capture_output=True,
        text=True,
        timeout=seconds(30),
    )
    assert out.returncode == 0, out.stderr
    for secret in ("hunter2", "swordfish", key):
        assert secret not in out.stdout + out.stderr
    assert 'url = "http://bob:<redacted>@127.0.0.1:9/v1"' in out.stdout
    assert 'key = "<redacted>"' in out.stdout


async def test_the_sidecar_sends_a_too_deep_request_over_http(
    proxy: Proxy, sidecar_factory: Any
) -> None:
    """The sidecar cannot write a body nested 300 deep as a WebSocket message: it sends it
    over plain HTTP as it came, and the client gets the upstream's own 400."""
    sidecar = await sidecar_factory(proxy.http)
    body = {"model": "sim", "input": [{**user("x"), "extra": nest(300)}]}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{sidecar.http}/responses", data=json.dumps(body)) as r,
    ):
        assert r.status == 400
        assert (await r.json())["error"]["code"] == "invalid_json"

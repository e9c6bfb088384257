"""docs/deployment.md's reverse-proxy snippets, run: the nginx and HAProxy blocks taken from
the page, in front of a real `wsmode serve`, carry a WebSocket-mode conversation (the 101,
two chained turns) and a plain HTTP request. Only the listening address and the paths a
non-root test needs are filled in around them; skipped where the proxy is not installed."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path

import aiohttp
import pytest
from websockets.asyncio.client import connect

from tests.support.helpers import (
    create,
    free_port,
    running,
    seconds,
    send,
    until,
    until_terminal,
    wait_healthy,
)

DOC = (Path(__file__).resolve().parents[2] / "docs" / "deployment.md").read_text()


def _block(language: str) -> str:
    blocks = re.findall(rf"```{language}\n(.*?)```", DOC, re.S)
    assert blocks, f"docs/deployment.md has a {language} block"
    return "\n".join(blocks)


@contextmanager
def _process(args: list[str]) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=seconds(10))
        if proc.stderr is not None:
            proc.stderr.close()


async def _conversation(base: str) -> None:
    """Two chained turns over WebSocket mode and one plain HTTP request, through `base`."""

    async def up() -> bool:
        async with aiohttp.ClientSession() as http, http.get(f"{base}/v1/models") as r:
            return r.status == 200

    await until(up, ignore=(aiohttp.ClientConnectionError,), message="the proxy never served")
    ws_url = base.replace("http://", "ws://") + "/v1/responses"
    async with connect(ws_url) as ws:
        await send(ws, create(input="hi", store=False))
        first = (await until_terminal(ws))[-1]
        assert first["type"] == "response.completed"
        await send(ws, create(input="again", previous_response_id=first["response"]["id"]))
        assert (await until_terminal(ws))[-1]["type"] == "response.completed"


@pytest.fixture
async def wsmode_port() -> AsyncIterator[int]:
    port = free_port()
    with running(["serve", "--port", str(port)], {"WSMODE_SIM_TTFT_MS": "0"}):
        await wait_healthy(f"http://127.0.0.1:{port}")
        yield port


@pytest.mark.skipif(shutil.which("nginx") is None, reason="nginx is not installed")
async def test_the_nginx_snippet_carries_websocket_mode(wsmode_port: int, tmp_path: Path) -> None:
    snippet = _block("nginx")
    assert "proxy_set_header Upgrade $http_upgrade;" in snippet
    snippet = snippet.replace("127.0.0.1:8080", f"127.0.0.1:{wsmode_port}")
    map_block = snippet[snippet.index("map $http_upgrade") :]
    location = snippet[: snippet.index("map $http_upgrade")]
    port = free_port()
    temp = {name: tmp_path / name for name in ("body", "proxy", "fastcgi", "uwsgi", "scgi")}
    for folder in temp.values():
        folder.mkdir()
    conf = tmp_path / "nginx.conf"
    conf.write_text(
        f"""
daemon off;
pid {tmp_path}/nginx.pid;
error_log stderr warn;
events {{}}
http {{
    access_log off;
    client_body_temp_path {temp["body"]};
    proxy_temp_path {temp["proxy"]};
    fastcgi_temp_path {temp["fastcgi"]};
    uwsgi_temp_path {temp["uwsgi"]};
    scgi_temp_path {temp["scgi"]};
    {map_block}
    server {{
        listen 127.0.0.1:{port};
        {location}
    }}
}}
"""
    )
    with _process(["nginx", "-p", str(tmp_path), "-c", str(conf), "-e", "stderr"]):
        await _conversation(f"http://127.0.0.1:{port}")


@pytest.mark.skipif(shutil.which("haproxy") is None, reason="haproxy is not installed")
async def test_the_haproxy_snippet_carries_websocket_mode(wsmode_port: int, tmp_path: Path) -> None:
    snippet = _block("haproxy")
    assert "timeout tunnel  1h" in snippet
    port = free_port()
    conf = tmp_path / "haproxy.cfg"
    conf.write_text(
        snippet.replace(
            "bind :443 ssl crt /etc/haproxy/wsmode.pem", f"bind 127.0.0.1:{port}"
        ).replace("127.0.0.1:8080", f"127.0.0.1:{wsmode_port}")
    )
    with _process(["haproxy", "-db", "-f", str(conf)]):
        await _conversation(f"http://127.0.0.1:{port}")

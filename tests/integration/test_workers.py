"""`server.workers`: several processes on one port, each a whole proxy, drained together."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

import aiohttp
from websockets.asyncio.client import connect

from tests.support.helpers import create, free_port, seconds, send, until_terminal, wait_healthy


async def test_two_workers_share_the_port_and_drain_on_sigterm() -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "wsmode", "serve", "--port", str(port)],
        env={
            **os.environ,
            "WSMODE_SERVER_WORKERS": "2",
            "WSMODE_SIM_TTFT_MS": "0",
            "WSMODE_SERVER_DRAIN_GRACE_SECONDS": "2",
        },
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        await wait_healthy(base)
        pids: set[int] = set()
        for _ in range(200):  # each request on a new connection: the kernel spreads them
            async with aiohttp.ClientSession() as http, http.get(f"{base}/healthz") as r:
                if r.status == 200:
                    pids.add(int((await r.json())["pid"]))
            if len(pids) == 2:
                break
        assert len(pids) == 2, "both workers answer on the shared port"
        assert proc.pid not in pids  # the supervisor itself serves nothing
        for _ in range(4):  # every worker serves WebSocket mode end to end
            async with connect(f"ws://127.0.0.1:{port}/v1/responses") as ws:
                await send(ws, create(input="hi", store=False))
                first = (await until_terminal(ws))[-1]["response"]
                await send(ws, create(input="again", previous_response_id=first["id"]))
                assert (await until_terminal(ws))[-1]["type"] == "response.completed"
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.to_thread(proc.communicate, timeout=seconds(30))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "supervising 2 workers" in err and "workers exited: [0, 0]" in err

"""`server.workers`: several processes on one port, each a whole proxy, drained together."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
from websockets.asyncio.client import ClientConnection, connect

from tests.support.helpers import (
    create,
    free_port,
    seconds,
    send,
    until,
    until_terminal,
    user,
    wait_healthy,
)


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


TRIGGER = {"type": "compaction_trigger"}


def fact(i: int) -> str:
    return f"fact-{i} the user notes that item {i} matters " + "and more detail " * 35


async def turn(ws: ClientConnection, **fields: Any) -> dict[str, Any]:
    await send(ws, create(store=False, **fields))
    return (await until_terminal(ws))[-1]


def worker_of(log: Path, request_id: str) -> int | None:
    """The pid of the worker whose JSON log says it opened the connection of `request_id`."""
    for line in log.read_text(encoding="utf-8").splitlines():
        if line.startswith("{"):
            doc = json.loads(line)
            if doc.get("request_id") == request_id and " open from " in doc["message"]:
                return int(doc["pid"])
    return None


async def test_workers_share_the_compaction_key_made_at_start(tmp_path: Path) -> None:
    """No `compaction.key`: the supervisor makes one and every worker seals with it, so an
    item compacted through one worker continues through the other."""
    port = free_port()
    log = tmp_path / "serve.log"
    env = {
        **os.environ,
        "WSMODE_SERVER_WORKERS": "2",
        "WSMODE_SIM_TTFT_MS": "0",
        "WSMODE_SERVER_LOG_FORMAT": "json",
        "WSMODE_SERVER_DRAIN_GRACE_SECONDS": "1",
    }
    env.pop("WSMODE_COMPACTION_KEY", None)
    url = f"ws://127.0.0.1:{port}/v1/responses"
    with log.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "wsmode", "serve", "--port", str(port)], env=env, stderr=err
        )
        try:
            await wait_healthy(f"http://127.0.0.1:{port}")
            async with connect(url, additional_headers={"X-Request-Id": "compacts"}) as ws:
                first = await until(lambda: worker_of(log, "compacts"))
                prev: str | None = None
                for i in range(4):
                    fields: dict[str, Any] = {"input": [user(fact(i))]}
                    if prev:
                        fields["previous_response_id"] = prev
                    done = await turn(ws, **fields)
                    assert done["type"] == "response.completed"
                    prev = done["response"]["id"]
                done = await turn(ws, input=[TRIGGER], previous_response_id=prev)
                [item] = done["response"]["output"]
                assert item["type"] == "compaction"
            other = None
            for n in range(60):  # new connections until one lands on the other worker
                rid = f"continues-{n}"
                async with connect(url, additional_headers={"X-Request-Id": rid}) as ws:
                    pid = await until(lambda rid=rid: worker_of(log, rid))
                    if pid == first:
                        continue
                    other = pid
                    done = await turn(ws, input=[user(fact(0)), item, user("what was fact-0?")])
                    break
            assert other is not None, "no connection reached the second worker"
            assert done["type"] == "response.completed", done
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.to_thread(proc.wait, timeout=seconds(30))
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    text = log.read_text(encoding="utf-8")
    assert "workers share a key made at start-up" in text

"""A long `generate: false` chain on one socket against a real `wsmode serve` (docs/memory.md
"Long chains"): the server's RSS beside the memory budget's count of the cache and the
store, every few thousand turns. Starts its own `wsmode sim` and `wsmode serve` (whatever
`wsmode` the running interpreter imports) and stops them after.

    python -m tests.support.long_chain [TURNS] [--store false]
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
import urllib.request
from typing import Any

import orjson
from websockets.asyncio.client import ClientConnection, connect

from tests.support.helpers import free_port, until_sync


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        found = re.search(r"VmRSS:\s+(\d+) kB", f.read())
    assert found is not None
    return int(found.group(1)) / 1024


def _metric(base: str, name: str) -> dict[str, float]:
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(name):
            key, _, value = line.rpartition(" ")
            out[key[len(name) :]] = float(value)
    return out


def _up(base: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/healthz", timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


async def warm_up(
    ws: ClientConnection, turn: int, previous: str | None, *, store: bool = True
) -> dict[str, Any]:
    """One `generate: false` create continuing `previous` (None: the chain's first): its
    terminal event, `response.completed` or an `error`."""
    msg: dict[str, Any] = {
        "type": "response.create",
        "model": "m",
        "generate": False,
        "store": store,
        "input": [{"role": "user", "content": f"warm-up {turn}"}],
    }
    if previous is not None:
        msg["previous_response_id"] = previous
    await ws.send(orjson.dumps(msg).decode())
    while True:
        ev = orjson.loads(await asyncio.wait_for(ws.recv(), 30))
        if ev["type"] in ("response.completed", "error"):
            return dict(ev)
        assert ev["type"] == "response.created", ev


async def _chain(base: str, pid: int, turns: int, store: bool) -> list[dict[str, Any]]:
    rows = []
    url = base.replace("http", "ws") + "/v1/responses"
    previous = None
    t0 = time.perf_counter()
    async with connect(url, max_size=None) as ws:
        for turn in range(1, turns + 1):
            ev = await warm_up(ws, turn, previous, store=store)
            assert ev["type"] == "response.completed", ev
            previous = ev["response"]["id"]
            if turn % 2000 == 0 or turn == turns:
                memory = _metric(base, "wsmode_memory_bytes")
                row = {
                    "turns": turn,
                    "rss_mb": round(_rss_mb(pid), 1),
                    "cache_kb": round(memory.get('{part="cache"}', 0) / 1024),
                    "store_kb": round(memory.get('{part="store"}', 0) / 1024),
                    "seconds": round(time.perf_counter() - t0, 1),
                }
                rows.append(row)
                print(row, flush=True)
    return rows


def main() -> None:
    turns = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 16_000
    store = "--store" not in sys.argv or sys.argv[sys.argv.index("--store") + 1] != "false"
    sim_port, port = free_port(), free_port()
    py = sys.executable
    sim = subprocess.Popen([py, "-m", "wsmode", "sim", "--port", str(sim_port)])
    upstream = f"http://127.0.0.1:{sim_port}/v1"
    args = ["serve", "--port", str(port), "--log-level", "WARNING", "--upstream", upstream]
    serve = subprocess.Popen([py, "-m", "wsmode", *args])
    base = f"http://127.0.0.1:{port}"
    try:
        until_sync(lambda: _up(base), 60, every=0.1, message="wsmode serve never started")
        print({"turns": 0, "rss_mb": round(_rss_mb(serve.pid), 1)}, flush=True)
        asyncio.run(_chain(base, serve.pid, turns, store))
    finally:
        for proc in (serve, sim):
            proc.terminate()
            proc.wait(timeout=30)


if __name__ == "__main__":
    main()

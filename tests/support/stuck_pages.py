"""Console pages that never read, against a real `wsmode serve` (docs/memory.md "Console
pages that never read"): the server's RSS, its sockets and the memory budget's count after
each round of 8 such pages. Starts its own `wsmode sim` and `wsmode serve` (whatever `wsmode`
the running interpreter imports) and stops them after.

A page asks for `GET /console/feed` on a socket with a small receive buffer and never reads
a byte, nor closes it: the server must drop it (the feed falls behind) and let its socket and
buffers go. Before the rounds, 600 turns fill the console's ring (500 events); in each round
the 8 pages open, then turns go on until the feed has dropped every one of them.

    python -m tests.support.stuck_pages [ROUNDS] [--show-content]
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time

import aiohttp

from tests.support.helpers import free_port, seconds, until_sync
from tests.support.long_chain import _metric, _rss_mb, _up

PAGES = 8
PADDING = "lorem ipsum " * 200  # input text the console shows with console.show_content


def sockets_of(pid: int) -> int:
    """The sockets process `pid` holds open now (its descriptors in /proc)."""
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            count += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
        except FileNotFoundError:
            continue  # closed while we looked
    return count


def stuck_page(port: int) -> socket.socket:
    """A console page that asks for the feed and never reads a byte of it."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall(f"GET /console/feed HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
    return sock


async def turns(base: str, n: int, parallel: int = 4) -> None:
    """`n` turns over POST /v1/responses, `parallel` at a time; the client's connections
    closed after."""
    body = {"model": "sim", "input": PADDING, "store": False}
    gate = asyncio.Semaphore(parallel)
    async with aiohttp.ClientSession() as http:

        async def one() -> None:
            async with gate, http.post(f"{base}/v1/responses", json=body) as r:
                assert r.status == 200, await r.text()
                await r.read()

        await asyncio.gather(*(one() for _ in range(n)))


def _budget(base: str) -> float:
    """What the memory budget counts, every part together (`wsmode_memory_bytes`)."""
    return sum(_metric(base, "wsmode_memory_bytes").values())


def run(rounds: int, show_content: bool) -> list[dict[str, float]]:
    sim_port, port = free_port(), free_port()
    py = sys.executable
    sim = subprocess.Popen([py, "-m", "wsmode", "sim", "--port", str(sim_port)])
    env = {
        **os.environ,
        "WSMODE_CONSOLE_SHOW_CONTENT": "true" if show_content else "false",
        "WSMODE_SIM_TTFT_MS": "0",
    }
    args = ["serve", "--port", str(port), "--log-level", "ERROR"]
    args += ["--upstream", f"http://127.0.0.1:{sim_port}/v1"]
    serve = subprocess.Popen([py, "-m", "wsmode", *args], env=env)
    base = f"http://127.0.0.1:{port}"
    rows: list[dict[str, float]] = []
    held: list[socket.socket] = []
    try:
        until_sync(lambda: _up(base), 60, every=0.1, message="wsmode serve never started")
        asyncio.run(turns(base, 600))  # the ring (500 events) full before the first page
        time.sleep(seconds(1))
        baseline = sockets_of(serve.pid)
        rows.append(_row(0, serve.pid, base, baseline))
        for n in range(1, rounds + 1):
            pages = [stuck_page(port) for _ in range(PAGES)]
            held += pages  # never read, never closed, until the end
            until_sync(lambda: sockets_of(serve.pid) >= baseline + PAGES, 30, every=0.05)
            # events while the pages read nothing: each falls behind and is dropped
            deadline = time.monotonic() + 60
            while sockets_of(serve.pid) > baseline and time.monotonic() < deadline:
                asyncio.run(turns(base, 40, parallel=4))
            time.sleep(seconds(1.5))  # a dropped page's socket goes within the close bound (1 s)
            rows.append(_row(n, serve.pid, base, baseline))
    finally:
        for page in held:
            page.close()
        for proc in (serve, sim):
            proc.terminate()
            proc.wait(timeout=30)
    return rows


def _row(n: int, pid: int, base: str, baseline: int) -> dict[str, float]:
    row = {
        "round": n,
        "rss_mb": round(_rss_mb(pid), 1),
        "extra_sockets": sockets_of(pid) - baseline,
        "budget_kb": round(_budget(base) / 1024),
    }
    print(row, flush=True)
    return row


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 8
    run(rounds, "--show-content" in sys.argv)


if __name__ == "__main__":
    main()

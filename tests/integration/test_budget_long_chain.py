"""The memory budget bounds what a long chain really holds (docs/memory.md "What an entry
costs", "At the budget"): a `wsmode serve` with a 4 MiB budget, one socket sending 10,000
`generate: false` creates, each continuing the last, with the store on. The budget charges
each entry's and each link's objects, so the chain is cut where they fill it (a response
that cannot fit is not kept; the next continuation gets `previous_response_not_found` and the
client starts again), and the server's RSS grows by at most twice the budget. It counted the
items' bytes alone (40 bytes a turn against about 10 KB held): nothing was ever evicted and
RSS grew by about 95 MB."""

from __future__ import annotations

import re

import aiohttp
from websockets.asyncio.client import connect

from tests.support.helpers import free_port, running, wait_healthy
from tests.support.long_chain import warm_up

BUDGET = 4 * 1024 * 1024
TURNS = 10_000


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        found = re.search(r"VmRSS:\s+(\d+) kB", f.read())
    assert found is not None
    return int(found.group(1)) * 1024


async def memory_parts(base: str) -> dict[str, float]:
    async with aiohttp.ClientSession() as http, http.get(f"{base}/metrics") as r:
        text = await r.text()
    return {
        m[1]: float(m[2])
        for m in re.finditer(r'^wsmode_memory_bytes\{part="(\w+)"\} (\S+)$', text, re.M)
    }


async def test_a_long_warm_up_chain_is_cut_at_the_budget_before_rss_outgrows_it() -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    args = ["serve", "--port", str(port), "--log-level", "ERROR"]
    for setting in (
        "server.max_message_bytes=1048576",
        "limits.max_queued_bytes_per_connection=1048576",
        f"limits.process_max_bytes={BUDGET}",
    ):
        args += ["--set", setting]
    with running(args) as proc:
        await wait_healthy(base)
        before = rss(proc.pid)
        previous, cut, highest = None, 0, 0.0
        async with connect(f"ws://127.0.0.1:{port}/v1/responses", max_size=None) as ws:
            for turn in range(1, TURNS + 1):
                ev = await warm_up(ws, turn, previous)
                if ev["type"] == "response.completed":
                    previous = ev["response"]["id"]
                else:  # the parent was not kept: start again
                    assert ev["error"]["code"] == "previous_response_not_found", ev
                    previous, cut = None, cut + 1
                if turn % 1000 == 0:
                    highest = max(highest, sum((await memory_parts(base)).values()))
        grown = rss(proc.pid) - before
    assert cut >= 1, "the chain was never cut: the budget did not see what it holds"
    assert highest <= BUDGET
    assert grown <= 2 * BUDGET, f"RSS grew by {grown / 2**20:.1f} MB"

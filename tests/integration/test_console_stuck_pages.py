"""Console pages that never read, against a real `wsmode serve` process: once the feed
drops them their sockets are gone (the server's descriptors back to what they were), a
page that opens onto a large ring holds no more than the feed's buffer, and a drain with
pages like that still ends within its grace.

The feed's own behaviour with a page that stops reading (dropped, nothing waits for it) is
tests/integration/test_console.py.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from collections.abc import Iterator

import pytest

from tests.support.helpers import Sim, free_port, running, seconds, until, wait_healthy
from tests.support.stuck_pages import PAGES, sockets_of, stuck_page, turns

QUEUE = 4  # console.subscriber_queue: a page this many events behind is dropped
GRACE = 1.0  # server.drain_grace_seconds


async def settled(pid: int) -> int:
    """The sockets of `pid` once the count holds still for a while (the proxy's side of a
    client connection that just closed goes a moment later)."""

    async def same() -> int | None:
        before = sockets_of(pid)
        await asyncio.sleep(seconds(0.3))
        return before if sockets_of(pid) == before else None  # never 0: it listens

    return await until(same)


@pytest.fixture
def server(sim: Sim) -> Iterator[tuple[subprocess.Popen[str], int]]:
    port = free_port()
    env = {
        "WSMODE_CONSOLE_SHOW_CONTENT": "true",  # larger events: the ring fills sooner
        "WSMODE_CONSOLE_SUBSCRIBER_QUEUE": str(QUEUE),
        "WSMODE_SERVER_DRAIN_GRACE_SECONDS": str(GRACE),
        "WSMODE_SERVER_LOG_LEVEL": "WARNING",
    }
    with running(["serve", "--port", str(port), "--upstream", sim.url], env) as proc:
        yield proc, port


async def filled(port: int) -> None:
    """The server is up and its console ring holds far more than a feed may buffer."""
    await wait_healthy(f"http://127.0.0.1:{port}")
    await turns(f"http://127.0.0.1:{port}", 200)  # ~2.6 kB an event: ~500 kB of ring


async def test_pages_that_never_read_are_closed_for_good(
    server: tuple[subprocess.Popen[str], int],
) -> None:
    proc, port = server
    await filled(port)
    await turns(
        f"http://127.0.0.1:{port}", 1, parallel=1
    )  # the connection to the upstream the later turns reuse
    baseline = await settled(proc.pid)
    for _ in range(2):  # two rounds: nothing is left of the first
        pages = [stuck_page(port) for _ in range(PAGES)]
        try:
            await until(lambda: sockets_of(proc.pid) >= baseline + PAGES)
            # new events while the pages read nothing: each falls behind and is dropped
            await turns(f"http://127.0.0.1:{port}", QUEUE + 2, parallel=1)
            await until(
                lambda: sockets_of(proc.pid) <= baseline,
                timeout=15,
                message=f"the dropped pages' sockets stayed open (baseline {baseline})",
            )
        finally:
            for page in pages:
                page.close()


async def test_a_drain_with_pages_that_never_read_ends_within_its_grace(
    server: tuple[subprocess.Popen[str], int],
) -> None:
    proc, port = server
    await filled(port)
    baseline = await settled(proc.pid)
    pages = [stuck_page(port) for _ in range(PAGES)]
    try:
        await until(lambda: sockets_of(proc.pid) >= baseline + PAGES)
        await asyncio.sleep(seconds(0.5))  # each feed's first write is under way, and stuck
        began = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        await asyncio.to_thread(proc.wait, seconds(30))
        took = time.monotonic() - began
    finally:
        for page in pages:
            page.close()
    assert proc.returncode == 0
    # the grace, and a little for the process to stop (not grace + the close margin + the
    # runner's shutdown timeout, as when the feeds waited on their pages)
    assert took < seconds(GRACE + 2.5), f"the drain took {took:.1f} s (grace {GRACE} s)"

"""The console's charts in a real browser (headless Chromium, tests/support/console_browser.py)
against a `wsmode serve` process in front of two `wsmode sim` replicas, their prefix caches
on so that they report cached prompt tokens.

The charts must draw the numbers the feed carries: per conversation, a client bar and an
upstream bar per turn with the feed's byte counts, the saving so far ending at what the
conversation's summary says was saved, and a bar per turn of the time to first event in its
parts (wsmode's before the request, the model server's, wsmode's relaying), with their axes
named; for the replicas, a line each of requests in flight (1 on the replica a stalled turn
holds, 0 once it is gone) and the cached share of their prompt tokens, equal to what their
/metrics counters say. Nothing is fetched from outside wsmode.

`WSMODE_UPDATE_SCREENSHOT=1` also writes this test's page to docs/console.png (the README's
screenshot).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from openai import AsyncOpenAI
from playwright.async_api import Locator, Page
from websockets.asyncio.client import connect
from wsmode.core.routing import CLIENT, chain_key
from wsmode.core.store import owner_of
from wsmode.upstream.pool import rendezvous

from tests.support.console_browser import (
    DOCS,
    UPDATE_SCREENSHOT,
    attributes,
    browser,
    svg_texts,
    texts,
)
from tests.support.console_feed import Events, read_events, short
from tests.support.helpers import (
    Proxy,
    SimProcess,
    create,
    free_port,
    recv,
    running,
    sample,
    scrape,
    sdk_chain,
    sdk_terminal,
    send,
    sim_processes,
    streams_started,
    until,
    wait_healthy,
)

CHAINS = (("amber-kite", "cobalt-fern", "lilac-dune"), ("olive-comet", "pearl-vault", "rust-heron"))
INTERVAL = 0.25  # console.state_interval: a replica sample this often
KEY = "sk-test"


def spread(names: list[str]) -> list[str]:
    """A `prompt_cache_key` for each replica that places a new chain there (the pool's
    rendezvous order of the chain key wsmode derives from it, core/routing.py)."""
    owner = owner_of(f"Bearer {KEY}")
    keys: dict[str, str] = {}
    for i in range(100):
        key = f"chart-{i}"
        keys.setdefault(rendezvous(names, chain_key(owner, CLIENT, key))[0], key)
    return [keys[n] for n in names]


@pytest.fixture
def deployment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, list[SimProcess]]]:
    """`wsmode serve` (its base URL) and the two sims of its pool."""
    # read already (UPDATE_SCREENSHOT); the processes would take it for a setting
    monkeypatch.delenv("WSMODE_UPDATE_SCREENSHOT", raising=False)
    config = tmp_path / "sim.toml"
    config.write_text("[sim]\nprefix_cache_tokens = 100000\n")
    with sim_processes(2, "--config", str(config)) as sims:
        port = free_port()
        args = ["serve", "--port", str(port), "--log-level", "WARNING"]
        for s in sims:
            args += ["--upstream", s.url]
        with running(args, {"WSMODE_CONSOLE_STATE_INTERVAL": str(INTERVAL)}):
            yield f"http://127.0.0.1:{port}", sims


async def feed_turns(base: str) -> Events:
    """The turn events of the feed's ring (what a page opening the feed gets first: a hello
    that counts them, a snapshot, then they)."""

    def whole(events: Events) -> bool:
        return len(events) >= 2 and len(events) >= 2 + events[0]["backlog"]

    async with aiohttp.ClientSession() as http, http.get(f"{base}/console/feed") as r:
        events = await read_events(r, whole)
    return [e for e in events if e["type"] == "turn"]


def floats(values: list[str]) -> list[float]:
    return [float(v) for v in values]


async def heights_per_unit(chart: Locator, selector: str) -> list[float]:
    """Each bar's drawn height over the value it stands for (bars of a value above 0)."""
    bars = chart.locator(selector)
    out = []
    for i in range(await bars.count()):
        value = float(str(await bars.nth(i).get_attribute("data-value")))
        if value > 0:
            out.append(float(str(await bars.nth(i).get_attribute("height"))) / value)
    return out


def same_scale(ratios: list[float]) -> bool:
    return bool(ratios) and max(ratios) - min(ratios) <= 1e-6 * max(ratios)


async def check_conversation(page: Page, done: list[Any], feed: Events) -> None:
    """A conversation's two charts against the feed's turn events of it."""
    ids = [short(r.id) for r in done]
    turns = [t for t in feed if t["response_id"] in ids]
    assert [t["response_id"] for t in turns] == ids
    chat = page.locator(".conversation", has_text=f"conversation from {ids[0]}")
    bars = chat.locator("svg.bytes-chart")
    client = [t["client_bytes"] for t in turns]
    upstream = [t["upstream_bytes"] for t in turns]
    assert await attributes(bars, "rect.bar.client", "data-value") == [str(n) for n in client]
    assert await attributes(bars, "rect.bar.upstream", "data-value") == [str(n) for n in upstream]
    assert same_scale(await heights_per_unit(bars, "rect.bar"))  # one axis for both
    saved = sum(upstream) - sum(client)  # the history the client did not send again
    assert saved > 0
    assert await svg_texts(bars, "text.saved-label") == [f"saved so far {saved:,} B"]
    assert await texts(chat, ".total-saved") == [f"{saved:,} B"]
    # the saving so far, a point per turn, growing as the history does
    so_far = floats(await attributes(bars, "circle.dot.saved", "data-value"))
    assert len(so_far) == len(turns) and so_far[-1] == saved and so_far == sorted(so_far)
    points = await attributes(bars, "polyline.saved", "points")
    assert len(points) == 1 and len(points[0].split()) == len(turns)
    assert await svg_texts(bars, "text.axis-label") == ["bytes", "turn"]
    assert await svg_texts(bars, "text.x-tick") == ["1", "2", "3"]
    assert len(await svg_texts(bars, "text.y-tick")) == 3
    # the time to first event: a stacked bar per turn, its parts the feed's
    ttfe = chat.locator("svg.ttfe-chart")
    assert await ttfe.locator("g.ttfe-bar").count() == len(turns)
    for part, cls in (("proxy_request", "proxy-request"), ("upstream", "upstream")):
        shown = floats(await attributes(ttfe, f"rect.bar.{cls}", "data-value"))
        assert shown == [t["first_event"][part] for t in turns], part
    relay = floats(await attributes(ttfe, "rect.bar.proxy-relay", "data-value"))
    assert relay == [t["first_event"]["proxy_relay"] for t in turns]
    assert same_scale(await heights_per_unit(ttfe, "rect.bar"))
    for t in turns:  # the parts add up: wsmode's two are its share, all three the whole
        first = t["first_event"]
        assert first["upstream"] > 0 and first["proxy_request"] > 0
        assert first["proxy_request"] + first["proxy_relay"] == pytest.approx(first["proxy"])
        assert first["proxy"] + first["upstream"] == pytest.approx(first["total"])
    assert await svg_texts(ttfe, "text.axis-label") == ["time", "turn"]
    assert (await svg_texts(ttfe, "g.ttfe-bar title"))[0].startswith("turn 1: first event after")


def in_flight_now(names: list[str], loads: dict[str, int]) -> list[str]:
    return [f"{n} {loads.get(n, 0)} in flight now" for n in names]


async def legend(page: Page, chart: str) -> list[str]:
    found = page.locator(f"#replica-charts .chart-box:has(svg.{chart}) li")
    return [" ".join(t.split()) for t in await found.all_inner_texts()]


async def test_the_charts_draw_the_turns_and_the_replicas(
    deployment: tuple[str, list[SimProcess]],
    openai_client: Callable[..., AsyncOpenAI],
    tmp_path: Path,
) -> None:
    base, sims = deployment
    for s in sims:
        await s.ready()
    await wait_healthy(base, 30)
    names = [s.name for s in sims]
    async with browser(tmp_path / "profile", base) as (page, outside):
        await page.goto(f"{base}/console")
        await page.locator("#status.live").wait_for()
        # the replicas appear at once, idle
        await until(lambda: legend(page, "in-flight-chart"), message="no replica legend")
        assert await legend(page, "in-flight-chart") == in_flight_now(names, {})
        done = []
        client = openai_client(f"{base}/v1", api_key=KEY)
        for words, key in zip(CHAINS, spread(names), strict=True):  # a replica each
            async with client.responses.connect() as c:
                done.append(await sdk_chain(c, words, prompt_cache_key=key))
                if words is CHAINS[-1]:  # a turn refused, for the recent errors
                    await c.response.create(model="sim", input="x", previous_response_id="resp_x")
                    assert (await sdk_terminal(c)).type == "error"
        # a turn the model server holds (it stalls after two events): 1 in flight there
        before = await streams_started(sims)
        async with connect(base.replace("http", "ws", 1) + "/v1/responses") as ws:
            await send(ws, create(input="hold on", metadata={"sim_fault": "stall:2"}))
            assert (await recv(ws))["type"] == "response.created"
            started = [a - b for a, b in zip(await streams_started(sims), before, strict=True)]
            held = names[started.index(1)]

            async def holding() -> bool:
                return await legend(page, "in-flight-chart") == in_flight_now(names, {held: 1})

            await until(holding, message="the stalled turn never showed in flight")

        # the client left: wsmode cancelled the request
        async def idle() -> bool:
            return await legend(page, "in-flight-chart") == in_flight_now(names, {})

        await until(idle, message="the replicas never showed idle again")
        lines = await attributes(page, "#replica-charts polyline.in-flight", "points")
        assert len(lines) == len(names)
        counts = [len(p.split()) for p in lines]
        assert counts[0] >= 3 and len(set(counts)) == 1  # a point per sample, every replica
        shown = page.locator("#replica-charts svg.in-flight-chart")
        assert await svg_texts(shown, "text.axis-label") == ["in flight"]
        assert (await svg_texts(shown, "text.x-tick"))[-1] == "now"

        # the cached share over the window, by replica: what its /metrics counters say
        async def shares() -> list[str] | None:
            metrics = await scrape(base)
            want = []
            for n in names:
                tokens = "wsmode_upstream_replica_tokens_total"
                prompt = int(sample(metrics, tokens, upstream=n, kind="prompt"))
                cached = int(sample(metrics, tokens, upstream=n, kind="cached"))
                want.append(
                    f"{n} cached {100 * cached / prompt:.1f} % of {prompt:,} prompt tokens"
                    if prompt
                    else f"{n} no turn finished"
                )
            got = await legend(page, "cached-chart")
            return got if close(got, want) else None

        got = await until(shares, message="the cached shares never matched /metrics")
        assert any(re.search(r"cached [1-9]", g) for g in got)  # the second turns' prefixes
        dots = await attributes(page, "#replica-charts circle.dot.share", "data-value")
        assert dots and all(0 <= float(v) <= 1 for v in dots)
        # the conversations' charts
        feed = await feed_turns(base)
        for chain, replica in zip(done, names, strict=True):
            await check_conversation(page, chain, feed)
            ids = [short(r.id) for r in chain]
            assert [t["replica"] for t in feed if t["response_id"] in ids] == [replica] * 3
        if UPDATE_SCREENSHOT:  # the README's picture
            await page.locator("#errors td.error-code").first.wait_for()
            await page.screenshot(path=str(DOCS / "console.png"), full_page=True)
        assert outside == []


def close(got: list[str], want: list[str]) -> bool:
    """The legends as wanted, their percentages within the rounding of one decimal."""
    if len(got) != len(want):
        return False
    number = re.compile(r"\d+\.\d(?= %)")
    for g, w in zip(got, want, strict=True):
        if number.sub("#", g) != number.sub("#", w):
            return False
        for a, b in zip(number.findall(g), number.findall(w), strict=True):
            if abs(float(a) - float(b)) > 0.051:
                return False
    return True


HOSTILE = '<img src="/console/x" onerror="document.title=1"><svg onload="document.title=2">'


async def test_text_from_the_feed_goes_into_the_charts_as_text(
    proxy: Proxy, tmp_path: Path
) -> None:
    """A replica's name is the one text of the feed the charts show: drawn with markup in
    it, it is that text, and no element, script or request comes of it."""
    base = proxy.served.base
    async with browser(tmp_path / "profile", base) as (page, outside):
        await page.goto(f"{base}/console")
        await page.locator("#status.live").wait_for()
        drawn = await page.evaluate(
            """(name) => {
                const one = (time, prompt, cached) =>
                    ({ time, upstreams: [{ name, in_flight: 1, prompt_tokens: prompt,
                                           cached_tokens: cached }] });
                const samples = [];
                addSample(samples, one(1, 0, 0));
                addSample(samples, one(2, 10, 5));
                const box = replicaCharts(samples, num, share);
                document.body.appendChild(box);
                return {
                    names: [...box.querySelectorAll(".replica-name")].map((n) => n.textContent),
                    numbers: [...box.querySelectorAll(".replica-numbers")]
                        .map((n) => n.textContent),
                    made: box.querySelectorAll("img, script, foreignObject, [onload]").length,
                };
            }""",
            HOSTILE,
        )
        assert drawn["names"] == [HOSTILE, HOSTILE]  # the in-flight legend, the cached one
        assert drawn["numbers"] == [" 1 in flight now", " cached 50.0 % of 10 prompt tokens"]
        assert drawn["made"] == 0
        await page.wait_for_timeout(200)
        assert await page.title() == "wsmode console"
        assert outside == []

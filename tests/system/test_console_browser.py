"""The console in a real browser: Debian's headless Chromium driven by Playwright (never a
browser Playwright downloads), against wsmode and the sim on 127.0.0.1, with a conversation
run by the openai SDK over WebSocket mode.

The sidecar's page (the same page and feed, fewer panels) is checked the same way, with an
HTTP-only conversation through a sidecar in front of wsmode.

The page must show each turn and its byte counts (the numbers wsmode counted), the open
connection, the upstream, the memory parts and recent errors with their codes; no payload
text unless `console.show_content`; with proxy auth it asks for the key and reads the feed
with it. Every request the browser makes is checked to stay on the proxy's origin.

The charts, and the README's screenshot (`WSMODE_UPDATE_SCREENSHOT=1`), are
tests/system/test_console_charts.py.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from openai import AsyncOpenAI

from tests.support.console_browser import attributes, browser, number, svg_texts, texts
from tests.support.console_feed import short
from tests.support.helpers import (
    Proxy,
    Sidecar,
    Sim,
    sample,
    scrape,
    sdk_chain,
    sdk_terminal,
)
from tests.support.sidecar_turns import conversation as http_conversation

WORDS = ("zebra-quartz", "mango-lantern", "violet-anchor")


async def test_the_page_shows_the_turns_their_bytes_and_no_payload_text(
    proxy: Proxy, openai_client: Callable[..., AsyncOpenAI], tmp_path: Path
) -> None:
    base = proxy.served.base
    client = openai_client(proxy.http, api_key="sk-test")
    async with browser(tmp_path / "profile", base) as (page, outside):
        await page.goto(f"{base}/console")
        await page.locator("#status.live").wait_for()
        async with client.responses.connect() as conn:
            done = await sdk_chain(conn, WORDS)
            # a turn the proxy refuses: it is listed with its error code
            await conn.response.create(model="sim", input="x", previous_response_id="resp_gone")
            refused = await sdk_terminal(conn)
            assert refused.type == "error"
            await page.locator("tr.turn").nth(3).wait_for()
            conn_id = (await page.locator("#connections td.id").first.inner_text()).strip()
            assert conn_id.startswith("conn_")
        # ids shortened (whole only with console.show_content): they still link the turns
        chat = page.locator(".conversation", has_text=short(done[0].id))
        assert await texts(chat, "tr.turn td.response-id") == [short(r.id) for r in done]
        metrics = await scrape(proxy)
        client_bytes = [number(t) for t in await texts(page, "tr.turn td.client-bytes")]
        upstream_bytes = [number(t) for t in await texts(page, "tr.turn td.upstream-bytes")]
        assert sum(client_bytes) == sample(metrics, "wsmode_client_bytes_received_total")
        assert sum(upstream_bytes) == sample(metrics, "wsmode_upstream_bytes_sent_total")
        ours = [number(t) for t in await texts(chat, "tr.turn td.client-bytes")]
        sent = [number(t) for t in await texts(chat, "tr.turn td.upstream-bytes")]
        assert sent[2] > ours[2]  # the history went upstream, not from the client
        assert number((await texts(chat, ".total-client-bytes"))[0]) == sum(ours)
        assert number((await texts(chat, ".total-upstream-bytes"))[0]) == sum(sent)
        assert await texts(chat, "tr.turn td.outcome") == ["completed"] * 3
        assert await texts(chat, "tr.turn td.new-items") == ["1"] * 3
        # the sim, the pool's one replica, served the three turns; the refused one went nowhere
        replica = proxy.state.pool.replicas[0].name
        assert await texts(chat, "tr.turn td.replica") == [replica] * 3
        gone = page.locator(".conversation", has_text="continues resp_g…")
        assert await texts(gone, "tr.turn td.outcome") == ["rejected"]
        await page.locator(
            "#errors td.error-code", has_text="previous_response_not_found"
        ).wait_for()
        # the upstream and the memory parts against their budgets
        upstream_url = (await page.locator("#upstreams td.id").first.inner_text()).strip()
        assert upstream_url == proxy.state.upstream_url
        assert len(await texts(page, "#memory tbody tr")) == 3
        # no payload text anywhere on the page: neither the input nor the model's output
        shown = await page.locator("body").inner_text()
        assert not any(word in shown for word in WORDS)
        assert done[0].output_text not in shown
        assert not any(r.id in shown for r in done)  # nor a whole response id
        assert await page.locator("td.input-text").count() == 0
        assert outside == []


async def test_with_show_content_the_page_shows_the_text(
    sim: Sim,
    proxy_factory: Callable[..., Awaitable[Proxy]],
    openai_client: Callable[..., AsyncOpenAI],
    tmp_path: Path,
) -> None:
    proxy = await proxy_factory(sim.url, console__show_content=True)
    base = proxy.served.base
    client = openai_client(proxy.http, api_key="sk-test")
    async with client.responses.connect() as conn:
        [done] = await sdk_chain(conn, WORDS[:1])
    async with browser(tmp_path / "profile", base) as (page, outside):
        await page.goto(f"{base}/console")
        await page.locator("tr.turn").first.wait_for()
        assert await texts(page, "tr.turn td.input-text") == [f"please remember {WORDS[0]}"]
        assert await texts(page, "tr.turn td.output-text") == [done.output_text.strip()]
        assert await texts(page, "tr.turn td.response-id") == [done.id]  # whole, with content
        assert outside == []


async def test_behind_auth_the_page_asks_for_the_key_and_never_puts_it_in_a_url(
    sim: Sim,
    proxy_factory: Callable[..., Awaitable[Proxy]],
    openai_client: Callable[..., AsyncOpenAI],
    tmp_path: Path,
) -> None:
    key = "console-key-123"
    proxy = await proxy_factory(
        sim.url, server__host="0.0.0.0", console__enabled=True, auth__api_keys=(key,)
    )
    base = proxy.served.base
    client = openai_client(proxy.http, api_key=key)
    async with client.responses.connect() as conn:
        [done] = await sdk_chain(conn, WORDS[:1])
    async with browser(tmp_path / "profile", base) as (page, outside):
        urls: list[str] = []
        page.on("request", lambda request: urls.append(request.url))
        await page.goto(f"{base}/console")
        await page.locator("#key-form").wait_for()
        assert await page.locator("tr.turn").count() == 0  # nothing shown without the key
        await page.fill("#key", "not-the-key")
        await page.click("#key-form button")
        await page.locator("#key-error", has_text="refused").wait_for()
        await page.fill("#key", key)
        await page.click("#key-form button")
        await page.locator("#status.live").wait_for()
        assert await texts(page, "tr.turn td.response-id") == [short(done.id)]
        assert await page.locator("#key-form").is_hidden()
        assert urls and not any(key in url for url in urls)
        assert key not in page.url
        assert outside == []


async def test_the_sidecars_page_shows_its_turns_and_the_bytes_on_its_websocket(
    proxy: Proxy, sidecar_factory: Callable[..., Awaitable[Sidecar]], tmp_path: Path
) -> None:
    """A sidecar in front of wsmode in front of the sim, and one HTTP-only conversation
    through the sidecar: its page lists the turns, the bytes the client sent and the
    smaller messages the sidecar sent on its one WebSocket."""
    sidecar = await sidecar_factory(proxy.http)
    base = sidecar.served.base
    async with browser(tmp_path / "profile", base) as (page, outside):
        await page.goto(f"{base}/console")
        await page.locator("#status.live").wait_for()
        done = await http_conversation(sidecar.http, list(WORDS))
        await page.locator("tr.turn").nth(2).wait_for()
        chat = page.locator(".conversation", has_text=short(done[0]["response_id"]))
        assert await texts(chat, "tr.turn td.response-id") == [
            short(d["response_id"]) for d in done
        ]
        client_bytes = [number(t) for t in await texts(chat, "tr.turn td.client-bytes")]
        sent = [number(t) for t in await texts(chat, "tr.turn td.upstream-bytes")]
        assert client_bytes == [d["client_bytes"] for d in done]
        assert sum(sent) == proxy.state.client_bytes_received  # what wsmode got on the socket
        assert sent[2] < client_bytes[2]  # a continuation: only the new items went
        assert await texts(chat, "tr.turn td.via") == ["full", "delta", "delta"]
        assert await texts(chat, "tr.turn td.outcome") == ["completed"] * 3
        saved = number((await texts(chat, ".total-saved"))[0])
        assert saved == sum(client_bytes) - sum(sent)
        # its chart: the same bytes, the saving so far; no time to first event (none known)
        bars = chat.locator("svg.bytes-chart")
        assert await attributes(bars, "rect.bar.client", "data-value") == [
            str(n) for n in client_bytes
        ]
        assert await attributes(bars, "rect.bar.upstream", "data-value") == [str(n) for n in sent]
        assert await svg_texts(bars, "text.saved-label") == [f"saved so far {saved:,} B"]
        assert await chat.locator("svg.ttfe-chart").count() == 0
        await page.locator("#sidecar td.upstream-websockets", has_text="1").wait_for()
        assert await page.locator("#connections").count() == 0  # the proxy's panels: not here
        shown = await page.locator("body").inner_text()
        assert not any(word in shown for word in WORDS)
        assert outside == []

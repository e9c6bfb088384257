"""The console in a real browser, for the tests: Debian's headless Chromium (never a browser
Playwright downloads) driven by Playwright, its every request outside the console's origin
aborted and listed, and reading what the page shows."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from playwright.async_api import Locator, Page, Route, async_playwright

from tests.support.helpers import seconds

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
DOCS = Path(__file__).resolve().parents[2] / "docs"
# set: the test that makes it writes docs/console.png (the README's screenshot) again
UPDATE_SCREENSHOT = bool(os.environ.get("WSMODE_UPDATE_SCREENSHOT"))


@asynccontextmanager
async def browser(profile: Path, origin: str) -> AsyncIterator[tuple[Page, list[str]]]:
    """A page of a fresh headless Chromium (its own new profile folder), and the list of
    requests it tried to make outside `origin` (aborted)."""
    if shutil.which(CHROMIUM) is None:
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} is missing (.ci/run installs Debian's chromium)")
        pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium)")
    outside: list[str] = []

    async def only_the_proxy(route: Route) -> None:
        url = route.request.url
        if url.startswith(origin + "/") or url.startswith("data:"):
            await route.continue_()
        else:
            outside.append(url)
            await route.abort()

    async with async_playwright() as pw:
        context = await pw.chromium.launch_persistent_context(
            str(profile),
            executable_path=CHROMIUM,
            headless=True,
            args=FLAGS,
            viewport={"width": 1440, "height": 900},
            timeout=seconds(60) * 1000,  # a loaded machine starts a browser slowly
        )
        try:
            await context.route("**/*", only_the_proxy)
            page = context.pages[0] if context.pages else await context.new_page()
            page.set_default_timeout(seconds(10) * 1000)
            yield page, outside
        finally:
            await context.close()


def number(text: str) -> int:
    """`1,234 B` as shown -> 1234."""
    match = re.fullmatch(r"([\d,]+) B", text.strip())
    assert match, text
    return int(match.group(1).replace(",", ""))


async def texts(where: Page | Locator, selector: str) -> list[str]:
    return [t.strip() for t in await where.locator(selector).all_inner_texts()]


async def attributes(where: Page | Locator, selector: str, name: str) -> list[str]:
    """The attribute `name` of every element `selector` finds, in document order.

    Read in one script run, so the page cannot redraw between two elements (the replica
    charts gain a sample every second; read one element at a time, a sample could land
    between the first polyline and the last).
    """
    found = where.locator(selector)
    script = "(els, name) => els.map((e) => e.getAttribute(name))"
    return [str(v) for v in await found.evaluate_all(script, name)]  # a missing one: "None"


async def svg_texts(where: Page | Locator, selector: str) -> list[str]:
    """The text of SVG elements (which have no innerText): their textContent."""
    return [t.strip() for t in await where.locator(selector).all_text_contents()]

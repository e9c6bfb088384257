"""Exact token counts from the upstream's tokenizer, in the background.

The core hands out `CountTokens` jobs (items whose counts are still estimates); this
worker asks the upstream's `POST /tokenize` (llama.cpp, vLLM) for each item's text and hands
the counts back to whoever submitted the job (the executor, which tells the session:
`TokensCounted`), off the request path: the estimate serves until the answer arrives. One
worker per app, fed through a bounded queue (`tokens.max_pending_jobs`); a job that does not
fit is dropped and its items keep their estimates. An upstream without the endpoint (404,
405, 501) switches exact counting off for the process after the first attempt.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping

import aiohttp

from ..core import wire
from ..core.context.manager import ContextManager
from ..core.context.tokens import TokenJob, exact_item, item_text, tokenize_body, tokenize_count
from ..core.urls import redact_url
from .client import UpstreamClient

log = logging.getLogger("wsmode.tokens")

_ABSENT = frozenset({404, 405, 501})
Counted = Callable[[TokenJob, list[int]], Awaitable[None]]  # a job's exact counts, handed back


def tokenize_url(setting: str, upstream_base: str) -> str:
    """`tokens.tokenize_url` resolved: "auto" is `/tokenize` beside the upstream's `/v1`."""
    if setting != "auto":
        return setting
    base = upstream_base.rstrip("/")
    return base.removesuffix("/v1") + "/tokenize"


class TokenizeWorker:
    def __init__(
        self,
        upstream: UpstreamClient,
        context: ContextManager,
        url: str | Callable[[], str],
        max_pending: int,
    ) -> None:
        """`url`: the tokenizer's, or a function giving it per call (beside the upstream
        pool's least-loaded available replica)."""
        self.upstream = upstream
        self.context = context
        self.url = url
        self.queue: asyncio.Queue[tuple[TokenJob, Mapping[str, str], Counted]] = asyncio.Queue(
            max(1, max_pending)
        )
        self.counted = 0  # items given exact counts
        self.dropped = 0  # jobs dropped because the queue was full

    def submit(
        self, jobs: tuple[TokenJob, ...], headers: Mapping[str, str], counted: Counted
    ) -> None:
        """Count the jobs' items with the client's `headers`; each job's exact counts go to
        `counted` (a job that fails keeps its estimates)."""
        if not self.context.tokenize:
            return
        for job in jobs:
            try:
                self.queue.put_nowait((job, dict(headers), counted))
            except asyncio.QueueFull:
                self.dropped += 1
                job.target.queued = False  # offered again on a later turn

    async def run(self) -> None:
        while True:
            job, headers, counted = await self.queue.get()
            if not self.context.tokenize:
                continue
            counts: list[int] = []
            for item in job.items:
                text, attachments = item_text(item)
                n = await self._tokenize(text, headers)
                if n is None:
                    break
                counts.append(exact_item(n, attachments))
            else:
                self.counted += len(counts)
                await counted(job, counts)

    async def _body(self, resp: aiohttp.ClientResponse) -> bytes:
        """The answer, read up to `upstream.max_event_bytes` (a token list is ~6 bytes a
        token); a longer one is cut, which fails its parse."""
        limit = self.upstream.settings.max_event_bytes
        buf = bytearray()
        while len(buf) <= limit:
            chunk = await resp.content.read(64 * 1024)
            if not chunk:
                break
            buf += chunk
        return bytes(buf[: limit + 1])

    async def _tokenize(self, text: str, headers: Mapping[str, str]) -> int | None:
        session = self.upstream.session
        assert session is not None
        url = self.url if isinstance(self.url, str) else self.url()
        send = {"Content-Type": "application/json", "Accept-Encoding": "identity", **headers}
        try:
            async with session.post(
                url, data=wire.dumps(tokenize_body(text)), headers=send
            ) as resp:
                if resp.status in _ABSENT:
                    self.context.tokenize = False
                    log.warning(
                        "the upstream has no tokenizer at %s (HTTP %s): token counts stay "
                        "estimates (tokens.bytes_per_token)",
                        redact_url(url),
                        resp.status,
                    )
                    return None
                if resp.status != 200:
                    log.info("tokenizer at %s answered HTTP %s", redact_url(url), resp.status)
                    return None
                return tokenize_count(wire.loads(await self._body(resp)))
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
            log.info("tokenizer at %s failed: %s", redact_url(url), type(exc).__name__)
            return None

"""Wiring of compaction and context windows into the app: the manager, the tokenizer worker."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from aiohttp import web

from proxy.config import Settings
from proxy.core.context import ContextManager, ContextSettings
from proxy.core.sealing import Sealer, decode_key, new_key
from proxy.state import APP_STATE
from proxy.tokenizer import TokenizeWorker, tokenize_url

log = logging.getLogger("wsmode.compaction")


def build_context(settings: Settings) -> ContextManager | None:
    c, t = settings.compaction, settings.tokens
    if not c.enabled:
        return None
    if c.key:
        key = decode_key(c.key)
    else:
        key = new_key()
        log.warning(
            "compaction.key is not set: compaction items are sealed with a key generated at "
            "start-up, so items handed out now stop working after a restart and on other "
            "replicas"
        )
    return ContextManager(
        ContextSettings(
            context_window=settings.upstream.context_window,
            output_reserve=t.output_reserve,
            bytes_per_token=t.bytes_per_token,
            keep_recent_fraction=c.keep_recent_fraction,
            summary_max_output_tokens=c.summary_max_output_tokens,
            expansion_cache_bytes=c.expansion_cache_bytes,
            tokenize=bool(t.tokenize_url),
        ),
        Sealer(key),
    )


async def tokenizer_lifecycle(app: web.Application) -> AsyncIterator[None]:
    """Runs after the upstream client started (and the simulated upstream, whose URL is
    only known then): one background worker for exact token counts."""
    state = app[APP_STATE]
    t = state.settings.tokens
    task: asyncio.Task[None] | None = None
    if state.context is not None and t.tokenize_url:
        url = tokenize_url(t.tokenize_url, state.upstream_url)
        state.tokenizer = TokenizeWorker(state.upstream, state.context, url, t.max_pending_jobs)
        task = asyncio.create_task(state.tokenizer.run(), name="wsmode-tokenizer")
    try:
        yield
    finally:
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

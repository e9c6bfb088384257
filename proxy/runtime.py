"""What one running app shares across its connections: the core, the upstream pool, and
the values only known once it runs (the simulated upstream's URL, the tokenizer worker)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from aiohttp import web

from .build import Core
from .config import Settings
from .core.context.manager import ContextManager
from .core.conversation import CacheBudget
from .core.policy import UpstreamPolicy
from .core.store import AsyncStore
from .upstream.client import FORWARDED_HEADERS, UpstreamClient
from .upstream.moderation import Moderator
from .upstream.pool import UpstreamPool
from .upstream.runner import Runner
from .upstream.tokenizer import TokenizeWorker


@dataclass
class AppState:
    core: Core
    upstream: UpstreamClient
    upstream_url: str  # the first replica's (or the built-in simulated model's)
    pool: UpstreamPool  # the replicas of upstream.urls, their health and placement
    simulated: bool = False
    tokenizer: TokenizeWorker | None = None  # exact token counts, in the background
    moderator: Moderator | None = None  # the input guards' moderation hook ([guards])
    client_bytes_received: int = 0  # WebSocket text bytes from clients, all connections
    # the response store, in-process or Redis (proxy/ops/stores.py, proxy/ops/redis_store.py)
    store: AsyncStore | None = None

    def runner(self, client_headers: Mapping[str, str], label: str) -> Runner:
        """Where the upstream requests made for one client go: the client's headers that are
        forwarded (FORWARDED_HEADERS), and `label` to name the client in log lines."""
        headers = {k: v for k, v in client_headers.items() if k.lower() in FORWARDED_HEADERS}
        max_event = self.settings.upstream.max_event_bytes
        return Runner(self.pool, headers, max_event, label, self.moderator)

    # the core's parts the fronts read most, by their short names
    @property
    def settings(self) -> Settings:
        return self.core.settings

    @property
    def policy(self) -> UpstreamPolicy:
        return self.core.policy

    @property
    def cache_budget(self) -> CacheBudget:
        return self.core.cache_budget

    @property
    def context(self) -> ContextManager | None:
        return self.core.context


APP_STATE = web.AppKey("wsmode_state", AppState)

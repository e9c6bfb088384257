"""What the app shares across connections: settings, the upstream client, cache budget."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from proxy.config import Settings
from proxy.core.context import ContextManager
from proxy.core.conversation import CacheBudget
from proxy.core.session import SessionLimits, UpstreamPolicy
from proxy.core.store import ResponseStore
from proxy.tokenizer import TokenizeWorker
from proxy.upstream_http import UpstreamClient


@dataclass
class AppState:
    settings: Settings
    upstream: UpstreamClient
    policy: UpstreamPolicy
    session_limits: SessionLimits
    cache_budget: CacheBudget
    upstream_url: str
    store: ResponseStore | None
    simulated: bool = False
    context: ContextManager | None = None  # compaction and context windows (PROTOCOL 7)
    tokenizer: TokenizeWorker | None = None  # exact token counts, in the background
    client_bytes_received: int = 0  # WebSocket text bytes from clients, all connections


APP_STATE = web.AppKey("wsmode_state", AppState)

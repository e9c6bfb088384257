"""Settings in, the core's objects out: the one place the app's parts are put together.

Pure: nothing here opens a socket, starts a task or reads a clock's value; the fronts and
`app.py` do that with what this returns. `Core.socket_session()` and `Core.http_session()`
are the one way a front makes a `Session`, so the WebSocket connection and the HTTP exchange
run the same rules.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from .config import Settings
from .core.context.manager import ContextManager
from .core.context.sealing import Sealer, decode_key, new_key
from .core.context.settings import ContextSettings
from .core.conversation import CacheBudget, ResponseCache
from .core.dialects import Dialect
from .core.dialects.auto import AutoDialect
from .core.dialects.chat import ChatDialect
from .core.dialects.responses import ResponsesDialect
from .core.guards import DenyPatterns, Guard, Guards, MaxNewInputBytes
from .core.ids import new_id
from .core.memory import MemoryBudget
from .core.policy import SessionLimits, UpstreamPolicy
from .core.session import Session
from .core.store import MemoryStore
from .core.tokens.dialect import TokenDialect

log = logging.getLogger("wsmode.compaction")


@dataclass(frozen=True)
class Core:
    """What every connection of one app shares: rules, budgets, the store."""

    settings: Settings
    policy: UpstreamPolicy
    limits: SessionLimits
    cache_budget: CacheBudget
    local_store: MemoryStore | None  # the in-process response store; None when off or Redis
    memory: MemoryBudget  # the process budget over caches, store, queued creates, outbound
    context: ContextManager | None  # compaction and context windows; None when switched off
    guards: Guards | None = None  # checks of each turn's new input ([guards])

    def socket_session(self, owner: str, connection_id: str) -> Session:
        """A session for one WebSocket connection: a new chain that names no key goes where
        the connection's others go (core/routing.py)."""
        return self._session(owner, self.settings.cache.connection_max_entries, connection_id)

    def http_session(self, owner: str) -> Session:
        """A session for one HTTP request: its state is gone when its response ends (a stored
        response lives in the store), so it never takes a place in the process-wide cache."""
        return self._session(owner, 0, None)

    def _session(self, owner: str, max_entries: int, chain_key: str | None) -> Session:
        cache = ResponseCache(
            self.cache_budget, max_entries, self.settings.cache.connection_max_bytes
        )
        return Session(
            cache=cache,
            policy=self.policy,
            limits=self.limits,
            clock=time.time,
            new_id=new_id,
            owner=owner,
            context=self.context,
            guards=self.guards,
            memory=self.memory,
            chain_key=chain_key,
            stores=self.settings.store.enabled,
            max_event_bytes=self.settings.upstream.max_event_bytes,
        )


def build_core(settings: Settings) -> Core:
    st, c = settings.store, settings.cache
    memory = MemoryBudget(settings.limits.process_max_bytes)
    cache_budget = CacheBudget(c.process_max_entries, c.process_max_bytes, memory)
    memory.add_part("cache", cache_budget)
    return Core(
        settings=settings,
        policy=UpstreamPolicy(
            dialect=make_dialect(settings),
            store=settings.upstream.store,
            native_previous_response_id=settings.upstream.native_previous_response_id,
            session_key_in_body=settings.upstream.session_key_in_body,
            llamacpp_slots=settings.upstream.llamacpp_slots,
        ),
        limits=settings.limits,
        cache_budget=cache_budget,
        local_store=(
            MemoryStore(st.max_entries, st.max_bytes, st.ttl_seconds, time.time, memory)
            if st.enabled and st.backend == "memory"
            else None  # off, or remote: the fronts hold the Redis client (docs/store.md)
        ),
        memory=memory,
        context=build_context(settings),
        guards=build_guards(settings),
    )


def build_guards(settings: Settings) -> Guards | None:
    """The `[guards]` checks the core runs; None when none is configured."""
    g = settings.guards
    checks: list[Guard] = []
    if g.max_new_input_bytes:
        checks.append(MaxNewInputBytes(g.max_new_input_bytes))
    if g.deny_patterns:
        checks.append(DenyPatterns.compile(g.deny_patterns))
    if not checks and not g.moderation_url:
        return None
    return Guards(tuple(checks), moderation=bool(g.moderation_url))


def make_dialect(settings: Settings) -> Dialect:
    responses = ResponsesDialect(clock=time.time, new_id=new_id)
    chat = ChatDialect(settings.chat, clock=time.time, new_id=new_id)
    api = settings.upstream.api
    if api == "chat":
        return chat
    if api == "auto":
        return AutoDialect(responses, chat)
    if api == "tokens":  # ready once the engine is probed (upstream/token_probe.py)
        return TokenDialect(chat, clock=time.time, new_id=new_id)
    return responses


def build_context(settings: Settings) -> ContextManager | None:
    c = settings.compaction
    if not c.enabled:
        return None
    if c.key:
        key = decode_key(c.key)
    else:
        key = new_key()
        # it matters only across restarts and replicas, which a local user may never have;
        # with several workers the supervisor makes one key for all (serve.py)
        log.info(
            "compaction.key is not set: compaction items are sealed with a key made at "
            "start-up, so a conversation compacted now cannot continue after a restart or on "
            "another replica; set compaction.key (docs/deployment.md) to keep them working"
        )
    window = settings.upstream.context_window
    return ContextManager(ContextSettings(settings.tokens, c, window), Sealer(key))

"""The token path's readiness across the pool's replicas (docs/tokens.md "Start-up").

Every replica of `upstream.urls` is probed (upstream/token_probe.py), not only the first: a
turn's ids may go to any of them, so they must be one engine, template, model, vocabulary and
tokenizer (core/tokens/identity.py). The token path is ready when at least one replica
answered the probe and every replica that answered agrees; its setup is then the first one's.
It is not ready, with the reason in `/readyz` and in turns' 503 `upstream_not_ready`, while

- a replica answers but will not do (not a token engine, no template, no generate route, an
  answer without ids): that replica would get turns too;
- two replicas disagree: the reason names both and the parts they differ in;
- no replica has answered yet.

A replica that does not answer at all is down, which the pool's health checks handle: it is
probed again every few seconds until it answers. A replica is probed again, too, whenever it
may have been restarted, perhaps with another model: when the pool's checks find it healthy
again, and when a connection to it failed (`UpstreamPool.on_restart`). A probe that finds
another tokenizer on the only replica, or on all of them, makes that the setup: turns then
render afresh (the fingerprint differs, and the log says in which parts), and ids kept in
the store for the old one are never sent to the new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

from ..config import UpstreamSettings
from ..core.tokens.dialect import TokenDialect, TokenSetup
from ..core.urls import redact_url, server_root
from .client import UpstreamClient
from .pool import Replica, UpstreamPool
from .token_probe import NotReady, setup

log = logging.getLogger("wsmode.upstream")

RETRY_SECONDS = 3.0  # between probes of a replica that did not answer, or would not do


@dataclass
class _Probed:
    setup: TokenSetup | None = None  # its last good probe's
    problem: str | None = None  # why its last probe failed
    answered: bool = False  # that failure was an answer that will not do (not merely down)
    due: bool = True  # to be probed (again)


class TokenReadiness:
    """Probes the replicas and keeps the dialect's readiness (`run` until cancelled)."""

    def __init__(
        self,
        client: UpstreamClient,
        settings: UpstreamSettings,
        dialect: TokenDialect,
        pool: UpstreamPool,
    ) -> None:
        self._client, self._settings, self._dialect, self._pool = client, settings, dialect, pool
        self._probed: dict[str, _Probed] = {}
        self._wake = asyncio.Event()
        self._said: str | None = None  # the reason last logged: each is logged once
        self.settled = asyncio.Event()  # set once every replica was probed once

    def restarted(self, replica: Replica) -> None:
        """`replica` may have been restarted: probe it again."""
        probed = self._probed.get(replica.name)
        if probed is not None and not probed.due:
            probed.due = True
            self._wake.set()

    async def run(self) -> None:
        while True:
            self._wake.clear()
            replicas = list(self._pool.replicas)
            for replica in replicas:
                probed = self._probed.setdefault(replica.name, _Probed())
                if probed.due:
                    await self._probe(replica, probed)
            self._decide(replicas)
            self.settled.set()
            retry = RETRY_SECONDS if any(p.due for p in self._probed.values()) else None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), retry)

    async def _probe(self, replica: Replica, probed: _Probed) -> None:
        try:
            found = await setup(self._client, self._settings, replica.url)
        except NotReady as exc:
            probed.problem, probed.answered = str(exc), exc.answered
            if exc.answered:  # it answers, as something else now: its old setup is gone
                probed.setup = None
            return  # still due: tried again
        probed.setup, probed.problem, probed.answered, probed.due = found, None, False, False

    def _decide(self, replicas: list[Replica]) -> None:
        states = [(r, self._probed[r.name]) for r in replicas]
        one = len(states) == 1

        def named(replica: Replica, text: str) -> str:
            return text if one else f"replica {replica.name}: {text}"

        broken = [named(r, p.problem) for r, p in states if p.problem and p.answered]
        good = [(r, p.setup) for r, p in states if p.setup is not None]
        if broken or not good:
            down = [named(r, p.problem) for r, p in states if p.problem]
            self._unready("; ".join(broken or down) or "the token engine has not been probed yet")
            return
        (first, chosen), *others = good
        mine = chosen.identity
        for replica, other in others:
            theirs = other.identity
            if parts := mine.differences(theirs):
                self._unready(
                    f"the upstream replicas do not serve the same model: {first.name} and "
                    f"{replica.name} differ in {', '.join(parts)} ({first.name}: "
                    f"{mine.describe()}; {replica.name}: {theirs.describe()})"
                )
                return
        self._ready(first, chosen)

    def _unready(self, reason: str) -> None:
        self._dialect.unready(reason)
        if reason != self._said:
            log.error("the token path is not ready: %s (trying again)", reason)
            self._said = reason

    def _ready(self, replica: Replica, found: TokenSetup) -> None:
        current = self._dialect.setup
        if current is not None and current.identity == found.identity:
            return  # the same server as before: the setup in use stays
        self._said = None
        self._dialect.ready(found)
        if current is not None:
            log.warning(
                "token path: the upstream now serves another model (it differs in %s): "
                "ids kept for the old one are not reused",
                ", ".join(current.identity.differences(found.identity)),
            )
        log.info(
            "token path: %s at %s (template %s, model %s, vocabulary %s, tokenizer %s, "
            "context %s, tool format %s%s)",
            found.engine.name,
            redact_url(server_root(replica.url)),
            found.template.name,
            found.model or "unnamed",
            found.vocab_size or "unknown",
            found.tokenizer,
            found.context_window or "unknown",
            self._settings.tool_format,
            ", the generation prompt opens a think block" if found.starts_in_think else "",
        )


__all__ = ["RETRY_SECONDS", "TokenReadiness"]

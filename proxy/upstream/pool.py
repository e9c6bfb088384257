"""The upstream pool: several replicas of one model server, and which one a request goes to.

Replicas come from `upstream.urls` (or the single `upstream.url`). Each has

- its own concurrency limit: an `UpstreamGate` of `upstream.max_connections` requests (and
  `max_queued_requests` waiting). The pool shares one `UpstreamClient` (one aiohttp session,
  one connector whose keep-alive pool is per host anyway) and gives each replica a gate of
  its own, rather than one client per replica: the credential, timeouts and middlewares
  stay in one place, and a replica is just a base URL, a gate and its health;
- its health (`Health`, a pure state machine fed with the time): active checks (`GET
  health_path` resolved against the base URL every `health_interval`, healthy or unhealthy
  after `healthy_threshold` / `unhealthy_threshold` checks in a row; an answer below 500
  counts as up, since a 401 still proves the server is there) and passive ejection
  (`eject_after_failures` failed requests in a row, a refused connection or a 5xx, take it
  out for `eject_seconds`);
- counters, exported per replica with the replica's name (`host:port`) as the label: a set
  bounded by the config.

Placement (`UpstreamPool.order`). With `affinity = "conversation"` a turn whose parent was
served by a replica goes back to it (`hit`) while that replica is available; otherwise
(`moved`) it is placed as a new chain is, and the response records its new replica, so the
chain moves once and stays. A plain-HTTP conversation that resends its history has no parent
to record a replica: the pool remembers where its chain (keyed by its start) last went
(`homes`, the latest `HOMES` chains), and its next turn goes there the same way. A new chain
is placed by rendezvous hashing of its key (`rendezvous`: every replica scores the key, the
highest wins, so adding or losing a replica moves only the chains that must move) with a
load bound (`bounded`): a replica with `ceil(load_bound x average)` requests in flight, or
at its limit, is skipped and the chain goes to the next in rendezvous order (`spilled`)
instead of queueing. With `affinity = "none"` every request goes to the least-loaded replica,
ties taken in turn. Requests that are not a turn (summaries, passthrough, the tokenizer, the
probe) go to the least-loaded available replica.

A request that cannot connect at all (nothing was sent) is sent to the next replica of the
order, each replica at most once; a failure after that fails the request as it did before.
When no replica is available, all of them are tried: the pool never refuses by itself, and
readiness (`ready`) says it is not ready.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import aiohttp
from lru import LRU
from yarl import URL

from ..config import UpstreamSettings
from ..core.actions import Route
from ..core.errors import UpstreamError
from ..core.routing import CONTENT, stable_hash
from ..core.urls import redact_url
from ..telemetry.context import ON, OUTGOING
from .client import UpstreamClient, UpstreamGate, UpstreamRequest, _Chunks
from .failures import ConnectFailed

log = logging.getLogger("wsmode.upstream")

# health checks say what they are, in the model server's logs too
HEALTH_CHECK_HEADERS = {"User-Agent": "wsmode-health-check"}
AFFINITY_OUTCOMES = ("hit", "new", "moved", "spilled")
HOMES = 16_384  # plain-HTTP chains whose replica the pool remembers, most recent first
REQUEST_OUTCOMES = ("ok", "http_4xx", "http_5xx", "unavailable", "timeout", "overloaded", "stream")


# ------------------------------------------------------------------ health (pure)


@dataclass
class Health:
    """One replica's health: active checks and passive ejection. Pure: the caller passes
    the time, so the whole state machine is tested without waiting."""

    healthy_threshold: int = 1
    unhealthy_threshold: int = 2
    eject_after: int = 3  # failed requests in a row; 0: never ejected
    eject_seconds: float = 30.0
    healthy: bool = True  # by the active checks (optimistic until the first ones say no)
    good: int = 0  # checks that succeeded in a row
    bad: int = 0  # checks that failed in a row
    failures: int = 0  # requests that failed in a row
    ejected_until: float = 0.0
    ejections: int = 0

    def checked(self, ok: bool) -> bool | None:
        """One active check's result; returns the new `healthy` when it changed."""
        if ok:
            self.good, self.bad = self.good + 1, 0
            if not self.healthy and self.good >= self.healthy_threshold:
                self.healthy = True
                return True
        else:
            self.good, self.bad = 0, self.bad + 1
            if self.healthy and self.bad >= self.unhealthy_threshold:
                self.healthy = False
                return False
        return None

    def succeeded(self) -> None:
        """A request got an answer that was not the replica's failure."""
        self.failures = 0

    def failed(self, now: float) -> bool:
        """A request failed by the replica's fault; True when this ejects it."""
        self.failures += 1
        if not self.eject_after or self.failures < self.eject_after or self.ejected(now):
            return False
        self.failures = 0
        self.ejected_until = now + self.eject_seconds
        self.ejections += 1
        return True

    def ejected(self, now: float) -> bool:
        return now < self.ejected_until

    def available(self, now: float) -> bool:
        return self.healthy and not self.ejected(now)


# ------------------------------------------------------------------ placement (pure)


def rendezvous(names: Iterable[str], key: str) -> list[str]:
    """`names` by their score for `key`, highest first (highest-random-weight hashing)."""
    return sorted(names, key=lambda name: (stable_hash(f"{name}\0{key}"), name), reverse=True)


@dataclass(frozen=True, slots=True)
class Load:
    """What placement needs to know of a replica."""

    name: str
    in_flight: int
    limit: int  # 0: none


def bounded(order: Sequence[Load], load_bound: float) -> tuple[list[Load], bool]:
    """`order` (rendezvous order) with the first replica that can take one more request
    moved to the front; True if that is not the first one (the chain spilled).

    A replica cannot when its in-flight count has reached `ceil(load_bound x average)`, the
    average counting the new request, or its own limit. When none can, the order stays as
    it is: the request waits at its first choice."""
    if not order:
        return [], False
    total = sum(r.in_flight for r in order) + 1
    cap = math.ceil(load_bound * total / len(order)) if load_bound > 0 else math.inf
    for i, r in enumerate(order):
        if r.in_flight < cap and (r.limit <= 0 or r.in_flight < r.limit):
            return [r, *order[:i], *order[i + 1 :]], i > 0
    return list(order), False


# ------------------------------------------------------------------ the pool


def replica_name(url: str) -> str:
    u = URL(url)
    return f"{u.host}:{u.port}"


@dataclass(eq=False)
class Replica:
    name: str  # `host:port`: the metrics label and what a cached response records
    url: str  # the base URL, ending before `/responses`, without userinfo (client.register)
    gate: UpstreamGate
    health: Health
    shown: str = ""  # the URL as configured, redacted: what /readyz shows
    in_flight: int = 0  # requests placed here and not finished (waiting for the gate too)
    outcomes: Counter[str] = field(default_factory=Counter)

    def load(self) -> Load:
        return Load(self.name, self.in_flight, self.gate.limit)


class UpstreamPool:
    def __init__(
        self,
        client: UpstreamClient,
        settings: UpstreamSettings,
        urls: Sequence[str],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.settings = settings
        self.clock = clock
        self.replicas: list[Replica] = []
        self.by_name: dict[str, Replica] = {}
        self.affinity = Counter[str]()
        self.homes: Any = LRU(HOMES)  # content-keyed chain -> the replica that took its turn
        self._turn = 0  # round-robin among equally loaded replicas
        # a replica may have been restarted (healthy again, a connection failed): token_replicas
        self.on_restart: Callable[[Replica], None] | None = None
        self.set_urls(urls)

    def _replica(self, name: str, url: str) -> Replica:
        s = self.settings
        gate = UpstreamGate(s.max_connections, s.max_queued_requests, s.queue_timeout)
        health = Health(
            s.healthy_threshold, s.unhealthy_threshold, s.eject_after_failures, s.eject_seconds
        )
        return Replica(name, self.client.register(url), gate, health, redact_url(url))

    def set_urls(self, urls: Sequence[str]) -> None:
        """Set the replicas (the built-in simulated upstream's URL is known only once it
        runs, so the app sets it again then)."""
        self.replicas = []
        for url in urls:
            name = base = replica_name(url)
            n = 2
            while any(r.name == name for r in self.replicas):  # two paths on one server
                name, n = f"{base}#{n}", n + 1
            self.replicas.append(self._replica(name, url))
        self.by_name = {r.name: r for r in self.replicas}

    # ---- state

    def available(self) -> list[Replica]:
        now = self.clock()
        return [r for r in self.replicas if r.health.available(now)]

    @property
    def ready(self) -> bool:
        """At least one replica is healthy and not ejected."""
        return bool(self.available())

    @property
    def active(self) -> int:  # for the ops metrics (`wsmode_upstream_requests`)
        return sum(r.gate.active for r in self.replicas)

    @property
    def waiting(self) -> int:
        return sum(r.gate.waiting for r in self.replicas)

    def snapshot(self) -> list[dict[str, Any]]:
        """Each replica as /readyz shows it."""
        now = self.clock()
        return [
            {
                "name": r.name,
                "url": r.shown,
                "healthy": r.health.healthy,
                "ejected": r.health.ejected(now),
                "in_flight": r.in_flight,
                "max_concurrency": r.gate.limit,
            }
            for r in self.replicas
        ]

    # ---- placement

    def least_loaded(self) -> list[Replica]:
        """Available replicas, least loaded first, equal loads in turn; then the others."""
        up = self.available()
        rest = [r for r in self.replicas if r not in up]
        if up:
            self._turn = (self._turn + 1) % len(up)
            up = up[self._turn :] + up[: self._turn]
        return sorted(up, key=lambda r: r.in_flight) + rest

    def order(self, route: Route | None) -> tuple[list[Replica], str | None]:
        """The replicas to try for a request, first choice first, and the affinity outcome
        (None when affinity does not apply)."""
        if len(self.replicas) == 1:  # nothing to choose between: only the outcome to name
            return [self.replicas[0]], self._only_outcome(route)
        if route is None or self.settings.affinity == "none":
            return self.least_loaded(), None
        up = self.available()
        pool = up or self.replicas  # nothing available: try every one anyway
        name = route.replica  # the parent's; a plain-HTTP conversation's, as remembered
        if name is None and route.chain.startswith(CONTENT):
            name = self.homes.get(route.chain)
        home = self.by_name.get(name) if name is not None else None
        if len(pool) == 1:  # one replica: its rank needs no hashing
            ranked = list(pool)
        else:
            ranked = [self.by_name[n] for n in rendezvous((r.name for r in pool), route.chain)]
        if home is not None and home in pool:
            return [home, *(r for r in ranked if r is not home)], "hit"
        loads, spilled = bounded([r.load() for r in ranked], self.settings.load_bound)
        chosen = [self.by_name[load.name] for load in loads]
        outcome = "spilled" if spilled else "new"
        if name is not None:  # its replica is gone, or not available now
            outcome = "moved"
        rest = [r for r in self.replicas if r not in chosen]
        return chosen + rest, outcome

    def _only_outcome(self, route: Route | None) -> str | None:
        """`order`'s affinity outcome when there is one replica (it is every chain's home)."""
        if route is None or self.settings.affinity == "none":
            return None
        if route.replica is None:  # a plain-HTTP conversation's too: nothing is remembered
            return "new"
        return "hit" if self.by_name.get(route.replica) is self.replicas[0] else "moved"

    def pick(self) -> Replica:
        """A replica for a request that is not a turn: the least-loaded available one."""
        return self.least_loaded()[0]

    # ---- requests

    def stream(
        self,
        path: str,
        body: bytes,
        headers: Mapping[str, str],
        route: Route | None = None,
        on_sent: Callable[[], None] | None = None,
    ) -> PoolRequest:
        """`UpstreamClient.stream` on the replica `order` chooses; `async with` it for the
        replica that answered and its chunks. A replica that cannot be connected to passes
        the request to the next one; any other failure is raised as the client raises it."""
        return PoolRequest(self, path, body, headers, route, on_sent)

    def _failed(self, replica: Replica, err: UpstreamError, answered: bool) -> None:
        if answered or err.started:
            replica.outcomes["stream"] += 1
            return
        code = err.code or ""
        if code == "upstream_overloaded":  # our own gate: not the replica's failure
            replica.outcomes["overloaded"] += 1
            return
        if code == "upstream_timeout":
            kind = "timeout"
        elif code == "upstream_unavailable":
            kind = "unavailable"
            if self.on_restart is not None:
                self.on_restart(replica)
        else:
            kind = "http_5xx" if err.status >= 500 else "http_4xx"
        replica.outcomes[kind] += 1
        if kind == "http_4xx":
            replica.health.succeeded()  # it answered: it is up
        elif replica.health.failed(self.clock()):
            log.warning(
                "upstream replica %s ejected for %gs after %d failed requests in a row (%s)",
                replica.name,
                self.settings.eject_seconds,
                self.settings.eject_after_failures,
                err.message,
            )

    # ---- active health checks

    def health_url(self, replica: Replica) -> URL:
        return URL(replica.url + "/").join(URL(self.settings.health_path))

    async def check(self, replica: Replica, session: aiohttp.ClientSession) -> bool:
        """One active check: GET the health path; an answer below 500 means up."""
        timeout = aiohttp.ClientTimeout(total=self.settings.health_timeout)
        try:
            async with session.get(
                self.health_url(replica), timeout=timeout, headers=HEALTH_CHECK_HEADERS
            ) as resp:
                ok = resp.status < 500
        except (TimeoutError, aiohttp.ClientError, OSError, ValueError):  # ValueError: not built
            ok = False
        changed = replica.health.checked(ok)
        if changed is False:
            log.warning(
                "upstream replica %s is unhealthy: %d health checks of %s failed in a row",
                replica.name,
                self.settings.unhealthy_threshold,
                redact_url(str(self.health_url(replica))),
            )
        elif changed:
            log.info("upstream replica %s is healthy again", replica.name)
            if self.on_restart is not None:
                self.on_restart(replica)
        return ok

    async def check_all(self, session: aiohttp.ClientSession) -> None:
        async with asyncio.TaskGroup() as tg:
            for replica in self.replicas:
                tg.create_task(self.check(replica, session))

    async def run_checks(self) -> None:
        """Check every replica every `health_interval` seconds, until cancelled.

        The checks have a session of their own, a new connection each: they never take or
        warm a keep-alive connection of the model requests, and a server that closes idle
        connections early (llama.cpp) does not fail them."""
        connector = aiohttp.TCPConnector(force_close=True)
        async with aiohttp.ClientSession(
            connector=connector, middlewares=self.client.middlewares
        ) as session:
            while True:
                await self.check_all(session)
                await asyncio.sleep(self.settings.health_interval)

    # ---- metrics


@dataclass(slots=True, eq=False)
class PoolRequest:
    """One request through the pool (`UpstreamPool.stream`), an async context manager: a
    class, like the client's request, so a model call makes no generator."""

    pool: UpstreamPool
    path: str
    body: bytes
    headers: Mapping[str, str]
    route: Route | None
    on_sent: Callable[[], None] | None
    taken: OnReplica | None = field(default=None, init=False)  # on the replica that took it

    async def __aenter__(self) -> tuple[Replica, _Chunks]:
        pool, route = self.pool, self.route
        order, outcome = pool.order(route)
        traced = OUTGOING.get() if ON[0] else None  # tracing on: the turn's span
        send = self.headers
        name = pool.settings.session_header
        if name and route is not None:
            send = {**send, name: route.chain}
        last = len(order) - 1
        for attempt, replica in enumerate(order):
            request = pool.client.stream(
                self.path, self.body, send, self.on_sent, base_url=replica.url, gate=replica.gate
            )
            on = OnReplica(pool, replica, request)
            try:
                chunks = await on.__aenter__()
            except ConnectFailed as err:  # nothing was sent: the next replica may take it
                if attempt == last:
                    raise
                log.warning("%s; trying the next upstream replica", err.message)
                continue
            self.taken = on
            if outcome is not None:
                if len(order) > 1 and route is not None and route.chain.startswith(CONTENT):
                    pool.homes[route.chain] = replica.name  # where its next turn goes
                placed = "moved" if attempt and outcome == "hit" else outcome
                pool.affinity[placed] += 1
                if traced is not None:
                    traced.affinity(placed)
            return replica, chunks
        raise AssertionError("the pool has no replica")  # never: it is made with one at least

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.taken is not None:
            await self.taken.__aexit__(kind, exc, tb)


@dataclass(slots=True, eq=False)
class OnReplica:
    """One request on one replica, counted in its load, outcomes and health."""

    pool: UpstreamPool
    replica: Replica
    request: UpstreamRequest

    async def __aenter__(self) -> _Chunks:
        replica = self.replica
        replica.in_flight += 1
        try:
            chunks = await self.request.__aenter__()
        except BaseException as exc:
            replica.in_flight -= 1
            if isinstance(exc, UpstreamError):
                self.pool._failed(replica, exc, False)
            raise
        replica.health.succeeded()
        return chunks

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        replica = self.replica
        try:
            await self.request.__aexit__(kind, exc, tb)
        finally:
            replica.in_flight -= 1
            if isinstance(exc, UpstreamError):  # the answer's stream failed (`started`)
                self.pool._failed(replica, exc, True)
            else:  # a 200 answer, read to its end or left early
                replica.outcomes["ok"] += 1


__all__ = ["Health", "Load", "Replica", "UpstreamPool", "bounded", "rendezvous"]

"""Scenario "affinity": conversations over several model-server replicas that each keep a
prefix cache (the upstream pool, `upstream.urls` and `upstream.affinity`), routed four ways,
side by side in one run.

N conversations run at once, each M turns with a growing history (a shared instructions
prompt, then per turn a new user message of `turn_tokens` and the model's short answer),
over K `wsmode sim` processes with the prefix-cache model on (sim/prefix_cache.py: prompt
tokens not in a replica's LRU are prefilled at `prefill_tokens_per_second`, one request at a
time per replica, before the first event). The contenders, each on fresh replicas (or, with
`share_replicas`, on replicas started once: see `start_shared`):

- `round-robin`: a round-robin HTTP balancer (bench/balancer.py) in front of the replicas,
  each turn a plain HTTP request carrying the full history, as users run today;
- `wsmode-none`: wsmode over WebSocket mode, `upstream.urls` = the replicas,
  `upstream.affinity = "none"`;
- `wsmode-affinity`: the same with `upstream.affinity = "conversation"`;
- `ideal`: every prefix cached that could be: replicas with an unbounded cache, every
  conversation's turns sent straight to one replica (conversations spread evenly), so only
  what no router can avoid is prefilled (each conversation's first turn, each turn's new input).

Reported per contender: time to first token (the first output delta) p50/p99 over every turn,
the turn time p50, the run's wall time, and the cached share of prompt tokens (what the
replicas reported in usage).
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp
import orjson

from ..core.sse import SSEDecoder
from .clients import HEADERS, MAX_EVENT_BYTES, TERMINAL, event_type, ws_connect
from .procs import (
    BenchError,
    Server,
    Servers,
    free_port,
    sim_env,
    start_sim,
    together,
    wsmode_command,
)
from .stats import percentile

CONTENDERS = ("round-robin", "wsmode-none", "wsmode-affinity", "ideal")
UNBOUNDED = 10**12  # tokens: a cache that never fills in any run
_BYTES_PER_WORD = 6  # the sim's answer words, with their spaces, on average (about)
_MAX_EVENTS = 100_000  # per turn: far more than any answer here has
_WORDS = "alpha beta gamma delta kappa sigma omega river stone cloud paper linen ember".split()


@dataclass(frozen=True)
class AffinityProfile:
    conversations: int = 32  # all at once
    turns: int = 16
    replicas: int = 8
    instructions_tokens: int = 200  # the same instructions in every conversation
    turn_tokens: int = 400  # each turn's new user message
    output_tokens: int = 20  # each answer, in the sim's words
    prefill_tokens_per_second: float = 2500.0  # per replica, for uncached prompt tokens
    tokens_per_second: float = 1000.0  # decoding, per stream
    ttft_ms: float = 5.0  # from the end of prefill to the first token
    # each replica's cache over its even share of the working set (working set / replicas):
    # 1.5 holds the conversations affinity gives a replica, with room for unevenness, and
    # under a fifth of all of them, which is what round robin would need it to hold
    cache_share: float = 1.5
    block_tokens: int = 16
    turn_timeout: float = 120.0  # seconds; a turn slower than this fails the contender
    # False: fresh replicas for each contender. True: every process starts once, at once;
    # the three bounded contenders take turns on the same replicas, each with text of its
    # own (no prefix in common with what the caches hold, which the LRU then drops first)
    share_replicas: bool = False
    # False: wsmode-none is left out. No target reads it: it shows what affinity adds within
    # wsmode, which the full run reports
    with_none: bool = True

    def contenders(self) -> tuple[str, ...]:
        """The contenders this profile runs, in report order."""
        return tuple(c for c in CONTENDERS if self.with_none or c != "wsmode-none")

    def working_set_tokens(self) -> int:
        """About the tokens of every conversation's last prompt, added up."""
        per_turn = self.turn_tokens + 4 + self.output_tokens * _BYTES_PER_WORD // 4 + 4
        return self.conversations * (self.instructions_tokens + self.turns * per_turn)

    def cache_tokens(self) -> int:
        return int(self.cache_share * self.working_set_tokens() / self.replicas)


DEFAULT = AffinityProfile()
QUICK = AffinityProfile(
    # the full profile's regime (8 replicas, 16 turns, each cache 1.5x its even share) at
    # half the conversations and five times the speed: prefill, first token and decoding all
    # five times faster, so every turn keeps the full profile's proportions; every process
    # starts once, side by side; wsmode-none, which no target reads, is left out
    # (docs/bench-affinity.md "The quick profile")
    conversations=16,
    prefill_tokens_per_second=12_500.0,
    tokens_per_second=5_000.0,
    ttft_ms=1.0,
    share_replicas=True,
    with_none=False,
)
SMOKE = AffinityProfile(
    # an odd number of conversations over two replicas: a round-robin balancer then sends a
    # conversation's turns to each replica in turn (with four, each would stay on one)
    conversations=3,
    turns=3,
    replicas=2,
    instructions_tokens=20,
    turn_tokens=100,
    output_tokens=5,
    prefill_tokens_per_second=200_000.0,
    tokens_per_second=0.0,
    ttft_ms=0.0,
    turn_timeout=60.0,
)


@dataclass
class TurnRecord:
    ttft: float = 0.0  # seconds to the first output delta
    total: float = 0.0  # seconds to the terminal event
    input_tokens: int = 0
    cached_tokens: int = 0
    response: dict[str, Any] = field(default_factory=dict)


def _text(tokens: int, *seed: object) -> str:
    """About `tokens` tokens (4 bytes each) of words, the same for the same seed."""
    rng = random.Random(":".join(map(str, seed)))
    head = " ".join(map(str, seed)) + ":"
    words = [head]
    size = len(head)
    while size < tokens * 4:
        word = rng.choice(_WORDS)
        words.append(word)
        size += len(word) + 1
    return " ".join(words)


def _user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": text}


def _record(turn: TurnRecord, kind: str, data: str | bytes, sent: float) -> bool:
    """Note one event; True at the terminal one."""
    now = time.perf_counter()
    if kind == "response.output_text.delta" and not turn.ttft:
        turn.ttft = now - sent
    if kind not in TERMINAL:
        return False
    ev = orjson.loads(data)
    if kind != "response.completed":
        raise BenchError(f"the turn ended with {kind}: {str(ev)[:300]}")
    turn.total = now - sent
    turn.response = ev["response"]
    usage = turn.response.get("usage") or {}
    turn.input_tokens = int(usage.get("input_tokens") or 0)
    turn.cached_tokens = int((usage.get("input_tokens_details") or {}).get("cached_tokens") or 0)
    if not turn.ttft:
        raise BenchError("the turn completed without an output text delta")
    return True


async def _http_turn(session: aiohttp.ClientSession, url: str, body: bytes) -> TurnRecord:
    turn = TurnRecord()
    sent = time.perf_counter()
    async with session.post(url, data=body, headers=HEADERS) as resp:
        if resp.status != 200:
            raise BenchError(f"HTTP {resp.status}: {(await resp.read())[:300]!r}")
        decoder = SSEDecoder(MAX_EVENT_BYTES)
        events = 0
        async for chunk in resp.content.iter_any():
            for ev in decoder.feed(chunk):
                events += 1
                if events > _MAX_EVENTS:
                    raise BenchError(f"no terminal event in {_MAX_EVENTS} events")
                if ev.data == b"[DONE]":
                    continue
                if _record(turn, ev.event or event_type(ev.data), ev.data, sent):
                    return turn
    raise BenchError("the HTTP stream ended without a terminal event")


async def _ws_turn(ws: aiohttp.ClientWebSocketResponse, frame: bytes) -> TurnRecord:
    turn = TurnRecord()
    sent = time.perf_counter()
    await ws.send_frame(frame, aiohttp.WSMsgType.TEXT)
    for _ in range(_MAX_EVENTS):
        msg = await ws.receive()
        if msg.type is not aiohttp.WSMsgType.TEXT:
            raise BenchError(f"the socket answered {msg.type.name}: {msg.data!r}")
        if _record(turn, event_type(msg.data), msg.data, sent):
            return turn
    raise BenchError(f"no terminal event in {_MAX_EVENTS} events")


Conversation = Callable[[aiohttp.ClientSession, int, AffinityProfile], Awaitable[list[TurnRecord]]]


def _seed(tag: str, *seed: object) -> tuple[object, ...]:
    """A text's seed; `tag` (a contender's name on shared replicas) makes its text its own."""
    return (tag, *seed) if tag else seed


def http_conversation(url_of: Callable[[int], str], tag: str = "") -> Conversation:
    """A conversation over plain HTTP: every turn carries the whole history, to
    `url_of(conversation)`."""

    async def converse(
        session: aiohttp.ClientSession, c: int, p: AffinityProfile
    ) -> list[TurnRecord]:
        instructions = _text(p.instructions_tokens, *_seed(tag, "instructions"))
        items: list[Any] = []
        out: list[TurnRecord] = []
        for t in range(p.turns):
            items.append(_user(_text(p.turn_tokens, *_seed(tag, "conversation", c, "turn", t))))
            body = {"model": "sim", "instructions": instructions, "input": items, "stream": True}
            body["store"] = False
            turn = await asyncio.wait_for(
                _http_turn(session, url_of(c), orjson.dumps(body)), p.turn_timeout
            )
            items += turn.response.get("output") or []
            out.append(turn)
        return out

    return converse


def ws_conversation(url: str, tag: str = "") -> Conversation:
    """A conversation over WebSocket mode: each turn sends only its new input and chains on
    the previous response in the connection (`store: false`)."""

    async def converse(
        session: aiohttp.ClientSession, c: int, p: AffinityProfile
    ) -> list[TurnRecord]:
        instructions = _text(p.instructions_tokens, *_seed(tag, "instructions"))
        out: list[TurnRecord] = []
        ws = await ws_connect(session, url)
        try:
            previous: str | None = None
            for t in range(p.turns):
                create: dict[str, Any] = {"type": "response.create", "model": "sim"}
                create.update(instructions=instructions, store=False)
                text = _text(p.turn_tokens, *_seed(tag, "conversation", c, "turn", t))
                create["input"] = [_user(text)]
                if previous is not None:
                    create["previous_response_id"] = previous
                turn = await asyncio.wait_for(_ws_turn(ws, orjson.dumps(create)), p.turn_timeout)
                previous = str(turn.response["id"])
                out.append(turn)
        finally:
            await ws.close()
        return out

    return converse


def _sim_env(p: AffinityProfile, cache_tokens: int) -> dict[str, str]:
    env = sim_env(
        ttft_ms=p.ttft_ms,
        tokens_per_second=p.tokens_per_second,
        output_tokens=p.output_tokens,
        tool_calls_per_turn=0,
    )
    env["WSMODE_SIM_PREFILL_TOKENS_PER_SECOND"] = str(p.prefill_tokens_per_second)
    env["WSMODE_SIM_PREFIX_CACHE_TOKENS"] = str(cache_tokens)
    env["WSMODE_SIM_PREFIX_CACHE_BLOCK_TOKENS"] = str(p.block_tokens)
    return env


async def _start_balancer(servers: Servers, bases: list[str]) -> Server:
    port = free_port()
    cmd = [sys.executable, "-m", "wsmode.bench.balancer", "--port", str(port)]
    return await servers.start("balancer", [*cmd, *bases], "127.0.0.1", port)


async def _start_wsmode(servers: Servers, bases: list[str], affinity: str) -> Server:
    port = free_port()
    env = {
        "WSMODE_UPSTREAM_URLS": ",".join(f"{base}/v1" for base in bases),
        "WSMODE_UPSTREAM_AFFINITY": affinity,
        "WSMODE_SERVER_LOG_LEVEL": "WARNING",
    }
    cmd = wsmode_command(["serve", "--host", "127.0.0.1", "--port", str(port)])
    return await servers.start("wsmode", cmd, "127.0.0.1", port, env)


async def _warm_up(
    session: aiohttp.ClientSession, replica: Server, p: AffinityProfile, tag: str = ""
) -> None:
    """One request with the shared instructions, so they are in the replica's cache."""
    instructions = _text(p.instructions_tokens, *_seed(tag, "instructions"))
    body = {"model": "sim", "instructions": instructions, "input": "warm-up"}
    async with session.post(f"{replica.base}/v1/responses", json=body) as r:
        if r.status != 200:
            raise BenchError(f"warm-up of {replica.base}: HTTP {r.status}")
        await r.read()


async def _replica_stats(session: aiohttp.ClientSession, replica: Server) -> dict[str, Any]:
    """The replica's requests served and blocks evicted so far."""
    async with session.get(f"{replica.base}/sim/stats") as r:
        doc: dict[str, Any] = await r.json()
    cache = doc.get("prefix_cache") or {}
    return {"requests": int(doc.get("completed", 0)), "evicted_blocks": cache.get("evictions", 0)}


def _converse(name: str, replicas: list[Server], front: Server | None, tag: str) -> Conversation:
    """How contender `name` talks to its replicas (`front`: the balancer or wsmode)."""
    if name == "ideal":
        return http_conversation(lambda c: f"{replicas[c % len(replicas)].base}/v1/responses", tag)
    assert front is not None
    if name == "round-robin":
        return http_conversation(lambda c: f"{front.base}/v1/responses", tag)
    return ws_conversation(f"ws://{front.host}:{front.port}/v1/responses", tag)


async def _start_front(servers: Servers, name: str, bases: list[str]) -> Server:
    """The balancer (round-robin) or wsmode (the wsmode contenders) in front of the replicas
    at `bases`."""
    if name == "round-robin":
        return await _start_balancer(servers, bases)
    affinity = "none" if name == "wsmode-none" else "conversation"
    return await _start_wsmode(servers, bases, affinity)


async def start_shared(
    p: AffinityProfile, servers: Servers
) -> dict[str, tuple[list[Server], Server | None]]:
    """Every contender's processes at once: K replicas with the bounded cache, and the
    balancer and both wsmodes in front of them (the replicas' ports are chosen first, so the
    fronts start beside them). The ideal runs first, on the empty caches: with conversations
    spread evenly each replica's share fits in its cache (`cache_share` > 1), so nothing is
    evicted and the cache is unbounded in effect (`ideal_evicted_blocks` says so)."""
    ports = [free_port() for _ in range(p.replicas)]
    env = _sim_env(p, p.cache_tokens())
    bases = [f"http://127.0.0.1:{port}" for port in ports]
    fronts = [name for name in p.contenders() if name != "ideal"]
    started = await together(
        *(start_sim(servers, env, port=port) for port in ports),
        *(_start_front(servers, name, bases) for name in fronts),
    )
    replicas = started[: p.replicas]
    out: dict[str, tuple[list[Server], Server | None]] = {"ideal": (replicas, None)}
    for name, front in zip(fronts, started[p.replicas :], strict=True):
        out[name] = (replicas, front)
    return out


async def run_contender(
    name: str,
    p: AffinityProfile,
    session: aiohttp.ClientSession,
    shared: tuple[list[Server], Server | None] | None = None,
) -> dict[str, Any]:
    """One contender, every conversation at once, to the end: on fresh replicas, or on the
    `shared` replicas and front (`start_shared`) with text of its own."""
    servers = Servers()
    tag = name if shared else ""
    try:
        if shared:
            replicas, front = shared
        else:
            env = _sim_env(p, UNBOUNDED if name == "ideal" else p.cache_tokens())
            # one at a time: K interpreters starting at once on a busy machine can miss the
            # start-up timeout
            replicas = [await start_sim(servers, env) for _ in range(p.replicas)]
            bases = [r.base for r in replicas]
            front = None if name == "ideal" else await _start_front(servers, name, bases)
        for r in replicas:  # every replica has seen the shared instructions, as in production
            await _warm_up(session, r, p, tag)
        before = [await _replica_stats(session, r) for r in replicas]
        converse = _converse(name, replicas, front, tag)
        started = time.perf_counter()
        cpu_before = front.cpu_ns() if front else 0
        runs = await asyncio.gather(
            *(converse(session, c, p) for c in range(p.conversations)), return_exceptions=True
        )
        wall = time.perf_counter() - started
        front_cpu = (front.cpu_ns() - cpu_before) / 1e9 if front else None
        after = [await _replica_stats(session, r) for r in replicas]
        per_replica = [{k: a[k] - b[k] for k in a} for a, b in zip(after, before, strict=True)]
    finally:
        servers.stop_all()
    errors = [f"{type(r).__name__}: {r}"[:300] for r in runs if isinstance(r, BaseException)]
    turns = [t for r in runs if not isinstance(r, BaseException) for t in r]
    prompt = sum(t.input_tokens for t in turns)
    cached = sum(t.cached_tokens for t in turns)
    ttfts = [t.ttft for t in turns]
    return {
        "turns": len(turns),
        "errors": errors,
        "ttft_p50_ms": round(percentile(ttfts, 50) * 1000, 2),
        "ttft_p99_ms": round(percentile(ttfts, 99) * 1000, 2),
        "turn_p50_ms": round(percentile([t.total for t in turns], 50) * 1000, 2),
        "wall_s": round(wall, 3),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "cached_share": round(cached / prompt, 4) if prompt else None,
        # CPU seconds of the balancer or wsmode process during the run (none for the ideal)
        "front_cpu_s": None if front_cpu is None else round(front_cpu, 3),
        "replicas": per_replica,
    }


def _ratio(a: Any, b: Any) -> float | None:
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)) or not b:
        return None
    return round(a / b, 3)


async def run(p: AffinityProfile, log: Callable[[str], None]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "profile": asdict(p),
        "working_set_tokens": p.working_set_tokens(),
        "cache_tokens_per_replica": p.cache_tokens(),
        "contenders": {},
        "errors": [],
    }
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=p.turn_timeout)
    servers = Servers()
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        try:
            shared = await start_shared(p, servers) if p.share_replicas else {}
            ran = p.contenders()
            order = ("ideal", *ran[:-1]) if shared else ran  # shared: the ideal first
            for name in order:
                r = await run_contender(name, p, session, shared.get(name))
                out["contenders"][name] = r
                if r["errors"]:
                    out["errors"].append(f"{name}: {len(r['errors'])} conversations failed")
                log(
                    f"  {name:<16} TTFT p50 {r['ttft_p50_ms']:>8} ms, p99"
                    f" {r['ttft_p99_ms']:>8} ms; turn p50 {r['turn_p50_ms']:>8} ms; wall"
                    f" {r['wall_s']:>6} s; cached {r['cached_share']}; requests per replica"
                    f" {[x['requests'] for x in r['replicas']]}"
                    + (f"; ERRORS: {r['errors'][:2]}" if r["errors"] else "")
                )
        finally:
            servers.stop_all()
    c = out["contenders"] = {name: out["contenders"][name] for name in p.contenders()}
    if p.share_replicas:
        out["ideal_evicted_blocks"] = sum(x["evicted_blocks"] for x in c["ideal"]["replicas"])
    out["ttft_p50_round_robin_over_affinity"] = _ratio(
        c["round-robin"].get("ttft_p50_ms"), c["wsmode-affinity"].get("ttft_p50_ms")
    )
    out["cached_share_affinity_over_ideal"] = _ratio(
        c["wsmode-affinity"].get("cached_share"), c["ideal"].get("cached_share")
    )
    return out

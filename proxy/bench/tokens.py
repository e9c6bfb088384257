"""Scenario "tokens": the token path (`upstream.api = "tokens"`) against the chat path
(`upstream.api = "chat"`), the same conversations in front of the same kind of model server.

On the chat path the server renders the chat template over the whole history and tokenises
all of it every turn; on the token path wsmode renders it, keeps each response's prompt and
generated ids, and asks the server to tokenise only the newly rendered text
(docs/bench-tokens.md). For each history size (in the server's tokens) a conversation opens
with one long user message of about that size, then `turns` short continuations over
WebSocket mode with `previous_response_id` (`store: false`). Each path has its own wsmode
and its own upstream process, started once for the scenario; sizes and paths are interleaved
(rep 1: 1K chat, 1K tokens, 8K tokens, 8K chat, ...; rep 2 the other way round).

Measured per continuation turn (the first, long, turn is not counted):
- TTFT at the client (to the first output text delta) and TTFE (to the first event);
- time outside the model: TTFT minus the model's own time to its first token: the sim's
  configured `ttft_ms` (its "model" adds exactly that after its preprocessing), or on
  llama.cpp the `timings` llama.cpp reports for the turn (tokens_llamacpp.py `Tap`);
- the upstream's own preprocessing: the sim's tokenising time and tokens (`/sim/stats`
  `tokenize_ms`, `tokenized_tokens`, read after every turn); on llama.cpp the server's time
  outside the model on the turn's requests, and the tokens it tokenised;
- cache reuse (token path): cached_tokens / (previous turn's input + output tokens), from the
  usage the client sees (`input_tokens_details.cached_tokens` = llama.cpp's `cache_n`);
- wsmode's CPU per turn (/proc/PID, every thread, over the continuations of a conversation);
- divergences: `wsmode_token_divergences_total` from wsmode's /metrics, summed over reasons.

`llamacpp_model` runs the same against real llama.cpp (../shared/upstreams/xlc_serve.py),
one server per path, each behind a timing tap.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from .clients import HEADERS, TERMINAL, event_type, wait_ready, ws_connect
from .procs import (
    TOKENIZE_US_PER_TOKEN,
    BenchError,
    Server,
    Servers,
    free_port,
    sim_env,
    start_sim,
    wsmode_command,
)
from .stats import median
from .tokens_llamacpp import Tap, start_llamacpp

PATHS = ("chat", "tokens")
KTOK = 1024
_MAX_EVENTS = 10_000  # per turn: far more than a short answer has
_WORDS = "alpha beta gamma delta kappa sigma omega river stone cloud paper linen ember".split()
_DIVERGENCE = re.compile(r"^wsmode_token_divergences_total\{[^}]*\}\s+([0-9.e+]+)$", re.M)


@dataclass(frozen=True)
class TokensProfile:
    sizes: tuple[int, ...] = tuple(k * KTOK for k in (1, 2, 4, 8, 16, 32))  # history tokens
    turns: int = 6  # short continuations after the long first turn (each measured)
    reps: int = 5  # interleaved repetitions of every (size, path)
    turn_tokens: int = 24  # each continuation's new user message, about
    output_tokens: int = 16  # each answer
    ttft_ms: float = 20.0  # the sim's model time before its first token
    tokenize_us_per_token: float = TOKENIZE_US_PER_TOKEN  # real llama.cpp's, about
    turn_timeout: float = 120.0  # seconds; a slower turn fails the scenario


DEFAULT = TokensProfile()
QUICK = TokensProfile(sizes=(1 * KTOK, 8 * KTOK, 32 * KTOK), turns=4, reps=2)
SMOKE = TokensProfile(sizes=(1 * KTOK, 4 * KTOK), turns=3, reps=2)


@dataclass
class TurnSample:
    ttft_ms: float = 0.0  # to the first output text delta
    ttfe_ms: float = 0.0  # to the first event
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    tokenize_ms: float | None = None  # the upstream's preprocessing during the turn
    tokenized_tokens: int | None = None
    model_ms: float | None = None  # llama.cpp's own time to the first text (None: the sim's)
    response_id: str = ""


@dataclass
class Upstream:
    """One path's model server and the wsmode in front of it."""

    path: str
    server: Server
    proxy: Server
    is_sim: bool
    model: str
    last_stats: dict[str, Any] = field(default_factory=dict)
    tap: Tap | None = None  # in front of llama.cpp


def _text(tokens: int, chars_per_token: float, *seed: object) -> str:
    """About `tokens` of the server's tokens of words, the same for the same seed."""
    rng = random.Random(":".join(map(str, seed)))
    words = [" ".join(map(str, seed)) + ":"]
    size, want = len(words[0]), int(tokens * chars_per_token)
    while size < want:
        word = rng.choice(_WORDS)
        words.append(word)
        size += len(word) + 1
    return " ".join(words)


async def _get_json(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with session.get(url) as r:
        if r.status != 200:
            raise BenchError(f"GET {url}: HTTP {r.status}")
        doc: dict[str, Any] = orjson.loads(await r.read())
        return doc


async def _divergences(session: aiohttp.ClientSession, proxy: Server) -> int:
    async with session.get(f"{proxy.base}/metrics") as r:
        text = await r.text()
    return int(sum(float(v) for v in _DIVERGENCE.findall(text)))


async def _chars_per_token(session: aiohttp.ClientSession, up: Upstream) -> float:
    """Characters of `_text` per server token, from the server's own /tokenize (without
    the sim's tokenising cost counted against a turn: this runs before any)."""
    sample = _text(1000, 4.0, "calibration")
    body = {"content": sample, "add_special": False, "parse_special": True}
    async with session.post(f"{up.server.base}/tokenize", json=body) as r:
        if r.status != 200:
            raise BenchError(f"{up.path}: /tokenize answered HTTP {r.status}")
        ids = (await r.json())["tokens"]
    return len(sample) / max(1, len(ids))


def _tapped(up: Upstream, turn: TurnSample) -> None:
    """On llama.cpp: the turn's model time and the server's preprocessing, from the tap."""
    if up.tap is None:
        return
    seen = up.tap.take()
    generations = [x for x in seen if x.timings is not None]
    if not generations:
        raise BenchError(f"{up.path}: llama.cpp reported no timings for the turn")
    turn.model_ms = round(generations[0].model_ms(), 3)
    turn.tokenize_ms = round(sum(x.outside_ms() for x in seen), 3)
    turn.tokenized_tokens = sum(x.server_tokenized() for x in seen)


async def _sim_stats(session: aiohttp.ClientSession, up: Upstream) -> tuple[float, int] | None:
    """The sim's tokenising since the last call: (ms, tokens); None on llama.cpp."""
    if not up.is_sim:
        return None
    doc = await _get_json(session, f"{up.server.base}/sim/stats")
    before, up.last_stats = up.last_stats, doc
    ms = float(doc["tokenize_ms"]) - float(before.get("tokenize_ms", 0.0))
    return ms, int(doc["tokenized_tokens"]) - int(before.get("tokenized_tokens", 0))


async def _turn(ws: aiohttp.ClientWebSocketResponse, create: dict[str, Any]) -> TurnSample:
    """Send one `response.create`; read its events to the terminal one."""
    turn = TurnSample()
    sent = time.perf_counter()
    await ws.send_frame(orjson.dumps(create), aiohttp.WSMsgType.TEXT)
    for _ in range(_MAX_EVENTS):
        msg = await ws.receive()
        if msg.type is not aiohttp.WSMsgType.TEXT:
            raise BenchError(f"the socket answered {msg.type.name}: {msg.data!r}")
        now = (time.perf_counter() - sent) * 1000
        turn.ttfe_ms = turn.ttfe_ms or now
        kind = event_type(msg.data)
        if kind == "response.output_text.delta" and not turn.ttft_ms:
            turn.ttft_ms = now
        if kind not in TERMINAL:
            continue
        ev = orjson.loads(msg.data)
        if kind not in ("response.completed", "response.incomplete"):  # (the output limit)
            raise BenchError(f"the turn ended with {kind}: {str(ev)[:400]}")
        usage = ev["response"].get("usage") or {}
        turn.input_tokens = int(usage.get("input_tokens") or 0)
        turn.output_tokens = int(usage.get("output_tokens") or 0)
        details = usage.get("input_tokens_details") or {}
        turn.cached_tokens = int(details.get("cached_tokens") or 0)
        turn.response_id = str(ev["response"]["id"])
        if not turn.ttft_ms:
            raise BenchError("the turn completed without an output text delta")
        return turn
    raise BenchError(f"no terminal event in {_MAX_EVENTS} events")


async def conversation(
    session: aiohttp.ClientSession,
    up: Upstream,
    p: TokensProfile,
    size: int,
    chars_per_token: float,
    rep: int,
) -> dict[str, Any]:
    """One conversation: the long first turn, then `p.turns` measured continuations."""
    ws = await ws_connect(session, f"ws://{up.proxy.host}:{up.proxy.port}/v1/responses")
    samples: list[TurnSample] = []
    try:
        await _sim_stats(session, up)  # the baseline of the counters
        if up.tap is not None:
            up.tap.take()  # what came before is no turn's
        previous: TurnSample | None = None
        cpu_from = cpu_to = up_from = up_to = 0
        for t in range(p.turns + 1):
            tokens = size if t == 0 else p.turn_tokens
            text = _text(tokens, chars_per_token, "rep", rep, "size", size, "turn", t)
            create: dict[str, Any] = {"type": "response.create", "model": up.model}
            create["store"] = False
            if not up.is_sim:  # the sim's answers are `output_tokens` words long anyway
                create["max_output_tokens"] = p.output_tokens
            create["input"] = [{"type": "message", "role": "user", "content": text}]
            if previous is not None:
                create["previous_response_id"] = previous.response_id
            if t == 1:
                cpu_from, up_from = up.proxy.cpu_ns(), up.server.cpu_ns()
            turn = await asyncio.wait_for(_turn(ws, create), p.turn_timeout)
            cpu_to, up_to = up.proxy.cpu_ns(), up.server.cpu_ns()
            counted = await _sim_stats(session, up)
            if counted is not None:
                turn.tokenize_ms, turn.tokenized_tokens = counted
            _tapped(up, turn)
            previous = turn
            samples.append(turn)
    finally:
        await ws.close()
    return {
        "first": asdict(samples[0]),
        "turns": [asdict(s) for s in samples[1:]],
        "reuse": [
            round(b.cached_tokens / (a.input_tokens + a.output_tokens), 5)
            for a, b in itertools.pairwise(samples)
            if a.input_tokens + a.output_tokens
        ],
        "wsmode_cpu_ms_per_turn": round((cpu_to - cpu_from) / 1e6 / p.turns, 3),
        # the model server's process: its tokenising and the rest of its handling
        "upstream_cpu_ms_per_turn": round((up_to - up_from) / 1e6 / p.turns, 3),
    }


async def _start_proxy(servers: Servers, path: str, upstream: str, read_timeout: float) -> Server:
    port = free_port()
    env = {
        "WSMODE_UPSTREAM_URL": f"{upstream}/v1",
        "WSMODE_UPSTREAM_API": path,
        "WSMODE_UPSTREAM_READ_TIMEOUT": str(read_timeout),
        "WSMODE_SERVER_LOG_LEVEL": "WARNING",
    }
    cmd = wsmode_command(["serve", "--host", "127.0.0.1", "--port", str(port)])
    return await servers.start(f"wsmode-{path}", cmd, "127.0.0.1", port, env)


def sim_settings(p: TokensProfile, context: int) -> dict[str, str]:
    return sim_env(
        ttft_ms=p.ttft_ms, tokens_per_second=0.0, output_tokens=p.output_tokens,
        tool_calls_per_turn=0, tokenize_us_per_token=p.tokenize_us_per_token,
        context_window=context,
    )  # fmt: skip


async def _start(
    servers: Servers,
    session: aiohttp.ClientSession,
    p: TokensProfile,
    model: Path | None,
    taps: list[Tap],
) -> dict[str, Upstream]:
    context = max(p.sizes) * 2 + 8 * KTOK  # the longest conversation, with room to spare

    async def one(path: str) -> Upstream:
        tap: Tap | None = None
        if model is None:
            server = await start_sim(servers, sim_settings(p, context))
        else:
            server = await start_llamacpp(servers, model, context, f"llamacpp-{path}")
            tap = Tap(server.base)
            taps.append(tap)
            await tap.start()
        proxy = await _start_proxy(servers, path, tap.base if tap else server.base, p.turn_timeout)
        await wait_ready(proxy.base, 60.0)
        name = "sim" if model is None else "tiny"
        return Upstream(path, server, proxy, model is None, name, tap=tap)

    # both paths start side by side; a failure is raised once neither is still starting
    done = await asyncio.gather(*(one(path) for path in PATHS), return_exceptions=True)
    for result in done:
        if isinstance(result, BaseException):
            raise result
    return {up.path: up for up in done if isinstance(up, Upstream)}


def _outside(turn: dict[str, Any], ttft_ms: float) -> float:
    """A turn's TTFT minus the model's own time to its first token."""
    model = turn.get("model_ms")
    return float(turn["ttft_ms"]) - (ttft_ms if model is None else float(model))


def _summary(convs: list[dict[str, Any]], ttft_ms: float) -> dict[str, Any]:
    """One (size, path): medians over every measured turn of every repetition."""
    turns = [t for c in convs for t in c["turns"]]
    models = [t["model_ms"] for t in turns if t.get("model_ms") is not None]
    tok = [t["tokenize_ms"] for t in turns if t["tokenize_ms"] is not None]
    reuse = [r for c in convs for r in c["reuse"]]
    return {
        "history_tokens": median([c["turns"][-1]["input_tokens"] for c in convs]),
        "first_turn_input_tokens": median([c["first"]["input_tokens"] for c in convs]),
        "ttft_p50_ms": round(median([t["ttft_ms"] for t in turns]), 3),
        "ttfe_p50_ms": round(median([t["ttfe_ms"] for t in turns]), 3),
        "outside_model_p50_ms": round(median([_outside(t, ttft_ms) for t in turns]), 3),
        "model_p50_ms": round(median(models), 3) if models else None,
        "tokenize_p50_ms": round(median(tok), 3) if tok else None,
        "tokenized_tokens_p50": median([t["tokenized_tokens"] for t in turns]) if tok else None,
        "reuse_p50": round(median(reuse), 5) if reuse else None,
        "reuse_min": min(reuse) if reuse else None,
        "wsmode_cpu_ms_per_turn": round(median([c["wsmode_cpu_ms_per_turn"] for c in convs]), 3),
        "upstream_cpu_ms_per_turn": round(
            median([c["upstream_cpu_ms_per_turn"] for c in convs]), 3
        ),
        # per repetition, for the same-run ratios' spread (docs/bench-tokens.md)
        "reps": [
            {
                "outside_model_ms": median([_outside(t, ttft_ms) for t in c["turns"]]),
                "tokenize_ms": median([t["tokenize_ms"] or 0.0 for t in c["turns"]]),
                "wsmode_cpu_ms_per_turn": c["wsmode_cpu_ms_per_turn"],
            }
            for c in convs
        ],
    }


async def run(
    p: TokensProfile, log: Callable[[str], None], llamacpp_model: Path | None = None
) -> dict[str, Any]:
    upstream = "llama.cpp " + str(llamacpp_model) if llamacpp_model else "wsmode sim"
    out: dict[str, Any] = {"profile": asdict(p), "upstream": upstream, "sizes": []}
    servers = Servers()
    taps: list[Tap] = []
    timeout = aiohttp.ClientTimeout(total=None, sock_read=p.turn_timeout)
    raw: dict[tuple[int, str], list[dict[str, Any]]] = {(s, x): [] for s in p.sizes for x in PATHS}
    try:
        async with aiohttp.ClientSession(timeout=timeout, headers=HEADERS) as session:
            ups = await _start(servers, session, p, llamacpp_model, taps)
            cpt = {x: await _chars_per_token(session, ups[x]) for x in PATHS}
            for x in PATHS:  # warm-up, not measured: first imports, caches, the template
                await conversation(session, ups[x], p, min(p.sizes), cpt[x], -1)
            for up in ups.values():  # the calibration's tokenising is not any turn's
                await _sim_stats(session, up)
            div0 = {x: await _divergences(session, ups[x].proxy) for x in PATHS}
            for rep in range(p.reps):
                for i, size in enumerate(p.sizes):
                    order = PATHS if (rep + i) % 2 == 0 else PATHS[::-1]
                    for path in order:
                        c = await conversation(session, ups[path], p, size, cpt[path], rep)
                        raw[size, path].append(c)
                log(f"  repetition {rep + 1}/{p.reps} done")
            div = {x: await _divergences(session, ups[x].proxy) - div0[x] for x in PATHS}
    finally:
        for tap in taps:
            await tap.close()
        servers.stop_all()
    for size in p.sizes:
        row: dict[str, Any] = {"size_tokens": size}
        for path in PATHS:
            row[path] = _summary(raw[size, path], p.ttft_ms)
        out["sizes"].append(row)
        c, t = row["chat"], row["tokens"]
        log(
            f"  {size // KTOK:>3}K  outside the model: chat {c['outside_model_p50_ms']:>8.2f} ms,"
            f" tokens {t['outside_model_p50_ms']:>8.2f} ms; tokenising: chat"
            f" {c['tokenize_p50_ms']} ms, tokens {t['tokenize_p50_ms']} ms; reuse"
            f" {t['reuse_p50']}; wsmode CPU/turn chat {c['wsmode_cpu_ms_per_turn']:.2f} ms,"
            f" tokens {t['wsmode_cpu_ms_per_turn']:.2f} ms"
        )
    out["divergences"] = div
    out["chars_per_token"] = {x: round(v, 3) for x, v in cpt.items()}
    log(f"  divergences: {div}")
    return out

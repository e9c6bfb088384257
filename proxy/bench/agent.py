"""Scenario "agent-loop": a scripted coding agent over an emulated WAN link.

The agent sends a first prompt, then answers every tool call with a tool output, until the
simulated model answers in text (after `tool_calls` calls). Contenders, interleaved in one
run (A B C A B C ...):

- http-direct: HTTP straight to the model with the full history every turn, on one
  keep-alive connection, as the SDKs do;
- ws-wsmode: WebSocket mode through `wsmode serve`: each turn sends only the tool output
  and `previous_response_id`; wsmode sends the model the whole history (`/v1/responses`);
- ws-wsmode-tokens: the same through a `wsmode serve` with `upstream.api = "tokens"` in
  front of the same model's llama.cpp `/completion`: wsmode sends the model token ids, and
  the model tokenises only each turn's new text (docs/tokens.md);
- http-sidecar: the same HTTP client pointed at a local `wsmode sidecar`, which holds a
  WebSocket-mode connection to `wsmode serve` (left out, with a note, if it fails to start).

The link sits between the client side (the agent, and the sidecar) and the server side (the
model for http-direct; wsmode for the others); wsmode to the model is loopback. The model
charges `tokenize_us_per_token` for every token it tokenises, as a real server does when it
renders and tokenises the history: the whole history per turn on `/v1/responses`, only the
new text on the token path. The ideal is the model's own time (time to first token plus the
paced tokens), the tokenising of each turn's new input, sending that input over the uplink
(its JSON at the link's rate: no protocol can send less), and one round trip per turn. Each
loop's connection is opened before its clock starts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import aiohttp
import orjson

from ..sim.model import count_tokens
from .clients import Turn, http_turn, wait_ready, ws_connect, ws_turn
from .link import WAN_HOST, NetemLink, ShimLink
from .procs import (
    TOKENIZE_US_PER_TOKEN,
    BenchError,
    Servers,
    free_port,
    sim_env,
    start_proxy,
    start_sidecar,
    start_sim,
)

HTTP_DIRECT, WS_WSMODE, HTTP_SIDECAR = "http-direct", "ws-wsmode", "http-sidecar"
WS_TOKENS = "ws-wsmode-tokens"  # WebSocket mode through wsmode's token path
# the model's context, in tokens: the token path's prompts are the vocabulary's ids (about
# 2 bytes each), the longest loop's history (about 300 KB) fits with room to spare
CONTEXT_TOKENS = 1 << 20
TOOLS = [
    {
        "type": "function",
        "name": "shell",
        "description": "Run a shell command in the repository and return its output.",
        "parameters": {
            "type": "object",
            "properties": {"n": {"type": "integer"}, "q": {"type": "string"}},
            "required": ["q"],
        },
    }
]
_WORDS = (
    "def class return import self value result error test build file line module config "
    "path index token stream event socket buffer cache request response client server"
).split()


@dataclass(frozen=True)
class AgentProfile:
    """The default is the coding-agent loop the targets are set for (docs/bench.md, "The
    scenarios"): 30 tool calls of 8 KiB outputs after a 20 KiB first prompt."""

    tool_calls: int = 30
    tool_output_bytes: int = 8 * 1024
    first_prompt_bytes: int = 20 * 1024
    ttft_ms: float = 50.0
    tokens_per_second: float = 1000.0
    output_tokens: int = 60
    # the model's tokenising, per token of every text it tokenises (docs/bench.md "The agent
    # loop"): the same cost as in the tokens scenario, real llama.cpp's with Gemma 3's vocabulary
    tokenize_us_per_token: float = TOKENIZE_US_PER_TOKEN
    # the first prompt is sent before the clock (as the connection is opened), so a shorter
    # loop that starts from a larger prompt does not time that prompt's one upload: the timed
    # turns are the tool-output turns, each as in the full loop (docs/bench.md "Quick ...")
    prompt_before_clock: bool = False


@dataclass(frozen=True)
class Cell:
    rtt_ms: float
    uplink_mbit: float
    reps: int
    sidecar: bool = True  # run the http-sidecar contender in this cell (no target reads it)


@dataclass
class Loop:
    seconds: float
    turns: int
    model_seconds: float  # the simulated model's own time, summed over turns
    tokenize_seconds: float  # the model tokenising each turn's new input, summed (the ideal's)
    bytes_sent: int  # request bodies / frames the client wrote
    new_input_bytes: int  # each turn's new input items as JSON, summed (the ideal sends these)
    history_bytes: int  # the conversation's JSON size at the end
    connect_s: float = 0.0  # opening the connection, before (outside) `seconds`


class Link(Protocol):
    method: str
    rtt_ms: float

    def address(self, host: str, port: int) -> tuple[str, int]: ...

    async def set(self, rtt_ms: float, up_mbit: float, down_mbit: float = 0.0) -> None: ...

    def close(self) -> None: ...


def _text(nbytes: int, seed: int) -> str:
    rng = random.Random(seed)
    words: list[str] = []
    size = 0
    while size < nbytes:
        w = rng.choice(_WORDS)
        words.append(w)
        size += len(w) + 1
    return " ".join(words)[:nbytes]


def _model_time(profile: AgentProfile, deltas: int) -> float:
    paced = (deltas - 1) / profile.tokens_per_second if profile.tokens_per_second else 0.0
    return profile.ttft_ms / 1000 + max(paced, 0.0)


def _next_input(profile: AgentProfile, response: dict[str, Any], k: int) -> list[dict[str, Any]]:
    calls = [i for i in response["output"] if i.get("type") == "function_call"]
    return [
        {
            "type": "function_call_output",
            "call_id": c["call_id"],
            "output": _text(profile.tool_output_bytes, seed=k * 100 + j),
        }
        for j, c in enumerate(calls)
    ]


def _settings(*, untimed: bool = False) -> dict[str, Any]:
    """A turn's settings; `untimed`: a turn before the clock, whose tokenising the model
    does not charge (`sim_untimed`: only the timed turns' model time is the question)."""
    settings: dict[str, Any] = {"model": "sim", "tools": TOOLS, "tool_choice": "auto"}
    settings["store"] = False
    if untimed:
        settings["metadata"] = {"sim_untimed": "true"}
    return settings


@dataclass
class _Tally:
    """One agent loop so far: the conversation, the bytes sent, the model's own time."""

    profile: AgentProfile
    history: list[Any]
    sent: int = 0
    new_bytes: int = 0
    model: float = 0.0
    tokenize: float = 0.0
    t0: float = field(default_factory=time.perf_counter)

    def sending(self, items: list[Any]) -> None:
        """A turn's new input: the ideal sends and tokenises it (and nothing else) once."""
        cost = self.profile.tokenize_us_per_token / 1e6
        self.tokenize += cost * count_tokens({"input": items}) if items else 0.0
        self.new_bytes += len(orjson.dumps(items))

    def add(self, turn: Turn, k: int) -> list[Any]:
        """Count turn `k`; the next input (the tool outputs), empty once the model answered."""
        self.model += _model_time(self.profile, turn.deltas)
        new = _next_input(self.profile, turn.response, k)
        self.history += [*turn.response["output"], *new]
        return new

    def restart(self) -> None:
        """Start the clock (again) here: what came before is not counted."""
        self.sent, self.new_bytes, self.model, self.tokenize = 0, 0, 0.0, 0.0
        self.t0 = time.perf_counter()

    def loop(self, turns: int) -> Loop:
        seconds = time.perf_counter() - self.t0
        size = len(orjson.dumps(self.history))
        return Loop(seconds, turns, self.model, self.tokenize, self.sent, self.new_bytes, size)


# Both contenders time the loop on a connection that is already open, as an agent session
# keeps its connection (Codex opens and prewarms its socket before the first prompt): the
# WebSocket upgrade is a round trip of its own (RFC 6455 4.1) that HTTP's first request does
# not wait for, paid once per session, not per loop. Each loop's connection time is reported
# beside it (`connect_s`), outside the timed span of both (docs/bench.md "The agent loop").


async def http_loop(url: str, profile: AgentProfile, *, untimed: bool = True) -> Loop:
    """Full history every turn, on one keep-alive connection opened before the clock.
    `untimed`: the turn before the clock says so to the model (`sim_untimed`); not through
    the sidecar, which would take the timed turn's other metadata for a new conversation
    and send the whole history again."""
    first = {"type": "message", "role": "user", "content": _text(profile.first_prompt_bytes, 1)}
    connector = aiohttp.TCPConnector(limit=1)
    async with aiohttp.ClientSession(connector=connector) as session:
        opened = time.perf_counter()
        models = url.rsplit("/responses", 1)[0] + "/models"
        async with session.get(models) as r:  # opens the connection the loop then reuses
            await r.read()
        tally = _Tally(profile, [first])
        connect_s = tally.t0 - opened
        skip = int(profile.prompt_before_clock)
        new: list[Any] = [first]
        for k in range(profile.tool_calls + 2):  # bounded: the model answers after tool_calls
            if k == skip:
                tally.restart()
            tally.sending(new)
            settings = _settings(untimed=untimed and k < skip)
            body = orjson.dumps({**settings, "input": tally.history, "stream": True})
            tally.sent += len(body)
            new = tally.add(await http_turn(session, url, body), k)
            if not new:
                loop = tally.loop(k + 1 - skip)
                loop.connect_s = connect_s
                return loop
    raise BenchError("the agent loop did not end within its turn bound")


async def ws_loop(url: str, profile: AgentProfile) -> Loop:
    """WebSocket mode: the first turn sends the prompt, then only tool outputs."""
    first = {"type": "message", "role": "user", "content": _text(profile.first_prompt_bytes, 1)}
    new: list[Any] = [first]
    previous: str | None = None
    async with aiohttp.ClientSession() as session:
        opened = time.perf_counter()
        ws = await ws_connect(session, url)
        tally = _Tally(profile, [first])
        connect_s = tally.t0 - opened  # TCP and the upgrade, before the clock
        skip = int(profile.prompt_before_clock)
        try:
            for k in range(profile.tool_calls + 2):
                if k == skip:
                    tally.restart()
                tally.sending(new)
                create = {"type": "response.create", **_settings(untimed=k < skip), "input": new}
                if previous:
                    create["previous_response_id"] = previous
                frame = orjson.dumps(create)
                tally.sent += len(frame)
                turn = await ws_turn(ws, frame)
                previous = turn.response["id"]
                new = tally.add(turn, k)
                if not new:
                    loop = tally.loop(k + 1 - skip)
                    loop.connect_s = connect_s
                    return loop
        finally:
            await ws.close()
    raise BenchError("the agent loop did not end within its turn bound")


def ideal_upload_s(new_input_bytes: int, uplink_mbit: float) -> float:
    """The least time the loop's new input can take to cross the uplink: its bytes at the
    link's rate, with no framing and no history."""
    return new_input_bytes * 8 / (uplink_mbit * 1e6)


def _summary(loops: list[Loop], errors: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"runs_s": [round(lp.seconds, 4) for lp in loops], "errors": errors}
    if loops:
        out.update(
            median_s=round(statistics.median(lp.seconds for lp in loops), 4),
            turns=loops[0].turns,
            bytes_sent=loops[0].bytes_sent,
            new_input_bytes=loops[0].new_input_bytes,
            history_bytes=loops[0].history_bytes,
            model_s=round(loops[0].model_seconds, 4),
            ideal_tokenize_s=round(loops[0].tokenize_seconds, 4),
            connect_s=round(statistics.median(lp.connect_s for lp in loops), 4),
        )
    return out


async def run_cells(
    profile: AgentProfile, cells: list[Cell], link_kind: str, log: Callable[[str], None]
) -> dict[str, Any]:
    """Start the programs, then run every cell's loops, contenders interleaved."""
    servers = Servers()
    link: Link | None = None
    notes: list[str] = []
    try:
        env = sim_env(
            ttft_ms=profile.ttft_ms,
            tokens_per_second=profile.tokens_per_second,
            output_tokens=profile.output_tokens,
            tool_calls_per_turn=profile.tool_calls,
            tokenize_us_per_token=profile.tokenize_us_per_token,
            context_window=CONTEXT_TOKENS,
        )
        # the programs start side by side: their ports are chosen first, so wsmode and the
        # link know where the others will listen before those do
        wan = WAN_HOST if link_kind == "netem" else "127.0.0.1"
        sim_port, proxy_port, tokens_port = free_port(), free_port(wan), free_port(wan)
        direct = (wan, free_port(wan)) if link_kind == "netem" else ("127.0.0.1", sim_port)
        model = f"http://127.0.0.1:{sim_port}/v1"
        starts: list[Awaitable[Any]] = [
            start_sim(servers, env, port=sim_port),
            start_proxy(servers, model, host=wan, port=proxy_port),
            start_proxy(
                servers, model, host=wan, port=tokens_port, env={"WSMODE_UPSTREAM_API": "tokens"}
            ),
        ]
        if link_kind == "netem":
            starts.append(start_sim(servers, env, host=direct[0], port=direct[1]))
            link = NetemLink()
        else:
            starts.append(ShimLink.start([direct, (wan, proxy_port), (wan, tokens_port)]))
        started = await asyncio.gather(*starts, return_exceptions=True)
        if link_kind != "netem" and isinstance(started[-1], ShimLink):
            link = started[-1]
        for result in started:
            if isinstance(result, BaseException):
                raise result
        assert link is not None
        await wait_ready(f"http://{wan}:{tokens_port}", 60.0)  # its probe of the model's /props
        await link.set(cells[0].rtt_ms, cells[0].uplink_mbit)
        dh, dp = link.address(*direct)
        ph, pp = link.address(wan, proxy_port)
        th, tp = link.address(wan, tokens_port)
        runners: dict[str, Callable[[], Awaitable[Loop]]] = {
            HTTP_DIRECT: lambda: http_loop(f"http://{dh}:{dp}/v1/responses", profile),
            WS_WSMODE: lambda: ws_loop(f"ws://{ph}:{pp}/v1/responses", profile),
            WS_TOKENS: lambda: ws_loop(f"ws://{th}:{tp}/v1/responses", profile),
        }
        if any(cell.sidecar for cell in cells):
            try:
                sidecar = await start_sidecar(servers, f"http://{ph}:{pp}/v1")
                url = f"{sidecar.base}/v1/responses"
                runners[HTTP_SIDECAR] = lambda: http_loop(url, profile, untimed=False)
            except BenchError as exc:
                notes.append(f"http-sidecar skipped: {exc}")
        results = []
        for cell in cells:
            await link.set(cell.rtt_ms, cell.uplink_mbit)
            here = {n: r for n, r in runners.items() if cell.sidecar or n != HTTP_SIDECAR}
            loops: dict[str, list[Loop]] = {name: [] for name in here}
            errors: dict[str, list[str]] = {name: [] for name in here}
            for rep in range(cell.reps):
                for name, run in here.items():
                    try:
                        loops[name].append(await asyncio.wait_for(run(), 300))
                    except (BenchError, aiohttp.ClientError, OSError, TimeoutError) as exc:
                        errors[name].append(f"{type(exc).__name__}: {exc}"[:300])
                    done = loops[name][-1].seconds if loops[name] else float("nan")
                    log(
                        f"  agent-loop rtt={cell.rtt_ms:g}ms up={cell.uplink_mbit:g}Mbit/s "
                        f"rep {rep + 1}/{cell.reps} {name}: {done:.3f}s"
                    )
            summary = {name: _summary(loops[name], errors[name]) for name in here}
            first = next((lp[0] for lp in loops.values() if lp), None)
            turns = first.turns if first else 0
            floor = first.model_seconds + first.tokenize_seconds if first else 0.0
            upload = ideal_upload_s(first.new_input_bytes if first else 0, cell.uplink_mbit)
            results.append(
                {
                    "rtt_ms": cell.rtt_ms,
                    "uplink_mbit": cell.uplink_mbit,
                    "reps": cell.reps,
                    "ideal_s": round(floor + upload + turns * cell.rtt_ms / 1000, 4),
                    "ideal_upload_s": round(upload, 4),
                    "contenders": summary,
                }
            )
        return {"link": link.method, "profile": asdict(profile), "cells": results, "notes": notes}
    finally:
        if link is not None:
            link.close()
        servers.stop_all()


def main() -> None:
    """Worker entry point, run inside the netem namespace: JSON in (argv), JSON out (stdout)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("params")
    doc = json.loads(ap.parse_args().params)
    profile = AgentProfile(**doc["profile"])
    cells = [Cell(**c) for c in doc["cells"]]

    def log(line: str) -> None:
        print(json.dumps({"log": line}), flush=True)

    result = asyncio.run(run_cells(profile, cells, "netem", log))
    print(json.dumps({"result": result}), flush=True)


if __name__ == "__main__":
    main()

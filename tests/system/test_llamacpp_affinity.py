"""Two REAL llama.cpp servers (../shared/upstreams, `llamacpp_pair`): a conversation's later
turns are served from a server's prompt cache only on the server that has seen its history.

What llama.cpp reports (seen here, build of xllamacpp 2026.10): on `/v1/chat/completions` the
usage chunk (sent with `stream_options.include_usage`) carries
`usage.prompt_tokens_details.cached_tokens`, and the finish and usage chunks a non-standard
`timings` object whose `cache_n` is the same count (`prompt_n` the tokens it computed); on
`/v1/responses` the `response.completed` event's `usage.input_tokens_details.cached_tokens`,
with the same `timings` beside the response. With one slot per server (`--parallel 1`) the
slot keeps the last prompt and its host-memory prompt cache (`cache_ram_mib`, 8 GiB by
default) keeps earlier ones, so a server that saw a conversation's previous turn finds it
again; a server that never saw it computes the whole prompt.

`test_llamacpp_reports_the_prompt_cache_per_server` checks those reports against llama.cpp
itself. The two wsmode tests put wsmode's upstream pool (`upstream.urls`, `upstream.affinity`,
docs/pool.md) in front of both servers: with conversation affinity every later turn is served
from the cache of the server that has the history; without it (round robin) a turn that
lands on the server that never saw the conversation is computed whole.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import orjson
import pytest
from websockets.asyncio.client import connect
from wsmode.core.sse import SSEDecoder

from tests.support.helpers import Proxy, create, seconds, send, until_terminal, user
from tests.support.llamacpp_server import TURN_TIMEOUT

# The first test that asks for the servers may install it (about 10 s plus the model download,
# tests/support/llamacpp_server.py) and start them; a test itself takes up to 3 s here.
pytestmark = [pytest.mark.llamacpp, pytest.mark.timeout(seconds(600))]

ProxyFactory = Callable[..., Awaitable[Proxy]]
MODEL = "gemma-3-270m"
SAMPLING = {"temperature": 0, "max_tokens": 8}
HIGH = 0.7  # a turn served from the cache: at least this share of its prompt was cached
LOW = 0.3  # a turn computed again: at most this share (the chat template's first tokens)


def _opening() -> str:
    """A first message of about 200 tokens no server has seen (it starts with a nonce)."""
    facts = " ".join(
        f"Fact {i}: the parcel for depot {i} leaves at {i % 12 + 1} o'clock." for i in range(10)
    )
    return f"Session {uuid.uuid4().hex}. Remember these facts. {facts}"


async def _chat(url: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """One streamed chat turn: the answer text, the usage and llama.cpp's `timings`."""
    body = {"model": MODEL, "messages": messages, "stream": True, **SAMPLING}
    body["stream_options"] = {"include_usage": True}
    text, usage, timings = "", None, None
    decoder = SSEDecoder(1 << 24)
    timeout = aiohttp.ClientTimeout(total=TURN_TIMEOUT)
    async with (
        aiohttp.ClientSession(timeout=timeout) as http,
        http.post(f"{url}/chat/completions", json=body) as r,
    ):
        assert r.status == 200, await r.text()
        async for chunk in r.content.iter_any():
            for ev in decoder.feed(chunk):
                if ev.data == b"[DONE]":
                    continue
                doc = orjson.loads(ev.data)
                for choice in doc.get("choices") or []:
                    text += (choice.get("delta") or {}).get("content") or ""
                usage = doc.get("usage") or usage
                timings = doc.get("timings") or timings
    assert usage is not None and timings is not None, "llama.cpp sent no usage or timings"
    return {"text": text, "usage": usage, "timings": timings}


def _chat_share(turn: dict[str, Any]) -> float:
    usage, timings = turn["usage"], turn["timings"]
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    assert cached == timings["cache_n"]  # the two reports agree
    assert usage["prompt_tokens"] == timings["cache_n"] + timings["prompt_n"]
    return float(cached / usage["prompt_tokens"])


async def _responses_cached(url: str, items: list[dict[str, Any]]) -> tuple[int, int]:
    """(input tokens, cached tokens) of one streamed `/v1/responses` turn."""
    body = {"model": MODEL, "input": items, "stream": True, "temperature": 0}
    body["max_output_tokens"] = 8
    decoder = SSEDecoder(1 << 24)
    final = None
    timeout = aiohttp.ClientTimeout(total=TURN_TIMEOUT)
    async with (
        aiohttp.ClientSession(timeout=timeout) as http,
        http.post(f"{url}/responses", json=body) as r,
    ):
        assert r.status == 200, await r.text()
        async for chunk in r.content.iter_any():
            for ev in decoder.feed(chunk):
                doc = orjson.loads(ev.data) if ev.data != b"[DONE]" else {}
                if doc.get("type") == "response.completed":
                    final = doc
    assert final is not None
    usage = final["response"]["usage"]
    return usage["input_tokens"], usage["input_tokens_details"]["cached_tokens"]


async def test_llamacpp_reports_the_prompt_cache_per_server(
    llamacpp_pair: tuple[str, str],
) -> None:
    """The premise of affinity, on the real servers: the next turn on the server that served
    the previous one is mostly cached; the same turn on the other server is computed whole."""
    a, b = llamacpp_pair
    messages = [{"role": "user", "content": _opening()}]
    first = await _chat(a, messages)
    assert _chat_share(first) < LOW  # nobody has seen this conversation
    messages += [
        {"role": "assistant", "content": first["text"]},
        {"role": "user", "content": "Which depot leaves at 3?"},
    ]
    same = await _chat(a, messages)
    other = await _chat(b, messages)
    assert _chat_share(same) > HIGH, same
    assert _chat_share(other) < LOW, other
    # alternating: back on the first server, the history up to its last turn there is found
    messages += [
        {"role": "assistant", "content": other["text"]},
        {"role": "user", "content": "And at 5?"},
    ]
    assert _chat_share(await _chat(a, messages)) > HIGH
    # /v1/responses reports the same in input_tokens_details: the other server has the
    # conversation now too (it served `other`)
    items = [{"type": "message", "role": m["role"], "content": m["content"]} for m in messages]
    prompt, cached = await _responses_cached(b, items)
    assert cached / prompt > HIGH, (prompt, cached)
    fresh = [user(_opening())]
    prompt, cached = await _responses_cached(b, fresh)
    assert cached / prompt < LOW, (prompt, cached)


async def _wsmode_shares(px: Proxy) -> list[float]:
    """A four-turn conversation over WebSocket mode; the cached share of each turn's prompt
    as wsmode reports it (`input_tokens_details.cached_tokens`, from llama.cpp's usage)."""
    shares: list[float] = []
    asks = [_opening(), "Which depot leaves at 3?", "And at 5?", "And at 7?"]
    async with connect(px.ws) as ws:
        previous = None
        for ask in asks:
            body: dict[str, Any] = {"model": MODEL, "input": [user(ask)], "store": False}
            body.update(temperature=0, max_output_tokens=8)
            if previous is not None:
                body["previous_response_id"] = previous
            await send(ws, create(**body))
            final = (await until_terminal(ws, timeout=TURN_TIMEOUT))[-1]
            assert final["type"] == "response.completed" or final["type"] == "response.incomplete"
            usage = final["response"]["usage"]
            shares.append(usage["input_tokens_details"]["cached_tokens"] / usage["input_tokens"])
            previous = final["response"]["id"]
    return shares


def _pool(pair: tuple[str, str], affinity: str) -> dict[str, Any]:
    return {
        "upstream__urls": list(pair),
        "upstream__affinity": affinity,
        "upstream__api": "chat",
        "upstream__read_timeout": TURN_TIMEOUT,
    }


async def test_wsmode_affinity_serves_later_turns_from_the_prompt_cache(
    llamacpp_pair: tuple[str, str], proxy_factory: ProxyFactory
) -> None:
    px = await proxy_factory("", **_pool(llamacpp_pair, "conversation"))
    shares = await _wsmode_shares(px)
    assert shares[0] < LOW
    assert min(shares[1:]) > HIGH, shares  # every later turn on the replica with its cache


async def test_wsmode_without_affinity_recomputes_on_the_other_replica(
    llamacpp_pair: tuple[str, str], proxy_factory: ProxyFactory
) -> None:
    """Round robin over two: the second turn lands on the replica that never saw the
    conversation and is computed whole."""
    px = await proxy_factory("", **_pool(llamacpp_pair, "none"))
    shares = await _wsmode_shares(px)
    assert shares[0] < LOW
    assert min(shares[1:]) < LOW, shares

"""The simulated model's prefix cache over real HTTP: a conversation's next turn reports the
previous prompt and answer as cached tokens (Responses `input_tokens_details`, Chat
`prompt_tokens_details`), another conversation does not, and wsmode's rebuilt history hits
the cache the same way a client's own full history does."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import orjson
from websockets.asyncio.client import connect
from wsmode.core.sse import SSEDecoder

from tests.support.helpers import Proxy, Sim, create, seconds, send, until_terminal, user

SimFactory = Callable[..., Awaitable[Sim]]
ProxyFactory = Callable[..., Awaitable[Proxy]]
CACHE = {"prefix_cache_tokens": 100_000, "prefix_cache_block_tokens": 16}
HISTORY = "the history of this conversation, long enough for several blocks. " * 20


async def _stream(url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    decoder = SSEDecoder(1 << 20)
    out: list[dict[str, Any]] = []
    async with aiohttp.ClientSession() as http, http.post(url, json=body) as r:
        assert r.status == 200, await r.text()
        async with asyncio.timeout(seconds(10)):
            async for chunk in r.content.iter_any():
                out += [orjson.loads(e.data) for e in decoder.feed(chunk) if e.data != b"[DONE]"]
    return out


async def _responses_turn(sim: Sim, items: list[Any]) -> dict[str, Any]:
    body = {"model": "sim", "input": items, "stream": True, "store": False}
    final: dict[str, Any] = (await _stream(f"{sim.url}/responses", body))[-1]["response"]
    return final


async def test_responses_next_turn_reports_the_history_as_cached(sim_factory: SimFactory) -> None:
    sim = await sim_factory(**CACHE)
    items: list[Any] = [user(HISTORY)]
    first = await _responses_turn(sim, items)
    assert first["usage"]["input_tokens_details"]["cached_tokens"] == 0
    items += [*first["output"], user("and now?")]
    second = await _responses_turn(sim, items)
    usage = second["usage"]
    cached = usage["input_tokens_details"]["cached_tokens"]
    # everything but the partial last block and the new message came from the cache
    assert usage["input_tokens"] - 16 - 8 < cached < usage["input_tokens"], usage
    assert cached % 16 == 0
    other = await _responses_turn(sim, [user("another conversation " + HISTORY)])
    assert other["usage"]["input_tokens_details"]["cached_tokens"] == 0
    async with aiohttp.ClientSession() as http, http.get(f"{sim.served.base}/sim/stats") as r:
        stats = (await r.json())["prefix_cache"]
    assert stats["lookups"] == 3 and stats["cached_tokens"] == cached


async def test_without_the_cache_nothing_is_reported_cached(sim: Sim) -> None:
    items: list[Any] = [user(HISTORY)]
    first = await _responses_turn(sim, items)
    second = await _responses_turn(sim, [*items, *first["output"], user("more")])
    assert second["usage"]["input_tokens_details"]["cached_tokens"] == 0


async def test_chat_next_turn_reports_cached_prompt_tokens(sim_factory: SimFactory) -> None:
    sim = await sim_factory(**CACHE)
    url = f"{sim.url}/chat/completions"
    messages: list[Any] = [{"role": "user", "content": HISTORY}]
    body = {"model": "sim", "stream": True, "stream_options": {"include_usage": True}}
    chunks = await _stream(url, {**body, "messages": messages})
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert chunks[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "go on"}]
    usage = (await _stream(url, {**body, "messages": messages}))[-1]["usage"]
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    assert usage["prompt_tokens"] - 16 - 8 < cached < usage["prompt_tokens"], usage
    # non-streaming answers carry the detail too while the cache is on
    plain = {"model": "sim", "messages": messages}
    async with aiohttp.ClientSession() as http, http.post(url, json=plain) as r:
        again = (await r.json())["usage"]
    assert again["prompt_tokens_details"]["cached_tokens"] >= cached


async def test_wsmode_rebuilt_history_hits_the_cache(
    sim_factory: SimFactory, proxy_factory: ProxyFactory
) -> None:
    """Over WebSocket mode the client sends only the new input; the history wsmode rebuilds
    for the stateless upstream is the same prompt, so the upstream's cache serves it."""
    sim = await sim_factory(**CACHE)
    px = await proxy_factory(sim.url)
    async with connect(px.ws) as ws:
        await send(ws, create(input=[user(HISTORY)], store=False))
        first = (await until_terminal(ws))[-1]["response"]
        await send(ws, create(input=[user("next")], previous_response_id=first["id"]))
        second = (await until_terminal(ws))[-1]["response"]
    usage = second["usage"]
    cached = usage["input_tokens_details"]["cached_tokens"]
    assert usage["input_tokens"] - 16 - 8 < cached < usage["input_tokens"], usage

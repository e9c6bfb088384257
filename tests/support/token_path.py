"""What the token-path tests share (`upstream.api = "tokens"`, proxy/core/tokens/): a proxy in
front of the sim speaking one engine, the proxy's `GET /v1/responses/{id}/tokens`, the sim's
`/detokenize`, the token metrics, and `FakeLlamaCpp`, a tiny llama.cpp-shaped server whose
answers a test controls (ids left out, a failing tokenizer, a stream held mid-way).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from websockets.asyncio.client import ClientConnection
from wsmode.sim import vocab
from wsmode.sim.tokens import TEMPLATE_PATH

from tests.support.helpers import (
    Metrics,
    Proxy,
    Served,
    create,
    sample,
    scrape,
    send,
    serve,
    until,
    until_terminal,
)
from tests.support.redis_server import RedisServer

TEMPLATE = str(TEMPLATE_PATH)  # the sim's chat template, for engines that report none
REASONS = ("fingerprint", "history_changed", "generation_rerendered", "parent_without_ids")


def engine_settings(engine: str) -> dict[str, Any]:
    """proxy_factory overrides for the token path on `engine` ("auto": the probe finds
    llama.cpp's /props; vLLM and SGLang report no template, so they get the sim's file)."""
    out: dict[str, Any] = {"upstream__api": "tokens"}
    if engine != "auto":
        out |= {"upstream__token_engine": engine, "upstream__chat_template_file": TEMPLATE}
    return out


async def wait_ready(proxy: Proxy, timeout: float = 10) -> None:
    """Until /readyz says ready: the start-up probe runs in the background."""

    async def ready() -> bool:
        async with aiohttp.ClientSession() as http, http.get(f"{proxy.served.base}/readyz") as r:
            return r.status == 200

    await until(ready, timeout, message="the token path never became ready")


async def not_ready_because(proxy: Proxy, words: str, timeout: float = 10) -> list[str]:
    """Until /readyz answers 503 with a reason containing `words`: the reasons."""

    async def reasons() -> list[str] | None:
        status, doc = await get_json(f"{proxy.served.base}/readyz")
        found = doc.get("reasons", []) if status == 503 else []
        return found if any(words in r for r in found) else None

    found = await until(reasons, timeout, message=f"/readyz never said {words!r}")
    assert isinstance(found, list)
    return found


async def get_json(url: str, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http, http.get(url, headers=headers) as r:
        return r.status, orjson.loads(await r.read())


async def token_record(
    proxy: Proxy, rid: str, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, Any]]:
    """`GET /v1/responses/{rid}/tokens`: (status, body)."""
    status, doc = await get_json(f"{proxy.http}/responses/{rid}/tokens", headers)
    assert isinstance(doc, dict)
    return status, doc


async def trajectory(
    proxy: Proxy, rid: str, headers: dict[str, str] | None = None
) -> tuple[list[int], list[int]]:
    """(prompt ids, generated ids) of a stored token-path response; it must have them."""
    status, doc = await token_record(proxy, rid, headers)
    assert status == 200, doc
    return doc["prompt_token_ids"], doc["generation_token_ids"]


async def detokenize(base: str, ids: list[int]) -> str:
    """The model server's own text for `ids` (`base`: its root, not `/v1`)."""
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{base}/detokenize", json={"tokens": ids}) as r,
    ):
        assert r.status == 200
        return str((await r.json())["content"])


def id_counts(m: Metrics) -> dict[str, float]:
    """`wsmode_prompt_ids_total` by kind and `wsmode_token_divergences_total` by reason."""
    out = {k: sample(m, "wsmode_prompt_ids_total", kind=k) for k in ("reused", "tokenized")}
    out |= {r: sample(m, "wsmode_token_divergences_total", reason=r) for r in REASONS}
    return out


async def counts(proxy: Proxy) -> dict[str, float]:
    return id_counts(await scrape(proxy))


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before[k] for k in after}


def output_text(response: dict[str, Any]) -> str:
    return "".join(
        part.get("text", "")
        for item in response["output"]
        if item["type"] == "message"
        for part in item["content"]
    )


def streamed_text(events: list[dict[str, Any]]) -> str:
    return "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")


async def ws_turn(ws: ClientConnection, **fields: Any) -> list[dict[str, Any]]:
    """One create and its events up to the terminal one."""
    await send(ws, create(**fields))
    return await until_terminal(ws)


# ------------------------------------------------------------------ stored records (Redis)


# The bound docs/store.md states for a record's token field: per id it holds, its JSON (up
# to 7 bytes on a 262,144-id vocabulary: six digits and a comma) and the text beside it,
# plus a fixed part per turn (the fingerprint, the keys); measured on Gemma 3's vocabulary,
# about 12 bytes per id and 110 fixed
MAX_BYTES_PER_ID = 16
FIXED_BYTES = 320


@dataclass(frozen=True)
class StoredTokens:
    """The token field of one response's Redis record (`m.tok`, docs/store.md)."""

    ids: int  # the ids it holds: its own turns' prompt and generated ids
    id_bytes: int  # of those, the ids' JSON (the digits and commas of each array)
    text_bytes: int  # the texts beside them (each prompt segment's and the generation's)
    field_bytes: int  # the whole `tok` entry of `m` as stored, key included
    record_memory: int  # the whole record's `MEMORY USAGE` in Redis

    @property
    def bytes_per_id(self) -> float:
        return self.field_bytes / self.ids


def stored_tokens(server: RedisServer, rid: str) -> StoredTokens:
    """What the Redis record of response `rid` holds in its token field."""
    [key] = [k for k in server.stored_keys() if k.endswith(rid.encode())]
    meta = orjson.loads(server.client.hget(key, "m") or b"{}")
    tok = meta["tok"]
    ids = id_bytes = text_bytes = 0
    for turn in tok["t"]:
        for text, seg in turn["p"]:
            ids, id_bytes = ids + len(seg), id_bytes + len(orjson.dumps(seg))
            text_bytes += len(orjson.dumps(text))
        ids, id_bytes = ids + len(turn["gi"]), id_bytes + len(orjson.dumps(turn["gi"]))
        text_bytes += len(orjson.dumps(turn["gt"]))
    memory = server.client.memory_usage(key, samples=0)
    field = len(b',"tok":') + len(orjson.dumps(tok))
    return StoredTokens(ids, id_bytes, text_bytes, field, int(memory or 0))


# ------------------------------------------------------------------ a controllable llama.cpp


@dataclass
class FakeLlamaCpp:
    """A llama-server as far as the token path asks (GET /props, GET /v1/models, POST
    /tokenize, POST /completion), on the sim's vocabulary and template, whose answers the test
    sets between turns:

    - `pieces`: the generated text, one streamed event per piece;
    - `tokens_until`: the events from this piece on carry no `tokens` (llama.cpp's
      `return_tokens`), as a server that ignores `return_tokens` would; None: all carry them;
    - `tokenize_status`: not 200, /tokenize answers that status with an error body;
    - `hold_after`: after that many pieces the stream waits for `release` (a response that is
      still running while the test steers or cancels it);
    - `tokenize_extra`, `generated_extra`: ids put after those of every tokenize answer, and
      after those of the last generated piece (ids outside the vocabulary, say).

    `completions` holds each /completion body; `disconnects` counts streams the client left
    before their end (a cancelled upstream request)."""

    pieces: list[str] = field(default_factory=lambda: ["Hello ", "from ", "the ", "fake."])
    tokens_until: int | None = None
    tokenize_status: int = 200
    n_ctx: int = 32768  # the context window its /props reports
    n_vocab: int | None = vocab.VOCAB_SIZE  # its /v1/models' `meta.n_vocab` (None: none)
    hold_after: int | None = None
    tokenize_extra: list[int] = field(default_factory=list)
    generated_extra: list[int] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    held: asyncio.Event = field(default_factory=asyncio.Event)
    completions: list[dict[str, Any]] = field(default_factory=list)
    disconnects: int = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/props", self._props)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_post("/completion", self._completion)
        return app

    async def _props(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "default_generation_settings": {"n_ctx": self.n_ctx},
                "total_slots": 1,
                "chat_template": TEMPLATE_PATH.read_text(),
                "bos_token": "<bos>",
                "eos_token": "<eos>",
            }
        )

    async def _models(self, request: web.Request) -> web.Response:
        meta = {} if self.n_vocab is None else {"n_vocab": self.n_vocab}
        data = [{"id": "fake", "object": "model", "meta": meta}]
        return web.json_response({"object": "list", "data": data})

    async def _tokenize(self, request: web.Request) -> web.Response:
        if self.tokenize_status != 200:
            body = {"error": {"code": self.tokenize_status, "message": "tokenizer exploded"}}
            return web.json_response(body, status=self.tokenize_status)
        doc = await request.json()
        ids = vocab.encode(
            doc["content"],
            add_special=doc.get("add_special") is True,
            parse_special=doc.get("parse_special") is True,
        )
        return web.json_response({"tokens": ids + self.tokenize_extra})

    async def _completion(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.completions.append(body)
        prompt = body["prompt"]
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        finished = False
        try:
            n = 0
            for i, piece in enumerate(self.pieces):
                if self.hold_after is not None and i == self.hold_after:
                    self.held.set()
                    await self.release.wait()
                ids = vocab.encode(piece, parse_special=True)
                if i == len(self.pieces) - 1:
                    ids += self.generated_extra
                n += len(ids)
                event: dict[str, Any] = {"content": piece, "stop": False, "tokens_predicted": n}
                if self.tokens_until is None or i < self.tokens_until:
                    event["tokens"] = ids
                await resp.write(b"data: " + orjson.dumps(event) + b"\n\n")
            final = {
                "content": "",
                "tokens": [],
                "stop": True,
                "stop_type": "eos",
                "tokens_predicted": n,
                "tokens_evaluated": len(prompt),
                "timings": {"cache_n": 0, "prompt_n": len(prompt)},
            }
            await resp.write(b"data: " + orjson.dumps(final) + b"\n\n")
            finished = True
        finally:
            if not finished:
                self.disconnects += 1
        return resp


async def serve_fake(fake: FakeLlamaCpp) -> Served:
    return await serve(fake.app(), handler_cancellation=True)


ProxyFactory = Callable[..., Awaitable[Proxy]]

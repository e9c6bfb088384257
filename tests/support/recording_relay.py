"""A recording relay: a small HTTP server on a free loopback port that forwards every request
to a real model server and streams its answers back unchanged, keeping a record of what the
token path sent and got (tests/system/test_llamacpp_tokens.py).

Point wsmode at `{relay.base}/v1`: its requests (the start-up probe's `/props`, `/tokenize`,
`/completion`, health checks) go through the relay to the target server's root. For
`POST /completion` the relay keeps the request JSON (its `prompt` is the id array) and, from
the streamed answer, each event's `tokens` and `content` and the final event's `timings`; for
`POST /tokenize` it keeps the request JSON. Everything else is forwarded without a record.

A test can hold a `/completion` stream mid-way (`hold_after`: after that many events the
relay forwards nothing more until `release` is set; `held` says it got there), so that it
steers or cancels a response llama.cpp is still generating. A client that leaves a stream
(wsmode cancelling its request) ends the relay's request to the server too, as it would end
a direct one: llama.cpp then stops generating (`Completion.left`).

The relay changes nothing: method, path, query and body go out as they came (headers minus
the hop-by-hop ones, RFC 9110 7.6.1, and the Host and Content-Length the client library
sets itself), and the answer's status, headers (minus hop-by-hop) and bytes come back as the
server sent them, chunk by chunk, so streaming stays streaming.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from wsmode.core.sse import SSEDecoder

from tests.support.helpers import Served, serve

# hop-by-hop headers (RFC 9110 7.6.1) and those the client library writes for its own body
_NOT_FORWARDED = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
# of the answer's headers: hop-by-hop ones; Content-Length stays (the bytes are the same)
_NOT_RETURNED = _NOT_FORWARDED - {"content-length"}


@dataclass
class Completion:
    """One `POST /completion` as it went through the relay."""

    request: dict[str, Any]
    tokens: list[int] = field(default_factory=list)  # every streamed event's `tokens`, joined
    content: str = ""  # every streamed event's `content`, joined: the generated text
    timings: dict[str, Any] | None = None  # the final event's (`stop: true`)
    final_fields: list[str] = field(default_factory=list)  # the final event's, as sent
    slot: int | None = None  # the final event's `id_slot`: the slot that served it
    # each streamed token's log probability (`completion_probabilities`, with `n_probs`)
    logprobs: list[float] = field(default_factory=list)
    events: int = 0  # streamed events with ids
    left: bool = False  # the client left before the answer's end
    status: int = 0

    @property
    def prompt(self) -> list[int]:
        """The prompt's ids as sent (the token path sends an id array)."""
        prompt = self.request.get("prompt")
        assert isinstance(prompt, list) and all(isinstance(x, int) for x in prompt), prompt
        return prompt


@dataclass
class Recording:
    completions: list[Completion] = field(default_factory=list)
    tokenize: list[dict[str, Any]] = field(default_factory=list)  # request JSON bodies
    paths: list[str] = field(default_factory=list)  # every request's "METHOD /path"


class RecordingRelay:
    """Forwards to `target` (a server root, `http://host:port`), recording as it goes."""

    def __init__(self, target: str) -> None:
        self.target = target.rstrip("/")
        self.recording = Recording()
        self.hold_after: int | None = None
        self.held = asyncio.Event()
        self.release = asyncio.Event()
        self._served: Served | None = None
        self._session: aiohttp.ClientSession | None = None

    @property
    def base(self) -> str:
        assert self._served is not None, "not started"
        return self._served.base

    async def start(self) -> None:
        # no decompression: the bytes go back as the server sent them. A connection per
        # request: llama.cpp's server closes keep-alive connections on its own terms (an
        # idle timeout, a request count), and a POST on one it has just closed fails ("Can
        # not write request body") with no retry. wsmode checks a pooled connection before
        # it reuses it; this relay need not pool
        connector = aiohttp.TCPConnector(force_close=True)
        self._session = aiohttp.ClientSession(auto_decompress=False, connector=connector)
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        # a client that leaves cancels the handler, which ends the request to the server
        self._served = await serve(app, handler_cancellation=True)

    def hold(self, events: int) -> None:
        """Hold the next `/completion` streams after `events` events, until `let_go`."""
        self.held.clear()
        self.release.clear()
        self.hold_after = events

    def let_go(self) -> None:
        self.hold_after = None
        self.release.set()

    async def close(self) -> None:
        self.let_go()
        if self._served is not None:
            await self._served.runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        body = await request.read()
        path = request.rel_url.path
        self.recording.paths.append(f"{request.method} {path}")
        record: Completion | None = None
        if request.method == "POST" and path == "/tokenize":
            self.recording.tokenize.append(orjson.loads(body))
        elif request.method == "POST" and path == "/completion":
            record = Completion(orjson.loads(body))
            self.recording.completions.append(record)
        try:
            return await self._relay(request, body, record)
        except asyncio.CancelledError:
            if record is not None:
                record.left = True
            raise

    async def _relay(
        self, request: web.Request, body: bytes, record: Completion | None
    ) -> web.StreamResponse:
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _NOT_FORWARDED}
        url = self.target + str(request.rel_url)  # path and query, as they came
        async with self._session.request(
            request.method, url, data=body, headers=headers, allow_redirects=False
        ) as upstream:
            out = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for key, value in upstream.headers.items():
                if key.lower() not in _NOT_RETURNED:
                    out.headers.add(key, value)
            await out.prepare(request)
            stream = upstream.headers.get("Content-Type", "").startswith("text/event-stream")
            decoder = SSEDecoder(1 << 26)
            whole = bytearray()  # a /completion answer that is not a stream: one JSON body
            async for chunk in upstream.content.iter_any():
                await out.write(chunk)
                if record is None:
                    continue
                if stream:
                    for event in decoder.feed(chunk):
                        _record_event(record, event.data)
                    if self.hold_after is not None and record.events >= self.hold_after:
                        self.held.set()
                        await self.release.wait()
                else:
                    whole += chunk
            if record is not None:
                record.status = upstream.status
                for event in decoder.close() if stream else ():
                    _record_event(record, event.data)
                if not stream:
                    _record_event(record, bytes(whole))
            await out.write_eof()
            return out


def _record_event(record: Completion, data: bytes) -> None:
    """One streamed event (or a whole non-streamed answer) of a `/completion`."""
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError:
        return  # not an event with ids (a `[DONE]`, an error page): nothing to record
    if not isinstance(doc, dict):
        return
    tokens = doc.get("tokens")
    if isinstance(tokens, list):
        record.tokens.extend(tokens)
        record.events += 1 if tokens else 0
    for prob in doc.get("completion_probabilities") or ():
        if isinstance(prob, dict) and isinstance(prob.get("logprob"), int | float):
            record.logprobs.append(float(prob["logprob"]))
    content = doc.get("content")
    if isinstance(content, str):
        record.content += content
    if doc.get("stop") is True:
        record.final_fields = list(doc)
    if doc.get("stop") is True and isinstance(doc.get("timings"), dict):
        record.timings = doc["timings"]
        slot = doc.get("id_slot")
        record.slot = slot if isinstance(slot, int) else None


@contextlib.asynccontextmanager
async def recording_relay(target: str) -> AsyncIterator[RecordingRelay]:
    """A started relay to `target` (a server root), closed on the way out."""
    relay = RecordingRelay(target)
    await relay.start()
    try:
        yield relay
    finally:
        await relay.close()

"""Real llama.cpp for the "tokens" scenario (`wsmode bench tokens --llamacpp-model PATH`):
llama.cpp's own server, embedded by ../shared/upstreams/xlc_serve.py, run with the
interpreter of the cached upstream venv (`.upstreams/llamacpp/venv`, or under
`LLAMACPP_UPSTREAM_DIR`, as tests/support/llamacpp_server.py installs it), one slot, the
context the scenario asks for, and the `turns-with-tools.jinja` chat template the sim also
serves. Loopback only, on a port of ours.

`Tap` sits between wsmode and llama.cpp on both paths, so the scenario can read what
llama.cpp spent where (docs/bench-tokens.md "Against real llama.cpp"): each generation's own
`timings` (from the chat stream's finish chunk and from `/completion`'s final event), how
many tokens streamed before the first with text, each request's time at the tap, and the
ids of each `/tokenize` answer. It forwards every request and answer unchanged.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from ..core.sse import SSEDecoder
from .procs import BenchError, Server, Servers, free_port

ROOT = Path(__file__).resolve().parents[2]  # the checkout: proxy/bench/ is two levels down
# the llama.cpp upstream's scripts (../shared/upstreams beside a checkout; an installed
# wsmode is told where they are)
SHARED = Path(os.environ.get("LLAMACPP_UPSTREAM_SHARED", ROOT.parent / "shared" / "upstreams"))
CACHE = Path(os.environ.get("LLAMACPP_UPSTREAM_DIR", ROOT / ".upstreams")) / "llamacpp"


def _python() -> Path:
    python = CACHE / "venv" / "bin" / "python"
    if not python.exists():
        raise BenchError(
            f"{python} is missing: set the llama.cpp upstream up first "
            f"(bash {SHARED / 'setup_llamacpp_upstream.sh'} {CACHE})"
        )
    return python


async def start_llamacpp(servers: Servers, model: Path, context: int, name: str) -> Server:
    """A llama.cpp server with `model` and a `context`-token slot, listening on loopback."""
    if not model.is_file():
        raise BenchError(f"--llamacpp-model {model}: no such file")
    script = SHARED / "xlc_serve.py"
    if not script.is_file():
        raise BenchError(f"{script} is missing: the llama.cpp upstream cannot be started")
    port = free_port()
    cmd = [str(_python()), str(script), "--model", str(model), "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "--alias", "tiny", "--parallel", "1", "--ctx", str(context)]
    cmd += ["--n-predict", "128", "--seed", "1"]
    cmd += ["--chat-template-file", str(SHARED / "turns-with-tools.jinja")]
    return await servers.start(name, cmd, "127.0.0.1", port)


# ---------------------------------------------------------------- the timing tap

_HOP = frozenset(  # hop-by-hop headers (RFC 9110 7.6.1), and those aiohttp writes itself
    {"connection", "keep-alive", "te", "trailer", "transfer-encoding", "upgrade", "host",
     "content-length"}
)  # fmt: skip
_GENERATE = frozenset({"/completion", "/v1/chat/completions"})


@dataclass
class Exchange:
    """One request wsmode made of llama.cpp, as the tap saw it."""

    path: str
    seconds: float  # from the request's arrival at the tap to the answer's last byte
    timings: dict[str, Any] | None = None  # llama.cpp's own, from its final event or chunk
    before_text: int = 0  # generated tokens streamed before the first one with text
    seen_text: bool = False
    tokenized: int = 0  # the ids of a /tokenize answer

    def model_ms(self) -> float:
        """llama.cpp's time to the first token with text: `prompt_ms` (which ends once the
        first token is sampled: server.cpp starts `t_start_generation` at the first decoded
        token) plus a token's `predicted_per_token_ms` for each token before it."""
        t = self.timings or {}
        return _num(t, "prompt_ms") + self.before_text * _num(t, "predicted_per_token_ms")

    def outside_ms(self) -> float:
        """The server's time on this request outside the model: parsing the body, rendering
        the template, tokenising, scheduling, writing the answer (everything but llama.cpp's
        `prompt_ms` and `predicted_ms`); a /tokenize is all of it."""
        t = self.timings or {}
        return self.seconds * 1000 - _num(t, "prompt_ms") - _num(t, "predicted_ms")

    def server_tokenized(self) -> int:
        """The tokens the server tokenised: a /tokenize's ids; on the chat endpoint the whole
        prompt (`prompt_n` + `cache_n`); none for a prompt sent as ids."""
        if self.path == "/v1/chat/completions" and self.timings is not None:
            return int(_num(self.timings, "prompt_n") + _num(self.timings, "cache_n"))
        return self.tokenized

    def event(self, data: bytes) -> None:
        """One streamed event of a generation: count its token, keep the final timings."""
        if data == b"[DONE]":
            return
        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError:
            return
        if not isinstance(doc, dict):
            return
        if isinstance(doc.get("timings"), dict):
            self.timings = doc["timings"]
        if doc.get("stop") is True:  # /completion's final event carries no new token
            return
        text: Any = doc.get("content")  # /completion: one event per token
        choices = doc.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            delta = choices[0].get("delta") or {}  # chat: `content` null on the role chunk
            text = delta.get("content") if isinstance(delta, dict) else None
        if isinstance(text, str) and not self.seen_text:
            self.seen_text = bool(text)
            self.before_text += 0 if text else 1


def _num(doc: dict[str, Any], key: str) -> float:
    value = doc.get(key)
    return float(value) if isinstance(value, int | float) else 0.0


class Tap:
    """An HTTP relay between wsmode and llama.cpp that changes nothing and keeps, per
    request, its time and llama.cpp's own `timings` (the same code on both paths)."""

    def __init__(self, target: str) -> None:
        self.target = target.rstrip("/")
        self.exchanges: list[Exchange] = []
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.port = 0

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def take(self) -> list[Exchange]:
        """The requests since the last call."""
        out, self.exchanges = self.exchanges, []
        return out

    async def start(self) -> None:
        timeout = aiohttp.ClientTimeout(total=None, sock_read=600)
        self._session = aiohttp.ClientSession(auto_decompress=False, timeout=timeout)
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        self.port = free_port()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        """Forward one request; each answer's bytes are read before they are passed on, so
        the record is complete by the time wsmode has what it needs to end its turn."""
        assert self._session is not None
        began = time.perf_counter()
        body = await request.read()
        path = request.rel_url.path
        kept = request.method == "POST" and (path in _GENERATE or path == "/tokenize")
        record = Exchange(path, 0.0)
        if kept:
            self.exchanges.append(record)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        async with self._session.request(
            request.method, self.target + str(request.rel_url), data=body, headers=headers
        ) as upstream:
            out = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for key, value in upstream.headers.items():
                if key.lower() not in _HOP - {"content-length"}:
                    out.headers.add(key, value)
            if not (kept and path in _GENERATE):  # a whole answer: read, noted, passed on
                whole = await upstream.read()
                if kept and upstream.status == 200:
                    tokens = orjson.loads(whole).get("tokens")
                    record.tokenized = len(tokens) if isinstance(tokens, list) else 0
                record.seconds = time.perf_counter() - began
                await out.prepare(request)
                await out.write(whole)
                await out.write_eof()
                return out
            await out.prepare(request)
            decoder = SSEDecoder(1 << 28)
            async for chunk in upstream.content.iter_any():
                for event in decoder.feed(chunk):
                    record.event(event.data)
                record.seconds = time.perf_counter() - began
                try:
                    await out.write(chunk)
                except ConnectionError:  # wsmode had what it needed and closed the stream
                    return out
            await out.write_eof()
        return out

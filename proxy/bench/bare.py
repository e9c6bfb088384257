"""The bare relay: the least code that does wsmode's transport job, as a baseline.

A WebSocket endpoint (`GET /v1/responses`) that POSTs every text frame it receives, byte for
byte, to `UPSTREAM/responses`, and writes each SSE event of the answer back as one text frame
(its `data:` bytes). Nothing else: no cache, no `previous_response_id`, no validation, no
limits, no metrics, no parsing of the JSON. The client must therefore send the whole history
and `"stream": true` in every frame (the simulated model ignores the frame's `"type"` field).

It runs on the same stack as wsmode (Python, aiohttp, the same SSE decoder, the same tuning
of the garbage collector), so what it costs is this stack's floor on this machine: the bench
reports wsmode's rates, times and CPU as ratios to it, measured in the same run
(docs/bench.md).

Run as `python -m wsmode.bench.bare --port PORT --upstream http://HOST:PORT/v1`.
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web

from ..core.sse import SSEDecoder
from ..serve import tune_collector

MAX_BYTES = 256 * 1024 * 1024  # frames and events: as large as the bench sends
UPSTREAM = web.AppKey("upstream", str)
CLIENT = web.AppKey("client", aiohttp.ClientSession)


async def relay(request: web.Request) -> web.WebSocketResponse:
    ws = web.WebSocketResponse(max_msg_size=MAX_BYTES, decode_text=False)
    await ws.prepare(request)
    client = request.app[CLIENT]
    url = f"{request.app[UPSTREAM]}/responses"
    headers = {"Content-Type": "application/json"}
    if auth := request.headers.get("Authorization"):
        headers["Authorization"] = auth
    async for msg in ws:
        if msg.type is not aiohttp.WSMsgType.TEXT:
            continue
        async with client.post(url, data=msg.data, headers=headers) as resp:
            if resp.status != 200:  # one error frame: the client ends its turn on it
                error = b'{"type":"error","status":%d}' % resp.status
                await ws.send_frame(error, aiohttp.WSMsgType.TEXT)
                continue
            decoder = SSEDecoder(MAX_BYTES)
            async for chunk in resp.content.iter_any():
                for event in decoder.feed(chunk):
                    if event.data != b"[DONE]":
                        await ws.send_frame(event.data, aiohttp.WSMsgType.TEXT)
    return ws


def app(upstream: str) -> web.Application:
    application = web.Application()
    application[UPSTREAM] = upstream.rstrip("/")

    async def client_session(application: web.Application) -> AsyncIterator[None]:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            application[CLIENT] = session
            yield

    application.cleanup_ctx.append(client_session)
    application.router.add_get("/v1/responses", relay)
    return application


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--upstream", required=True, help="the model's base URL, e.g. .../v1")
    args = ap.parse_args()
    application = app(args.upstream)
    tune_collector()  # the runtime wsmode runs with: the floor is this stack's, tuned alike
    web.run_app(application, host=args.host, port=args.port, print=None)


if __name__ == "__main__":
    main()

"""A round-robin HTTP reverse proxy: the balancer users put in front of model-server replicas
today, for the affinity benchmark (bench/affinity.py).

Each request goes to the next replica in turn, whatever conversation it belongs to; the body
and the streamed answer are relayed as they are (hop-by-hop headers dropped), chunk by chunk.

`python -m wsmode.bench.balancer --port P URL [URL ...]` (URLs are replica base URLs without
`/v1`); it prints `LISTENING <url>` once it accepts connections.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web

# RFC 9110 7.6.1 connection-specific fields, plus the ones aiohttp sets itself
_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
SESSION = web.AppKey("session", aiohttp.ClientSession)


class RoundRobin:
    """The replicas, each in turn."""

    def __init__(self, replicas: list[str]) -> None:
        self.replicas = replicas
        self.sent = 0

    def next(self) -> str:
        base = self.replicas[self.sent % len(self.replicas)]
        self.sent += 1
        return base


NEXT = web.AppKey("next", RoundRobin)


async def _relay(request: web.Request) -> web.StreamResponse:
    base = request.app[NEXT].next()
    headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
    body = await request.read()
    session = request.app[SESSION]
    async with session.request(
        request.method, base + request.rel_url.path_qs, data=body, headers=headers
    ) as up:
        out = web.StreamResponse(
            status=up.status,
            headers={k: v for k, v in up.headers.items() if k.lower() not in _HOP},
        )
        await out.prepare(request)
        async for chunk in up.content.iter_any():
            await out.write(chunk)
        await out.write_eof()
        return out


def create_balancer_app(replicas: list[str]) -> web.Application:
    """Round robin over `replicas` (base URLs without `/v1`)."""
    if not replicas:
        raise ValueError("the balancer needs at least one replica")
    app = web.Application(client_max_size=1024**3)
    app[NEXT] = RoundRobin([r.rstrip("/") for r in replicas])

    async def session(app: web.Application) -> AsyncIterator[None]:
        timeout = aiohttp.ClientTimeout(total=None, sock_read=300)
        connector = aiohttp.TCPConnector(limit=0)
        app[SESSION] = aiohttp.ClientSession(timeout=timeout, connector=connector)
        yield
        await app[SESSION].close()

    app.cleanup_ctx.append(session)
    app.router.add_route("*", "/{tail:.*}", _relay)
    return app


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("replicas", nargs="+")
    args = ap.parse_args(argv)
    app = create_balancer_app(args.replicas)
    print(f"LISTENING http://{args.host}:{args.port}", flush=True)
    web.run_app(app, host=args.host, port=args.port, print=None, access_log=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())

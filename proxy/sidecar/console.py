"""The sidecar's console: the proxy's page and feed (ops/console_page.py), under the
same policy, showing what the sidecar does.

On as the proxy's is: `console.enabled = "auto"` turns it on when `sidecar.host` is a
loopback address; `true` anywhere, and on a non-loopback address only with proxy auth
(`[auth]`), else the sidecar refuses to start. The page (static/sidecar.html) has fewer
panels: the sidecar itself (its upstream, its pooled WebSockets, the chains it remembers),
the conversations, and the recent errors. Each `POST /v1/responses` is one turn: the bytes
the HTTP client sent beside the bytes of the `response.create` message the sidecar sent on
its WebSocket (a continuation carries only the new items), how it went (a continuation, a
full request, plain HTTP) and its outcome. No payload text unless `console.show_content`;
response ids shortened unless then too, as on the proxy's console.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiohttp import web

from ..config import Settings
from ..ops import console_page as routes
from ..ops.console_feed import ConsoleFeed, output_texts, texts
from .chains import Plan

_DRAIN_BOUND = 1.0  # seconds an open feed may take to end when the sidecar stops


def install(
    app: web.Application,
    settings: Settings,
    has_auth: bool,
    state: Callable[[], dict[str, Any]],
) -> tuple[ConsoleFeed | None, list[str]]:
    """The console's feed and the paths that need no auth, when the console is on for the
    sidecar's host (None and no path when it is off). `state`: what the snapshot shows of
    the sidecar. Raises ConfigError when it is on for a non-loopback host without auth."""
    host = settings.sidecar.host
    if not routes.enabled_on(settings, host):
        return None, []
    routes.check_auth(settings, host, has_auth)
    feed = ConsoleFeed(settings.console)
    readers: set[Any] = set()

    def snapshot() -> dict[str, Any]:
        return {
            "type": "state",
            "time": feed.clock(),
            "sidecar": state(),
            "errors": list(feed.errors),
            "feed": {
                "pages": len(feed.subscribers),
                "dropped": feed.dropped,
                "ring": len(feed.ring),
                "ring_size": feed.ring.maxlen,
                "snapshots": feed.snapshots,
            },
        }

    feed.source = snapshot
    served = routes.Served(feed, readers.add, readers.discard)
    paths = routes.add_routes(app, served, page="sidecar.html")

    async def feeds(_: web.Application) -> AsyncIterator[None]:
        yield
        for reader in list(readers):  # a stopping sidecar ends its feeds, as a drain does
            with contextlib.suppress(RuntimeError):
                reader.begin_drain(_DRAIN_BOUND)

    app.cleanup_ctx.append(feeds)
    return feed, paths


def turn(
    feed: ConsoleFeed,
    number: int,
    plan: Plan,
    via: str,
    client_bytes: int,
    sent_bytes: int,
    outcome: str,
    response_id: str | None,
    output: list[Any],
    duration: float,
) -> dict[str, Any]:
    """The console's event for one `POST /v1/responses`. `via`: delta (a continuation on the
    socket holding the conversation), full (the whole request on a socket), http."""
    parent = plan.parent.response_id if plan.parent is not None else plan.client_previous_id
    event: dict[str, Any] = {
        "type": "turn",
        "source": "sidecar",
        "run": number,
        "response_id": feed.shown_id(response_id),
        "previous_response_id": feed.shown_id(parent),
        "lane": None,
        "via": via,
        "new_items": len(plan.new_items) if plan.parent is not None else _items(plan),
        "output_items": len(output),
        "outcome": outcome,
        "refused": None,
        "replica": None,
        "client_bytes": client_bytes,
        "upstream_bytes": sent_bytes,
        "first_event": None,
        "duration": duration,
    }
    if feed.show_content:
        items = plan.new_items if plan.parent is not None else plan.full.get("input", ())
        event["input_text"] = items if isinstance(items, str) else texts(list(items))
        event["output_text"] = output_texts({"output": output})
    return event


def _items(plan: Plan) -> int:
    raw = plan.full.get("input")
    return len(raw) if isinstance(raw, list) else 1

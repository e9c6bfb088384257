"""The sidecar's console: the proxy's page and feed (ops/console_page.py), under the
same policy, showing what the sidecar does.

On as the proxy's is: `console.enabled = "auto"` turns it on when `sidecar.host` is a
loopback address; `true` anywhere, and on a non-loopback address only with proxy auth
(`[auth]`), else the sidecar refuses to start. The page (static/sidecar.html) has fewer
panels: the sidecar itself (its upstream, its pooled WebSockets, the chains it remembers),
the conversations, and the recent errors. Each `POST /v1/responses` is one turn: the bytes
the HTTP client sent beside the bytes of the `response.create` message the sidecar sent on
its WebSocket (a continuation carries only the new items), how it went (a continuation, a
full request, plain HTTP) and its outcome. A turn relayed over plain HTTP is shown too (its
answer is passed on unread: outcome `relayed`, or `error` for a status of 400 or more); a
turn that failed after its 200 stream began is also one of the recent errors. No payload
text unless `console.show_content`; response ids shortened unless then too, as on the
proxy's console.
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
    plan: Plan | None,
    via: str,
    client_bytes: int,
    sent_bytes: int,
    outcome: str,
    response_id: str | None,
    output: list[Any],
    duration: float,
    body: dict[str, Any] | None = None,
    status: int | None = None,
) -> dict[str, Any]:
    """The console's event for one `POST /v1/responses`. `via`: delta (a continuation on the
    socket holding the conversation), full (the whole request on a socket), http (relayed
    over plain HTTP as it was: no `plan` when it was not a WebSocket-mode request, `body`
    the request when it was a JSON object). `status`: the HTTP status the client got."""
    request = plan.full if plan is not None else body or {}
    if plan is not None and plan.parent is not None:
        parent: str | None = plan.parent.response_id
        items: Any = plan.new_items
    else:
        prev = request.get("previous_response_id")
        parent = prev if isinstance(prev, str) and prev else None
        items = request.get("input", ())
    event: dict[str, Any] = {
        "type": "turn",
        "source": "sidecar",
        "run": number,
        "response_id": feed.shown_id(response_id),
        "previous_response_id": feed.shown_id(parent),
        "lane": None,
        "via": via,
        "new_items": len(items) if isinstance(items, (list, tuple)) else 1 if items else 0,
        "output_items": len(output),
        "outcome": outcome,
        "refused": None,
        "replica": None,
        "client_bytes": client_bytes,
        "upstream_bytes": sent_bytes,
        "first_event": None,
        "duration": duration,
        "status": status,
    }
    if feed.show_content:
        event["input_text"] = items if isinstance(items, str) else texts(list(items))
        event["output_text"] = output_texts({"output": output})
    return event

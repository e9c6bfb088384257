"""The proxy's console: `GET /console` and its feed (the routes and the feed's writer are
ops/console_page.py, shared with the sidecar's console), fed by the proxy's run tracking
and its snapshots (state.py). See ops/console_page.py for the page, the feed and its
bounds, and docs/console.md.

When the console is on: `console.enabled = "auto"` (the default) turns it on only when
`server.host` is a loopback address; `true` turns it on anywhere, and on a non-loopback
listener only with proxy auth configured (the app refuses to start without).
"""

from __future__ import annotations

from aiohttp import web

from ..config import Settings
from ..ops.console_feed import ConsoleFeed
from ..ops.console_page import FEED, PAGE, Served, add_routes, check_auth, enabled_on
from ..ops.middleware import Ops
from ..runtime import APP_STATE
from .state import snapshot

__all__ = ["FEED", "PAGE", "enabled", "install"]


def enabled(settings: Settings) -> bool:
    """Whether the proxy's console is on for these settings."""
    return enabled_on(settings, settings.server.host)


def install(app: web.Application, ops: Ops) -> None:
    """Add the console's routes to `app` when the console is on. Raises ConfigError when
    it is turned on for a non-loopback listener without proxy auth."""
    settings = ops.settings
    if not enabled(settings):
        return
    check_auth(settings, settings.server.host, ops.auth is not None)
    ops.console = ConsoleFeed(settings.console)
    ops.console.source = lambda: snapshot(app[APP_STATE], ops)
    for path in add_routes(app, Served(ops.console, ops.register, ops.unregister)):
        ops.open_paths.add(path)

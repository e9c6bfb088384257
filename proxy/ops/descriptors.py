"""How many WebSocket connections the process's descriptor limit (`ulimit -n`) allows.

Every open WebSocket holds one descriptor; so does every upstream connection, and the
process needs some for itself (the listener, the event loop, log and usage files, the
store, HTTP requests in flight). If WebSockets may take them all, the proxy can no longer
reach its upstream (turns fail with `upstream_unavailable`), refuse an upgrade with 503 or
answer `/healthz`. So at start the soft limit is raised towards the hard one as far as the
configuration needs, and `server.max_connections` is lowered, with a warning, to what is
left after `upstream.max_connections` (twice that with the built-in simulated upstream,
whose server side lives in the same process) and `RESERVED` descriptors.
"""

from __future__ import annotations

from dataclasses import dataclass

try:
    import resource
except ImportError:  # not on Windows: no limit to read, nothing derived
    resource = None  # type: ignore[assignment]

from ..config import Settings

RESERVED = 64  # the process's own descriptors, HTTP requests in flight among them


@dataclass(frozen=True, slots=True)
class Budget:
    connections: int  # the WebSocket connection limit to use (0: none)
    warning: str | None  # what to log at start when the configured limit cannot be honoured


def reserve(settings: Settings) -> int:
    upstream = settings.upstream.max_connections * (1 if settings.upstream.url else 2)
    return RESERVED + upstream


def derive(configured: int, nofile: int | None, reserved: int) -> Budget:
    """The limit for `configured` WebSockets (0: no limit of its own) under a soft
    descriptor limit `nofile` (None: unlimited or unknown)."""
    if nofile is None:
        return Budget(configured, None)
    fits = nofile - reserved
    note = ""
    if fits < nofile // 4:  # the upstream pool alone nearly exhausts the limit
        fits = max(1, nofile // 4)
        note = "; upstream.max_connections does not fit either: lower it"
    if configured and configured <= fits:
        return Budget(configured, None)
    wanted = f"server.max_connections = {configured}" if configured else "no connection limit"
    return Budget(
        fits,
        f"{wanted} cannot be honoured with a descriptor limit of {nofile} (ulimit -n): "
        f"accepting at most {fits} WebSocket connections, keeping {nofile - fits} "
        f"descriptors for upstream connections and the proxy itself{note}. Raise the limit "
        "(ulimit -n, systemd LimitNOFILE=, docker --ulimit nofile=) or lower "
        "server.max_connections.",
    )


def _raise_soft_limit(wanted: int) -> int | None:
    """Raise the soft descriptor limit towards `wanted` (within the hard limit); the soft
    limit after that, or None when there is no limit."""
    if resource is None:
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return None if soft == resource.RLIM_INFINITY else soft


def budget(settings: Settings) -> Budget:
    """Raise the soft limit as far as the settings need, then derive the connection limit."""
    configured = settings.server.max_connections
    reserved = reserve(settings)
    nofile = _raise_soft_limit(configured + reserved if configured else 1 << 20)
    return derive(configured, nofile, reserved)

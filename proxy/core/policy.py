"""What a session may do and how it talks to the upstream: plain settings the session reads.

`SessionLimits` is the config's `[limits]` section as it is (proxy/config.py imports it; its
field names are the config keys), so its defaults are written once.
"""

from __future__ import annotations

from dataclasses import dataclass

from .dialects import Dialect

MiB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class SessionLimits:
    """A connection's limits, and the config's [limits] section as it is (proxy/config.py
    imports it; field names are the config keys)."""

    max_active_per_connection: int = 16  # in-flight responses (docs/protocol.md "Lanes")
    max_lanes_per_connection: int = 32  # distinct named stream_ids
    max_queued_per_connection: int = 256  # creates waiting
    steering: bool = True  # emulate response.steer (docs/protocol.md "response.steer")
    max_pending_steers: int = 8  # steers queued on one response (too_many_pending_steers)
    # bytes of the creates waiting on one connection (too_many_queued_requests beyond it)
    max_queued_bytes_per_connection: int = 64 * MiB
    # the process-wide memory budget (proxy/core/memory.py): connection caches, response
    # store, queued creates and outbound buffers together; each keeps its own bound inside it
    process_max_bytes: int = 6144 * MiB


@dataclass(frozen=True, slots=True)
class UpstreamPolicy:
    dialect: Dialect
    store: bool = False  # the `store` sent upstream on rebuilt requests
    native_previous_response_id: bool = False
    # the chain's key in the body as `prompt_cache_key` when the client set none (routing.py)
    session_key_in_body: bool = False
    llamacpp_slots: int = 0  # > 0: `id_slot` = a stable hash of the chain's key modulo this

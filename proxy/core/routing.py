"""What the session knows about where a turn should go: its chain's key, and what it tells the
upstream about it. The choice of a replica is the upstream pool's (proxy/upstream/pool.py).

A *chain* is a conversation as the proxy follows it: a response and every response continued
from it, on any lane, forks included. Its key is decided by its first turn and inherited by
every later one (`CachedResponse.chain`). It is derived from

1. the client's own `prompt_cache_key`, when it sets one (OpenAI routes on it too);
2. else, on a WebSocket connection, the connection's id: OpenAI's WebSocket mode reuses a
   connection's routing decision for every turn of the connection;
3. else (plain HTTP) the instructions and the first input item, which every turn of a
   conversation that resends its history shares;

and always from the credential that sent the turn (its owner, core/store.py `owner_of`): the
key is a hash of the owner and one of the three (`chain_key`). Two credentials never share a
key, even with the same prompt_cache_key or the same first turn: a key shared across tenants
would share a prompt cache (a timing side channel) and their routing. One credential's key
is the same on every turn and in every replica of the proxy (the hash is stable), so affinity
holds.

The key travels upstream as a session key for routers that use one (the `x-session-id`
header, and `prompt_cache_key` in the body when the client set none) and, for llama.cpp,
picks a slot (`id_slot`) so that the chain's prompt cache is not evicted by other traffic.
A `prompt_cache_key` the client set goes upstream as the client wrote it: sharing it, or not,
is the client's choice.
"""

from __future__ import annotations

import hashlib
from typing import Any

from . import wire


def stable_hash(text: str) -> int:
    """A 64-bit hash of `text` that is the same in every process (Python's `hash` is not)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def client_key(settings: dict[str, Any]) -> str | None:
    """The client's `prompt_cache_key`, when it set a non-empty string."""
    key = settings.get("prompt_cache_key")
    return key if isinstance(key, str) and key else None


def content_basis(settings: dict[str, Any], items: tuple[bytes, ...]) -> bytes:
    """A conversation's start as a chain key's basis: the instructions and the first input
    item."""
    instructions = settings.get("instructions")
    first = items[0] if items else b""
    return wire.dumps(instructions if isinstance(instructions, str) else None) + b"\0" + first


# what a key was derived from: its prefix (the client's key, a connection, a conversation start)
CLIENT, CONNECTION, CONTENT = "p_", "c_", "h_"


def chain_key(owner: str, kind: str, basis: str | bytes) -> str:
    """The chain key of `basis` (of `kind`: CLIENT, CONNECTION or CONTENT) for the credential
    `owner`: the same in every process, and never the same for two owners."""
    h = hashlib.blake2b(digest_size=12, person=b"wsmode-chain")
    h.update(owner.encode())
    h.update(b"\0")
    h.update(kind.encode())
    h.update(b"\0")
    h.update(basis.encode() if isinstance(basis, str) else basis)
    return kind + h.hexdigest()


def slot_of(chain: str, slots: int) -> int:
    """The llama.cpp slot a chain is pinned to (`upstream.llamacpp_slots` > 0)."""
    return stable_hash(chain) % slots


def cached_tokens(usage: dict[str, Any] | None) -> int | None:
    """The prompt tokens the upstream served from its cache, as the Responses usage says
    (`input_tokens_details.cached_tokens`); None when it does not say."""
    if not isinstance(usage, dict):
        return None
    details = usage.get("input_tokens_details")
    value = details.get("cached_tokens") if isinstance(details, dict) else None
    return value if wire.is_int(value) and value >= 0 else None


__all__ = [
    "CLIENT",
    "CONNECTION",
    "CONTENT",
    "cached_tokens",
    "chain_key",
    "client_key",
    "content_basis",
    "slot_of",
    "stable_hash",
]

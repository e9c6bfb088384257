"""The response store as the executor and the HTTP routes use it (`AsyncStore`,
proxy/core/store.py): `LocalStore`, the in-process `MemoryStore` behind the same calls as the
Redis store (proxy/ops/redis_store.py), and what /healthz and /readyz say of either."""

from __future__ import annotations

from typing import Any

from ..core.store import AsyncStore, MemoryStore, StoredResponse, WriteResult


class LocalStore:
    """The in-process store: every call answers at once."""

    backend = "memory"

    def __init__(self, store: MemoryStore) -> None:
        self.store = store

    async def load(self, rid: str, owner: str) -> StoredResponse | None:
        return self.store.get(rid, owner)

    async def save(self, stored: StoredResponse, owner: str) -> WriteResult:
        return self.store.put(stored, owner)

    async def delete(self, rid: str, owner: str) -> bool:
        return self.store.delete(rid, owner)

    async def reachable(self) -> bool:
        return True


async def store_status(store: AsyncStore | None) -> dict[str, Any] | None:
    """What /healthz (and /readyz) say of the store: `{"backend", "reachable"}`, one PING
    bounded by `store.redis_timeout` for Redis; None when the store is off."""
    if store is None:
        return None
    return {"backend": store.backend, "reachable": await store.reachable()}

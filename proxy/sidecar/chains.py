"""Continuation detection: is this HTTP request the next turn of a conversation an upstream
socket already holds? No I/O here: the adapter asks, sends, and reports back.

Theory of operation
-------------------
An HTTP-only client resends its whole conversation every turn: `input` is everything so far
(earlier input, the model's output items, then the new items) and the other fields are the
turn's settings. In WebSocket mode the remote server keeps the last response of each
socket, so the same turn can be sent as `previous_response_id` plus the new items only
(docs/protocol.md "Continuing and eviction", "What carries over").

For every request we hash each input item over a canonical JSON form and fold the hashes,
seeded with a hash of the non-input settings, into a running digest: `r[k]` names "these
settings, and these first k items". When a response completes on socket S, the digest
continued over its output items is remembered as a *chain head*: (response id, S). The next
request continues that chain exactly when one of its running digests `r[k]` is a remembered
head: then its first k items are the chain's input followed by its output, its settings are
the same, and `input[k:]` are the new items. The longest match wins.

Memory per chain is one fixed-size entry, whatever the history's length: no item is kept.
Chains are kept per credential (a hash of the headers that authenticate the upgrade), so two
credentials never share one, least recently used forgotten first, in bounded lru-dict maps.
A chain's successor replaces it. Whether the head's socket is still open, idle and holding
that response is the adapter's question; if not, the full request goes out.

Canonical form: keys sorted at every level, compact; in each top-level item, keys whose
value is null are dropped (null and absent mean the same in the API, and SDKs that re-dump
output items often drop them); an item with a `role` and no `type` is a `message` (the
API's own default), and a string `input` is one user message.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lru import LRU

from ..core import wire

# Fields that are not the turn's settings: the conversation itself, and how it is carried.
NOT_SETTINGS = frozenset({"input", "previous_response_id", "stream", "stream_options"})
# Fields of the HTTP request that have no meaning on the socket (docs/protocol.md
# "response.create").
HTTP_ONLY = frozenset({"stream"})

_DIGEST = 16


def _h(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=_DIGEST).digest()


def item_digest(item: Any) -> bytes:
    """The hash of one input or output item over its canonical form."""
    if isinstance(item, dict):
        item = {k: v for k, v in item.items() if v is not None}
        if "type" not in item and "role" in item:
            item["type"] = "message"
    return _h(wire.canonical(item))


def settings_digest(body: dict[str, Any]) -> bytes:
    return _h(
        b"settings:" + wire.canonical({k: v for k, v in body.items() if k not in NOT_SETTINGS})
    )


def fold(digest: bytes, item: bytes) -> bytes:
    return _h(digest + item)


def input_items(body: dict[str, Any]) -> list[Any] | None:
    """`input` as a list of items, or None when it is neither a string nor a list of
    objects (then the request is sent as it is and the upstream judges it)."""
    raw = body.get("input")
    if isinstance(raw, str):
        return [{"type": "message", "role": "user", "content": raw}]
    if isinstance(raw, list) and all(isinstance(i, dict) for i in raw):
        return raw
    return None


@dataclass(frozen=True, slots=True)
class ChainHead:
    response_id: str
    socket: int  # the serial of the upstream socket whose connection-local cache holds it
    key: bytes  # the running digest it is remembered under


@dataclass(frozen=True, slots=True)
class Plan:
    credential: bytes
    full: dict[str, Any]  # the whole request, as the socket's `response.create` body
    parent: ChainHead | None  # a remembered chain this request continues
    new_items: tuple[Any, ...]  # the input after the parent's items, as the client sent them
    input_key: bytes | None  # running digest over settings and the whole input; None: untracked

    @property
    def client_previous_id(self) -> str | None:
        prev = self.full.get("previous_response_id")
        return prev if isinstance(prev, str) and prev else None

    def delta(self) -> dict[str, Any]:
        """The continuation: the same settings, the parent's id and only the new items."""
        assert self.parent is not None
        body = {k: v for k, v in self.full.items() if k != "input"}
        body["previous_response_id"] = self.parent.response_id
        body["input"] = list(self.new_items)
        return body


class ChainMemory:
    def __init__(self, max_credentials: int, chains_per_credential: int) -> None:
        self.per_credential = chains_per_credential
        self._enabled = max_credentials > 0 and chains_per_credential > 0
        self._creds: Any = LRU(max(1, max_credentials))  # credential -> LRU(key -> ChainHead)

    def __len__(self) -> int:
        return sum(len(chains) for chains in self._creds.values())

    def _chains(self, credential: bytes, create: bool) -> Any:
        chains = self._creds.get(credential)
        if chains is None and create:
            chains = self._creds[credential] = LRU(self.per_credential)
        return chains

    def plan(self, credential: bytes, body: dict[str, Any]) -> Plan:
        """Decide how `body` (a `POST /v1/responses` JSON object) goes on the socket."""
        full = {k: v for k, v in body.items() if k not in HTTP_ONLY}
        items = input_items(body)
        tracked = (
            self._enabled
            and items is not None
            and not body.get("previous_response_id")  # the client chains itself: as it is
            and body.get("conversation") is None  # server-side conversation state
        )
        if not tracked:
            return Plan(credential, full, None, (), None)
        assert items is not None
        running = [settings_digest(body)]
        for item in items:
            running.append(fold(running[-1], item_digest(item)))
        chains = self._chains(credential, create=False)
        parent: ChainHead | None = None
        k = 0
        if chains is not None:
            # longest match first; at least one new item must follow the chain's items
            for k in range(len(items) - 1, 0, -1):
                parent = chains.get(running[k])
                if parent is not None:
                    break
        new = tuple(items[k:]) if parent is not None else ()
        return Plan(credential, full, parent, new, running[-1])

    def record(self, plan: Plan, response_id: str, socket: int, output: Sequence[Any]) -> None:
        """A response completed on `socket`: remember its chain, replacing its parent's."""
        if plan.input_key is None:
            return
        key = plan.input_key
        for item in output:
            key = fold(key, item_digest(item))
        chains = self._chains(plan.credential, create=True)
        if plan.parent is not None:
            chains.pop(plan.parent.key, None)
        chains[key] = ChainHead(response_id, socket, key)

    def forget(self, plan: Plan) -> None:
        """The parent cannot be continued (the upstream lost it): never offer it again."""
        if plan.parent is None:
            return
        chains = self._chains(plan.credential, create=False)
        if chains is not None:
            chains.pop(plan.parent.key, None)

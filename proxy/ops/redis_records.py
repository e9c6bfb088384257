"""A stored response as the Redis store writes and reads it (proxy/ops/redis_store.py has the
keys; proxy/ops/redis_scripts.py the scripts): `encode` makes the `Record` a write sends,
`decode` makes the stored response back from what the read script returns.

What does not change from turn to turn is written once per content, not once per turn: a
setting whose JSON is `SHARED_MIN` bytes or more (a coding agent's instructions and tool
definitions: tens of KB, the same at every turn) goes to a value of its own, keyed by the
hash of its bytes, and the record keeps the hash; so does the same field of the response
object (which echoes them). A turn then stores its new items and a few hundred bytes. The
hash is a blake2b digest of 128 bits, under the owner's prefix: two credentials never share
a value, and an equal hash is taken for equal bytes.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from immutables import Map

from ..core import wire
from ..core.conversation import STORED_ABOVE, CachedResponse, Segment, holds_compaction, linked
from ..core.guards import Unseen
from ..core.store import StoredResponse
from ..core.tokens.chain import TokenTurn, turn_of, turn_record
from ..core.tokens.identity import out_of_vocab, vocab_of

log = logging.getLogger("wsmode.store")

SHARED_MIN = 1024  # bytes of JSON from which a setting is stored once per content


@dataclass(frozen=True, slots=True)
class Record:
    """What one write sends: the record's fields and the values it shares."""

    parent: str  # the stored parent's id, "" when the record starts its chain
    segment: bytes  # its items' JSON, concatenated (`meta["lens"]` cuts them apart)
    meta: bytes
    response: bytes  # the response object, with its shared fields set to null
    shared: dict[str, bytes]  # hash -> the JSON of a value it shares


def digest(raw: bytes) -> str:
    return hashlib.blake2b(raw, digest_size=16).hexdigest()


def _share(
    doc: Mapping[str, Any], names: Iterable[str], shared: dict[str, bytes]
) -> tuple[dict[str, Any], dict[str, str]]:
    """`doc` with each of the fields `names` whose JSON is long enough set to null, and
    {field: hash} of them; their JSON goes into `shared`."""
    out = dict(doc)
    hashes: dict[str, str] = {}
    for name in names:
        value = out.get(name)
        if not isinstance(value, str | list | dict):
            continue
        raw = wire.dumps(value)
        if len(raw) >= SHARED_MIN:
            h = digest(raw)
            shared[h] = raw
            hashes[name] = h
            out[name] = None  # in place: the fields keep their order
    return out, hashes


def encode(stored: StoredResponse) -> Record:
    """The record `stored` is written as: its last segment after a stored parent, else the
    whole conversation it holds."""
    entry = stored.entry
    if stored.parent is not None:
        last = entry.last
        items: Sequence[bytes] = last.items if last is not None else ()
        calls: Sequence[str] = stored.added_calls
    else:
        items = list(entry.items())
        calls = list(entry.calls.keys())
    shared: dict[str, bytes] = {}
    settings, in_settings = _share(entry.settings, list(entry.settings), shared)
    # the text no moderation saw: after a stored parent only the turn's own (`unseen_up`:
    # the parent's record holds the rest), as the cache shares it (core/guards.py `Unseen`)
    held = entry.unmoderated
    after_parent = stored.parent is not None and isinstance(held, Unseen)
    unseen = list(held.own) if isinstance(held, Unseen) and after_parent else list(held)
    meta: dict[str, Any] = {
        "lens": [len(i) for i in items],
        "lane": entry.lane,
        "settings": settings,
        "calls": list(calls),
        "opaque": entry.opaque,
        "unmoderated": unseen,
        "replica": entry.replica,
        "chain": entry.chain,
        "inputs": stored.input_count,
    }
    if after_parent:
        meta["unseen_up"] = True
    if stored.parent is None and stored.continues:  # a chain's start: what it continues
        meta["above"] = list(stored.continues[:STORED_ABOVE])
    response = stored.response
    if in_settings:
        meta["shared"] = in_settings
        doc = wire.loads(response)
        if isinstance(doc, dict):  # the response object echoes them: the same values
            doc, in_response = _share(doc, in_settings, shared)
            if in_response:
                meta["rshared"] = in_response
                response = wire.dumps(doc)
    if entry.tokens is not None:
        meta["tok"] = _token_record(entry.tokens, stored.token_base if stored.parent else None)
    return Record(stored.parent or "", b"".join(items), wire.dumps(meta), response, shared)


def _token_record(turn: TokenTurn, base: TokenTurn | None) -> dict[str, Any]:
    """The token turns a record adds (core/tokens/chain.py): those after its stored parent's
    (`c` true), or the whole token chain (`c` false: it starts afresh)."""
    turns: list[dict[str, Any]] = []
    at: TokenTurn | None = turn
    while at is not None and at is not base:
        turns.append(turn_record(at))
        at = at.parent
    turns.reverse()
    return {"c": at is not None, "t": turns}


def _foreign_id(rec: dict[str, Any]) -> int | None:
    """An id of a stored token turn that the vocabulary its fingerprint records does not
    have (ids enter wsmode from outside here too: the store is shared)."""
    vocab = vocab_of(rec["f"])
    for ids in (*(ids for _, ids in rec["p"]), rec["gi"]):
        if (bad := out_of_vocab(ids, vocab)) is not None:
            return bad
    return None


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _restored(
    doc: Mapping[str, Any], hashes: Mapping[str, str], values: Mapping[str, bytes]
) -> Any:
    out = dict(doc)
    for name, h in hashes.items():
        out[name] = wire.loads(values[h])
    return out


def decode(rid: str, reply: Sequence[Any]) -> StoredResponse | None:
    """The stored response the read script returned (`reply`: the response object, the
    values its record shares, then segment, meta and parent id from the response itself
    back to its chain's start); None for an empty reply."""
    if not reply:
        return None
    count = int(reply[1])
    values = {_text(reply[2 + 2 * i]): bytes(reply[3 + 2 * i]) for i in range(count)}
    start = 2 + 2 * count
    links = [(reply[i], wire.loads(reply[i + 1])) for i in range(start, len(reply) - 2, 3)]
    # itself and the stored responses before it, nearest first (`stored_above`): its chain's
    # links, then what the chain's start continues
    ups = (_text(reply[i]) for i in range(start + 2, len(reply) - 3, 3))
    above = (rid, *ups, *links[-1][1].get("above", ()))[:STORED_ABOVE]
    segments: list[Segment] = []
    calls = Map[str, bool]().mutate()
    tokens: TokenTurn | None = None
    unseen: Collection[str] = ()  # the text no moderation saw, up to the link read
    untrusted = False  # a record of the token chain held ids outside its vocabulary
    for raw, meta in reversed(links):  # oldest first
        tok = meta.get("tok")
        if isinstance(tok, dict) and not (untrusted and tok.get("c")):
            base = tokens if tok.get("c") else None
            untrusted = False
            for rec in tok.get("t", ()):
                if (bad := _foreign_id(rec)) is not None:
                    log.warning(
                        "stored response %s holds token id %s, outside the vocabulary its "
                        "fingerprint records: its ids are not used",
                        rid,
                        bad,
                    )
                    untrusted = True
                    break
                base = turn_of(rec, base)
            tokens = None if untrusted else base
        else:  # a response made on another path (or on untrusted ids): no ids
            tokens = None
        items, at = [], 0
        for n in meta["lens"]:
            items.append(raw[at : at + n])
            at += n
        segments.append(Segment(tuple(items)))
        for call in meta["calls"]:
            calls[call] = True
        texts = tuple(meta["unmoderated"])
        unseen = Unseen(texts, unseen) if meta.get("unseen_up") else texts
    own = links[0][1]
    response = bytes(reply[0])
    if own.get("rshared"):
        response = wire.dumps(_restored(wire.loads(response), own["rshared"], values))
    entry = CachedResponse(
        rid,
        own["lane"],
        linked(segments),
        _restored(own["settings"], own.get("shared", {}), values),
        calls.finish(),
        own["opaque"],
        unseen,
        own.get("replica"),
        own.get("chain"),
        any(holds_compaction(seg.items) for seg in segments),
        tokens,
        above,
    )
    return StoredResponse(entry, response, own["inputs"])

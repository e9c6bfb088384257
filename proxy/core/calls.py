"""The call index of a cached conversation (proxy/core/conversation.py `CachedResponse.calls`).

A conversation's *call index* is the `call_id` of every tool call it holds, in an immutable
hash map (HAMT, `immutables.Map`) that a child extends with its own new items only, sharing
the rest, so that checking a new tool output against the whole history (`orphan_output`)
costs the same at 4 MB of history as at 20 KB. A compacted
conversation keeps its parent's index (the calls a compaction item stands for still
existed), and a conversation that took in a compaction item the proxy cannot open is marked
`opaque`: its index is incomplete, so unknown call ids are let through there.
"""

from __future__ import annotations

from collections.abc import Iterable

from immutables import Map

from . import wire

CallIndex = Map[str, bool]  # call_id -> True, for every tool call a conversation holds
NO_CALLS: CallIndex = Map()
# outputs that must answer a call of the conversation (OpenAI: 400 "No tool call found ...")
CHECKED_OUTPUTS = {
    "function_call_output": "function call output",
    "custom_tool_call_output": "custom tool call output",
}
_CALL_ID = b'"call_id"'


def _tool_item(item: bytes) -> tuple[str, str] | None:
    """(type, call_id) of an item that has a string `call_id`; None for any other item.
    Items without the key (most of them) are skipped without parsing."""
    if _CALL_ID not in item:
        return None
    doc = wire.loads(item)
    if not isinstance(doc, dict):
        return None
    kind, call_id = doc.get("type"), doc.get("call_id")
    if isinstance(kind, str) and isinstance(call_id, str):
        return kind, call_id
    return None


def index_calls(calls: CallIndex, items: Iterable[bytes]) -> CallIndex:
    """`calls` plus the calls among `items` (any item with a `call_id` that is not an
    output: function, custom tool, shell, computer calls...). Costs O(len(items))."""
    m = calls.mutate()
    for item in items:
        found = _tool_item(item)
        if found is not None and not found[0].endswith("_output"):
            m[found[1]] = True
    return m.finish()


def orphan_output(calls: CallIndex, items: Iterable[bytes]) -> tuple[int, str, str] | None:
    """The first function or custom tool call output among `items` whose `call_id` names no
    call in `calls` nor earlier in `items`: (its index, its type, the call id); else None.
    A call may be answered more than once: the rule is "the call exists"."""
    earlier: set[str] = set()
    for index, item in enumerate(items):
        found = _tool_item(item)
        if found is None:
            continue
        kind, call_id = found
        if kind in CHECKED_OUTPUTS:
            if call_id not in calls and call_id not in earlier:
                return index, kind, call_id
        elif not kind.endswith("_output"):
            earlier.add(call_id)
    return None


__all__ = ["CHECKED_OUTPUTS", "NO_CALLS", "CallIndex", "index_calls", "orphan_output"]

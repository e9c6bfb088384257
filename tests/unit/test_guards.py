"""The input guard interface (proxy/core/guards.py) and the session running it, without I/O."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import orjson
from wsmode.build import build_guards
from wsmode.core.errors import ClientError
from wsmode.core.guards import DenyPatterns, Guards, MaxNewInputBytes, NewInput, Unseen, text_of
from wsmode.core.session import Session

from tests.support.helpers import proxy_settings
from tests.support.session import (
    complete,
    input_refused,
    make_session,
    send_create,
    sends,
    starts,
    user,
)


@dataclass
class Recorder:
    """A guard of one's own: it records every turn it is shown, and refuses 'stop'."""

    seen: list[tuple[bytes, ...]] = field(default_factory=list)

    def check(self, turn: NewInput) -> ClientError | None:
        self.seen.append(turn.items)
        if "stop" in turn.texts:
            return ClientError("stopped", code="stopped_by_recorder", param="input")
        return None


def guarded(*checks: object, moderation: bool = False) -> Session:
    s = make_session()
    s = replace(s, guards=Guards(tuple(checks), moderation=moderation))  # type: ignore[arg-type]
    return s


def test_text_of_items() -> None:
    parts = [{"type": "input_text", "text": "a"}, {"type": "input_image"}, {"text": "b"}]
    assert text_of({"role": "user", "content": parts}) == "a\nb"
    assert text_of({"type": "function_call_output", "call_id": "c", "output": "out"}) == "out"
    assert text_of({"type": "function_call", "arguments": '{"x": 1}'}) == ""
    assert NewInput((orjson.dumps(user("hi")), orjson.dumps({"type": "x"}))).texts == ("hi",)


def test_guards_see_only_new_items_and_may_refuse() -> None:
    rec = Recorder()
    s = guarded(rec)
    prev = None
    for i in range(5):
        fields = {"input": [user(f"turn {i} " + "h" * 500)]}
        if prev:
            fields["previous_response_id"] = prev  # type: ignore[assignment]
        prev, _ = complete(s, starts(send_create(s, **fields))[0])
    assert [len(items) for items in rec.seen] == [1] * 5  # never the history
    out = send_create(s, input=[user("stop")], previous_response_id=prev)
    assert starts(out) == []
    (ev,) = sends(out)
    assert (ev["status"], ev["error"]["code"]) == (400, "stopped_by_recorder")
    assert prev not in s.cache  # a failed continuation evicts its parent


def test_built_in_guards() -> None:
    small = NewInput((b"x" * 10,))
    assert MaxNewInputBytes(10).check(small) is None
    err = MaxNewInputBytes(9).check(small)
    assert err is not None and err.code == "input_too_large"
    deny = DenyPatterns.compile([r"\bpassw(or)?d\b"])
    assert deny.check(NewInput((orjson.dumps(user("no secrets")),))) is None
    err = deny.check(NewInput((orjson.dumps(user("my PASSWORD is")),)))
    assert err is not None and (err.code, err.status) == ("invalid_prompt", 400)


def test_moderation_text_rides_on_the_start_once() -> None:
    s = guarded(moderation=True)
    (start,) = starts(send_create(s, input=[user("one"), user("two")]))
    assert start.moderate == ("one", "two")
    refused = input_refused(s, start.run_id, ClientError("no", code="invalid_prompt"))
    assert [ev["error"]["code"] for ev in sends(refused)] == ["invalid_prompt"]
    assert s.active_count == 0
    # no text, nothing to ask
    (start,) = starts(send_create(s, input=[{"type": "message", "role": "user", "content": []}]))
    assert start.moderate is None


def test_settings_build_the_guards() -> None:
    assert build_guards(proxy_settings("http://u")) is None
    built = build_guards(
        proxy_settings("http://u", guards__max_new_input_bytes=5, guards__deny_patterns=("a",))
    )
    assert built is not None and not built.moderation
    assert [type(g).__name__ for g in built.checks] == ["MaxNewInputBytes", "DenyPatterns"]
    mod = build_guards(proxy_settings("http://u", guards__moderation_url="http://m/v1/moderations"))
    assert mod is not None and mod.moderation and mod.checks == ()


def test_a_warm_up_chain_shares_its_unmoderated_text_and_the_next_turn_sends_it_all() -> None:
    """Each `generate: false` turn keeps its own text after its parent's, never a copy of
    the chain's (a copy per turn held n^2 strings' references over a chain)."""
    s = guarded(moderation=True)
    prev = None
    for turn in range(1, 2_001):
        fields: dict[str, object] = {"generate": False, "input": [user(f"w{turn}")]}
        if prev is not None:
            fields["previous_response_id"] = prev
        send_create(s, **fields)
        parent = s.cache.peek(prev) if prev is not None else None
        prev = f"resp_warm{turn}"
        entry = s.cache.peek(prev)
        assert entry is not None and len(entry.unmoderated) == turn
        if parent is not None:
            assert isinstance(entry.unmoderated, Unseen)
            assert entry.unmoderated.up is parent.unmoderated
            assert entry.unmoderated.own == (f"w{turn}",)
    (start,) = starts(send_create(s, input=[user("go")], previous_response_id=prev))
    assert start.moderate == (*(f"w{t}" for t in range(1, 2_001)), "go")

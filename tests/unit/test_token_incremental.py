"""Rendering only a continuation's new messages (proxy/core/tokens/incremental.py,
template_shape.py): which templates allow it, and that the text is byte for byte the whole
conversation's rendering, turn after turn, on random conversations."""

from __future__ import annotations

import weakref
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from wsmode.core import wire
from wsmode.core.tokens.chain import Segment, TokenTurn
from wsmode.core.tokens.incremental import Rendered, RenderMemo, render_turn
from wsmode.core.tokens.template import ChatTemplate, TemplateFailed

ROOT = Path(__file__).parents[2]
SIM = (ROOT / "proxy" / "sim" / "turns-with-tools.jinja").read_text()
REWRITING = (ROOT / "tests" / "fixtures" / "templates" / "drops-earlier-thinking.jinja").read_text()
# ChatML, as Qwen2.5-like templates write it, with the system prompt and tools up front
CHATML = (
    "{%- if messages[0].role == 'system' -%}<|im_start|>system\n{{ messages[0].content }}"
    "{%- if tools %}\n# Tools\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}{% endif -%}"
    "<|im_end|>\n{%- endif -%}"
    "{%- for m in messages -%}{%- if not (loop.first and m.role == 'system') -%}"
    "<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{%- for tc in m.tool_calls or [] %}\n<tool_call>\n{{ tc.function | tojson }}\n</tool_call>"
    "{%- endfor -%}<|im_end|>\n{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}"
)
DATED = "{{ 'Today: ' + strftime_now('%Y-%m-%d') }}\n" + CHATML


FP = "llamacpp|m|t|"


def _turn(
    parent: TokenTurn | None, prompt: str, pids: list[int], gen: str, gids: list[int]
) -> TokenTurn:
    return TokenTurn(parent, FP, (Segment.of(prompt, pids),), Segment.of(gen, gids))


def template(source: str, **kw: Any) -> ChatTemplate:
    return ChatTemplate(source, name="t.jinja", bos_token="<bos>", eos_token="<eos>", **kw)


# ------------------------------------------------------------------ which templates


def test_templates_that_render_one_message_at_a_time_are_append_only() -> None:
    assert template(SIM).append_only is None
    assert template(CHATML).append_only is None


@pytest.mark.parametrize(
    ("source", "why"),
    [
        (REWRITING, "one top-level loop"),  # it scans the messages first (Qwen3-like)
        (
            "{% for m in messages %}{{ m.content }}{% if loop.last %}!{% endif %}{% endfor %}",
            "loop.last",
        ),
        ("{% for m in messages %}{{ loop.index0 }}{{ m.content }}{% endfor %}", "loop.index0"),
        (
            "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
            "{{ ns.n }}{% endfor %}",
            "namespace",
        ),
        ("{% for m in messages[1:] %}{{ m.content }}{% endfor %}", "one top-level loop"),
        (
            "{% for m in messages %}{{ m.content }}{% endfor %}{{ messages | length }}",
            "otherwise than one by one",
        ),
        (
            "{% for m in messages %}{{ messages[loop.index0 + 1] }}{% endfor %}",
            "otherwise than one by one",
        ),
        ("{% for m in messages if m.role != 'system' %}{{ m.content }}{% endfor %}", "filters"),
        ("{% for m in messages %}{{ m.content }}{% endfor %}eos", "more than the generation"),
        (
            "{% for m in messages %}{% if add_generation_prompt %}x{% endif %}{% endfor %}",
            "add_generation_prompt",
        ),
        ("{% for m in messages %}{{ strftime_now('%d') }}{% endfor %}", "date"),
    ],
)
def test_templates_that_may_rewrite_the_history_render_whole(source: str, why: str) -> None:
    reason = template(source).append_only
    assert reason is not None and why in reason, reason


# ------------------------------------------------------------------ the same text


def message(role: str, text: str, calls: int = 0) -> dict[str, Any]:
    out: dict[str, Any] = {"role": role, "content": text}
    if calls:
        out["tool_calls"] = [
            {"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": {"i": i}}}
            for i in range(calls)
        ]
    return out


TEXTS = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
TURN = st.tuples(
    st.lists(st.sampled_from(["user", "tool", "system"]), min_size=1, max_size=3),
    TEXTS,
    st.integers(0, 2),
)


@settings(max_examples=100, deadline=None)
@given(
    source=st.sampled_from([SIM, CHATML]),
    system=st.booleans(),
    tools=st.booleans(),
    turns=st.lists(TURN, min_size=1, max_size=6),
)
def test_rendering_only_the_new_messages_gives_the_whole_conversations_text(
    source: str, system: bool, tools: bool, turns: list[tuple[list[str], str, int]]
) -> None:
    t = template(source)
    assert t.append_only is None
    fns = [{"type": "function", "function": {"name": "f"}}] if tools else None
    history: list[bytes] = [wire.dumps(message("system", "be brief"))] if system else []
    previous: Rendered | None = None
    incremental = 0
    for roles, text, calls in turns:
        history += [wire.dumps(message(r, f"{r} says {text}")) for r in roles]
        got = render_turn(t, history, fns, FP, previous)
        whole = t.render([wire.loads(m) for m in history], fns)
        if got.after is not None:
            incremental += 1
            assert got.whole is None
            # the parent's prompt was whole(previous messages) + its generation prompt
            prior = t.render([wire.loads(m) for m in got.after.messages], fns)
            assert prior.endswith(got.after.prompt)
            assert prior[: len(prior) - len(got.after.prompt)] + got.tail == whole
        else:
            assert got.whole == got.tail == whole
        previous = got.rendered
        assert previous is not None
        history.append(wire.dumps(message("assistant", f"answer {text}", calls)))
    assert incremental == len(turns) - 1  # every continuation rendered only its new messages


def test_a_history_that_is_not_the_previous_ones_renders_whole() -> None:
    t = template(SIM)
    first = [wire.dumps(message("system", "be brief")), wire.dumps(message("user", "hi"))]
    rendered = render_turn(t, first, None, FP).rendered
    assert rendered is not None
    answer = wire.dumps(message("assistant", "hello"))
    edited = [wire.dumps(message("system", "be long")), first[1], answer]
    assert render_turn(t, edited, None, FP, rendered).after is None  # instructions edited
    assert render_turn(t, [first[1], answer], None, FP, rendered).after is None  # truncated
    assert render_turn(t, [*first, answer], None, "other", rendered).after is None  # tools...
    assert render_turn(t, [*first, answer], None, FP, rendered).after is rendered


def test_a_template_that_prints_the_date_renders_whole_when_the_date_changed() -> None:
    now = [86_400.0 * 3]
    t = template(DATED, clock=lambda: now[0])
    assert t.append_only is None and t.uses_clock
    msgs = [wire.dumps(message("system", "s")), wire.dumps(message("user", "hi"))]
    rendered = render_turn(t, msgs, None, FP).rendered
    assert rendered is not None
    more = [*msgs, wire.dumps(message("assistant", "a")), wire.dumps(message("user", "b"))]
    assert render_turn(t, more, None, FP, rendered).after is rendered  # the same day
    now[0] += 86_400
    again = render_turn(t, more, None, FP, rendered)
    assert again.after is None and again.whole == t.render([wire.loads(m) for m in more])


def test_a_template_failure_is_named_from_the_whole_rendering() -> None:
    t = template(
        "{% if messages[0].content == 'x' %}{{ raise_exception('no x') }}{% endif %}" + SIM
    )
    ok = render_turn(t, [wire.dumps(message("user", "a"))], None, FP).rendered
    assert ok is not None
    with pytest.raises(TemplateFailed) as err:
        render_turn(t, [wire.dumps(message("user", "x"))], None, FP, ok)
    assert err.value.culprit == 0 and "no x" in err.value.message


def test_the_memo_keeps_one_entry_a_chain_and_no_turn_alive() -> None:
    memo = RenderMemo(1 << 20)
    t = template(SIM)
    r = render_turn(t, [wire.dumps(message("user", "hi"))], None, FP).rendered
    assert r is not None
    first = _turn(None, "p", [1], "g", [2])
    memo.keep(first, r, None)
    found = memo.find(first)
    assert found is not None and found.rendered is r
    second = _turn(first, "p2", [3], "g2", [4])
    memo.keep(second, r, first)  # the child's entry replaces the parent's
    assert memo.find(first) is None and len(memo) == 1
    found = memo.find(second)
    # the chain's ids as prompt pieces, extended from the parent's, not walked again
    assert found is not None and (found.kept, found.ids) == ((b"1", b"2", b"3", b"4"), 4)
    assert found.kept == tuple(s.json for s in second.segments())
    gone = weakref.ref(second)
    del second, found
    assert gone() is None  # held weakly: the memo never keeps a chain the cache let go


def test_a_chain_through_the_dialect_renders_only_new_messages_and_sends_exact_ids() -> None:
    """The token dialect's own planning, turn after turn, with the memo: every continuation
    goes on from its parent's rendering, and its prompt is the sim vocabulary's ids of the
    whole conversation as the template renders it."""
    from wsmode.core.dialects.chat import ChatDialect
    from wsmode.core.tokens.chain import new_ids, prompt_json, turn_after
    from wsmode.core.tokens.dialect import TokenDialect, TokenSetup
    from wsmode.core.tokens.engine import LlamaCppEngine
    from wsmode.core.tokens.parsers import HermesParser
    from wsmode.sim import vocab

    t = template(SIM)
    marker = ("<start_of_turn>", vocab.SPECIALS["<start_of_turn>"])
    setup = TokenSetup(LlamaCppEngine(), t, HermesParser, turn_end=t.turn_end(), turn_marker=marker)
    dialect = TokenDialect(ChatDialect())
    dialect.ready(setup)

    class Parent:  # what the dialect reads of a cached response
        def __init__(self, tokens: TokenTurn) -> None:
            self.tokens = tokens

    items = [wire.dumps({"type": "message", "role": "user", "content": "hi there"})]
    turn: TokenTurn | None = None
    for i in range(6):
        parent: Any = Parent(turn) if turn is not None else None
        prompt, fp = dialect.prompt({"model": "m", "instructions": "be brief"}, items, parent, {})
        plan = prompt.plan
        assert plan.divergences == ()
        assert (prompt.rendered is not None) and (i == 0 or dialect.renders.hits == i)
        gaps = [
            new_ids(g, vocab.encode(g.text, add_special=not plan.kept, parse_special=True))
            for g in plan.gaps
        ]
        sent = prompt_json(plan, *[",".join(map(str, g)).encode() for g in gaps])
        msgs = [{"role": "system", "content": "be brief"}]
        msgs += [_as_chat(x) for x in items]
        whole = t.render(msgs)
        assert (
            sent == b"[" + ",".join(map(str, vocab.encode(whole, add_special=True))).encode() + b"]"
        )
        answer = f"answer {i}"
        gen = Segment.of(answer, vocab.encode(answer, parse_special=False))
        new = turn_after(plan, gaps, marker, fp, gen)
        assert prompt.rendered is not None
        dialect.renders.keep(new, prompt.rendered, turn)
        turn = new
        items = [
            *items,
            wire.dumps({"type": "message", "role": "assistant", "content": answer}),
            wire.dumps({"type": "message", "role": "user", "content": f"and {i}?"}),
        ]


def _as_chat(item: bytes) -> dict[str, Any]:
    doc = wire.loads(item)
    return {"role": doc["role"], "content": doc["content"]}

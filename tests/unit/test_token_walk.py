"""A continuation's walk (proxy/core/tokens/walk.py) on random conversations whose history the
template rewrites at random, tokenised with the simulated model's vocabulary (a real
tokenizer's rule: special tokens split the text, nothing else is additive): the ids a prompt
is made of, kept and new, are always the server's own ids of the whole rendered text, and
every divergence is counted."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st
from wsmode.core.tokens.chain import Segment, TokenTurn, new_ids, prompt_json, turn_after
from wsmode.core.tokens.walk import continue_after, continue_from
from wsmode.sim import vocab

FP = "llamacpp|sim|t|"
MARKER = ("<start_of_turn>", vocab.SPECIALS["<start_of_turn>"])
TURN_END = "<end_of_turn>\n"
ASK = "<start_of_turn>model\n"
WORDS = st.text(st.sampled_from("ab cd\n<>/é"), min_size=0, max_size=9)


@dataclass
class Exchange:
    user: str
    think: str
    answer: str
    shown: bool = True  # the template still shows its reasoning
    tool: bool = False  # the user's turn is a tool's answer

    def generated(self) -> str:
        return f"<think>{self.think}</think>{self.answer}" if self.think else self.answer


def render(history: list[Exchange], new: Exchange) -> str:
    out = []
    for ex in [*history, new]:
        user = f"<tool_response>\n{ex.user}\n</tool_response>" if ex.tool else ex.user
        out.append(f"<start_of_turn>user\n{user}<end_of_turn>\n{ASK}")
        if ex is not new:
            out.append(f"{ex.generated() if ex.shown else ex.answer}{TURN_END}")
    return "".join(out)


def ids_of(plan_text_at_start: bool, text: str) -> list[int]:
    return vocab.encode(text, add_special=plan_text_at_start, parse_special=True)


EXCHANGE = st.builds(Exchange, WORDS, WORDS, WORDS, st.just(True), st.booleans())
EDIT = st.sampled_from(["none", "drop_think", "drop_first", "edit_user"])


@settings(max_examples=300, deadline=None)
@given(
    turns=st.lists(st.tuples(EXCHANGE, EDIT, st.integers(0, 7)), min_size=1, max_size=6),
    eos=st.booleans(),
)
def test_a_prompt_is_always_the_servers_ids_of_the_whole_text(
    turns: list[tuple[Exchange, str, int]], eos: bool
) -> None:
    history: list[Exchange] = []
    parent: TokenTurn | None = None
    so_far = ""  # the parent's chain as text: its prompts and generations
    for ex, edit, which in turns:
        if history and edit == "drop_think":
            history[which % len(history)].shown = False
        elif history and edit == "drop_first":
            history = history[1:]
        elif history and edit == "edit_user":
            history[which % len(history)].user += "!"
        rendered = render(history, ex)
        changed = not rendered.startswith(so_far + TURN_END)
        plan = continue_from(parent, rendered, FP, TURN_END, MARKER[0])
        gaps = []
        for i, gap in enumerate(plan.gaps):
            at_start = i == 0 and plan.parts[0] is gap and not plan.kept
            gaps.append(new_ids(gap, ids_of(at_start, gap.text)) if gap.text else [])
        pieces = [",".join(map(str, g)).encode() for g in gaps]
        sent = orjson_list(prompt_json(plan, *pieces))
        assert sent == vocab.encode(rendered, add_special=True, parse_special=True)
        assert plan.kept_ids + sum(map(len, gaps)) == len(sent)
        if parent is not None:  # a rewritten history is counted, else nothing diverged
            assert bool(plan.divergences) == changed, (plan.divergences, rendered, so_far)
            assert changed or len(plan.gaps) == 1
        # the model answers; its ids are its own (here the vocabulary's, an end-of-turn id
        # after them when it stopped on it)
        text = ex.generated()
        gen_ids = vocab.encode(text, parse_special=False)
        if eos:
            gen_ids.append(vocab.SPECIALS["<end_of_turn>"])
        parent = turn_after(plan, gaps, MARKER, FP, Segment.of(text, gen_ids), eos=eos)
        assert parent.prompt_ids() == sent
        so_far = rendered + text
        history.append(ex)


def orjson_list(raw: bytes) -> list[int]:
    text = raw.decode()[1:-1]
    return [int(x) for x in text.split(",")] if text else []


def test_the_fast_path_keeps_what_the_walk_keeps() -> None:
    first = render([], Exchange("hi", "", ""))
    ids = vocab.encode(first, add_special=True, parse_special=True)
    plan = continue_from(None, first, FP, TURN_END, MARKER[0])
    turn = turn_after(
        plan, [ids], MARKER, FP, Segment.of("hello", vocab.encode("hello", parse_special=False))
    )
    ex = Exchange("hi", "", "hello")
    rendered = render([ex], Exchange("more", "", ""))
    walked = continue_from(turn, rendered, FP, TURN_END, MARKER[0])
    tail = rendered[len(first) - len(ASK) :]
    fast = continue_after(turn, tail, ASK, FP, TURN_END)
    assert fast is not None
    assert (fast.kept_ids, fast.text, fast.divergences) == (
        walked.kept_ids,
        walked.text,
        walked.divergences,
    )
    assert prompt_json(fast, b"9") == prompt_json(walked, b"9")
    # the generation renders otherwise: both tokenise it again, and say so
    rerendered = rendered.replace("hello", "hello!")
    fast = continue_after(turn, rerendered[len(first) - len(ASK) :], ASK, FP, TURN_END)
    walked = continue_from(turn, rerendered, FP, TURN_END, MARKER[0])
    assert fast is not None
    assert (fast.kept_ids, fast.text, fast.divergences) == (
        walked.kept_ids,
        walked.text,
        walked.divergences,
    )

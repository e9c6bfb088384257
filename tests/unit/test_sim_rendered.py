"""The simulated model reads a token prompt's template turns (sim/rendered.py): a
continuation of a prompt already read is read from where its final turns end, and must read
exactly as the whole prompt read at once."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from wsmode.sim import rendered

_BODY = st.text(alphabet="ab \n<>_/", max_size=12)
_TURN = st.tuples(st.sampled_from(["user", "model"]), _BODY)


def _prompt(turns: list[tuple[str, str]], tail: str) -> str:
    return "".join(f"<start_of_turn>{r}\n{b}<end_of_turn>\n" for r, b in turns) + tail


@given(
    st.lists(_TURN, max_size=5),
    st.sampled_from(["", "<start_of_turn>model\n", "<start_of_turn>user\nhalf", "<end_of_turn>"]),
    st.data(),
)
def test_a_continuation_reads_as_the_whole_prompt(
    turns: list[tuple[str, str]], tail: str, data: st.DataObject
) -> None:
    whole = _prompt(turns, tail)
    cut = data.draw(st.integers(0, len(whole)))
    first = rendered.turns_from(whole[:cut])
    rest = rendered.turns_from(whole, first.end)
    assert first.turns[: first.final] + rest.turns == rendered.turns_from(whole).turns


def test_a_last_turn_that_runs_to_the_end_is_read_again() -> None:
    # "<end_of_turn>" without its newline, or no end at all: the next ids may change it
    for open_end in ("<start_of_turn>user\nhi<end_of_turn>", "<start_of_turn>model\nhal"):
        read = rendered.turns_from("<start_of_turn>user\nq<end_of_turn>\n" + open_end)
        assert len(read.turns) == 2 and read.final == 1
        assert read.end == len("<start_of_turn>user\nq<end_of_turn>\n")
    assert rendered.turns_from("no turns").end == 0


def test_the_view_is_the_turns_read() -> None:
    prompt = _prompt([("user", "q"), ("model", "a")], "<start_of_turn>model\n")
    items = rendered.view(prompt)["input"]
    assert [(i["role"], i["content"]) for i in items] == [("user", "q"), ("assistant", "a")]

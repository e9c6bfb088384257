"""The token cache (proxy/core/tokens/chain.py): which ids a continuation keeps, what it
tokenises, and every divergence named."""

from __future__ import annotations

from wsmode.core.tokens.chain import (
    DIVERGENCES,
    Segment,
    TokenTurn,
    chain_records,
    fresh,
    new_ids,
    prompt_json,
    split_at_turns,
    turn_of,
)
from wsmode.core.tokens.walk import continue_from

FP = "llamacpp|m|t|"
P1 = "<s>user\nhi<e>\n<s>model\n"
G1 = "Hello there"
S2 = "<e>\n<s>user\nmore<e>\n<s>model\n"
G2 = "Sure"


def _turn(
    parent: TokenTurn | None,
    prompt: str,
    pids: list[int],
    gen: str,
    gids: list[int],
    *,
    eos: bool = False,
) -> TokenTurn:
    return TokenTurn(parent, FP, (Segment.of(prompt, pids),), Segment.of(gen, gids), eos=eos)


def _two_turns() -> TokenTurn:
    first = _turn(None, P1, [1, 2, 3, 4], G1, [10, 11])
    return _turn(first, S2, [5, 6, 7], G2, [12])


def test_a_first_turn_tokenises_the_whole_rendering() -> None:
    plan = continue_from(None, P1, FP)
    assert plan == fresh(P1)
    assert plan.kept_ids == 0 and plan.text == P1 and plan.divergence is None
    assert prompt_json(plan, b"1,2,3,4") == b"[1,2,3,4]"


def test_a_continuation_keeps_every_id_and_tokenises_only_the_new_text() -> None:
    parent = _two_turns()
    new = "<e>\n<s>user\nagain<e>\n<s>model\n"
    plan = continue_from(parent, P1 + G1 + S2 + G2 + new, FP, "<e>\n")
    assert plan.divergence is None
    assert plan.text == new
    assert plan.kept_ids == 4 + 2 + 3 + 1
    assert plan.base is parent
    assert prompt_json(plan, b"8,9") == b"[1,2,3,4,10,11,5,6,7,12,8,9]"


def test_the_prompt_is_the_parents_prompt_then_its_generation() -> None:
    parent = _two_turns()
    assert parent.prompt_ids() == [1, 2, 3, 4, 10, 11, 5, 6, 7]
    assert parent.segments()[-1].ids.tolist() == [12]


def test_a_rewritten_history_keeps_the_ids_before_it_and_says_why() -> None:
    parent = _two_turns()
    # the template renders the second user turn differently now (an edited instruction...)
    rendered = P1 + G1 + "<e>\n<s>user\nMORE<e>\n<s>model\n" + G2 + "<e>\n<s>user\nx"
    plan = continue_from(parent, rendered, FP)
    assert plan.divergence == "history_changed"
    assert plan.kept_ids == 6  # the first turn's prompt and generation
    assert plan.text == rendered[len(P1 + G1) :]
    assert plan.base is parent.parent


def test_a_generation_rendered_otherwise_keeps_its_prompt_and_says_why() -> None:
    parent = _two_turns()
    # the template writes the model's turn otherwise (reasoning dropped, a call re-serialised)
    rendered = P1 + G1 + S2 + "Sure!" + "<e>\n<s>user\nx"
    plan = continue_from(parent, rendered, FP, "<e>\n")
    assert plan.divergence == "generation_rerendered"
    assert plan.kept_ids == 4 + 2 + 3
    assert plan.text == rendered[len(P1 + G1 + S2) :]
    assert plan.base is not None and plan.base.generated.ids.tolist() == []
    assert plan.base.prompt[0].ids.tolist() == [5, 6, 7]
    assert prompt_json(plan, b"99") == b"[1,2,3,4,10,11,5,6,7,99]"


def test_a_generation_rendered_with_less_keeps_its_prompt() -> None:
    parent = _two_turns()
    rendered = P1 + G1 + S2 + "Su" + "<e>\n<s>user\nx"
    plan = continue_from(parent, rendered, FP, "<e>\n")
    assert plan.divergence == "generation_rerendered" and plan.kept_ids == 9


def test_another_model_template_or_tool_set_starts_afresh() -> None:
    rendered = P1 + G1 + S2
    plan = continue_from(_two_turns(), rendered, "llamacpp|other|t|")
    assert plan.divergence == "fingerprint"
    assert plan.kept_ids == 0 and plan.text == rendered and plan.base is None


def test_every_divergence_has_a_metric_label() -> None:
    assert set(DIVERGENCES) == {
        "fingerprint",
        "history_changed",
        "generation_rerendered",
        "parent_without_ids",
    }


def test_an_end_of_generation_id_is_not_written_twice() -> None:
    # the model ended on its end-of-turn id (7), which the template writes again after it
    first = _turn(None, P1, [1, 2], G1, [10, 7], eos=True)
    plan = continue_from(first, P1 + G1 + S2, FP)
    assert plan.repeated == 7
    assert new_ids(plan, [7, 8, 9]) == [8, 9]
    assert new_ids(plan, [8, 9]) == [8, 9]
    # a generation cut by the limit did not produce it: nothing is left out
    cut = _turn(None, P1, [1, 2], G1, [10, 7])
    assert new_ids(continue_from(cut, P1 + G1 + S2, FP), [7, 8]) == [7, 8]


def test_a_chain_shares_its_parents_ids_instead_of_copying_them() -> None:
    turn: TokenTurn | None = None
    text = ""
    for i in range(200):
        prompt = f"<s>user\n{i}<e>\n"
        turn = _turn(turn, prompt, [i, i], "ok", [1000 + i])
        text += prompt + "ok"
    assert turn is not None
    # what a turn holds of its own does not grow with the chain
    assert turn.nbytes == turn.parent.nbytes if turn.parent else False
    plan = continue_from(turn, text + "<s>user\nnext", FP)
    assert plan.divergence is None and plan.kept_ids == 600 and plan.text == "<s>user\nnext"


def test_stored_records_round_trip_after_a_stored_parent() -> None:
    parent = _two_turns()
    child = _turn(parent, "<e>\nnew", [8], "gen", [13, 14])
    # written after the parent's turn: only the child's own record
    records = chain_records(child, parent)
    assert len(records) == 1
    back = turn_of(records[0], parent)
    assert back == child
    # a chain that starts afresh is written whole, and read back equal id for id
    whole = chain_records(child, None)
    assert len(whole) == 3
    rebuilt = None
    for rec in whole:
        rebuilt = turn_of(rec, rebuilt)
    assert rebuilt is not None and rebuilt.prompt_ids() == child.prompt_ids()
    assert rebuilt.generated.ids.tolist() == [13, 14]


def test_a_prompt_is_kept_in_pieces_cut_before_each_turn_marker() -> None:
    text = "<s>user\nhi<e>\n<s>model\n"
    # a BOS (1) before the first marker (7): the first piece keeps it
    pieces = split_at_turns(text, [1, 7, 20, 21, 8, 9, 7, 30, 9], ("<s>", 7))
    assert [p.text for p in pieces] == ["<s>user\nhi<e>\n", "<s>model\n"]
    assert [p.ids.tolist() for p in pieces] == [[1, 7, 20, 21, 8, 9], [7, 30, 9]]
    # the marker written in the text but not tokenised as the marker: kept whole
    whole = split_at_turns(text, [1, 7, 20, 21, 8, 9, 31, 30, 9], ("<s>", 7))
    assert len(whole) == 1 and whole[0].ids.tolist() == [1, 7, 20, 21, 8, 9, 31, 30, 9]
    assert len(split_at_turns(text, [1, 2], None)) == 1


def test_a_changed_message_keeps_the_ids_of_those_before_it() -> None:
    marker = ("<s>", 7)
    first = TokenTurn(
        None,
        FP,
        split_at_turns("<s>sys<e>\n<s>user\nhi<e>\n<s>model\n", [7, 1, 8, 7, 2, 8, 7, 3], marker),
        Segment.of("ok", [40]),
    )
    # the model's turn is not in the history any more (a steer cut it before any text)
    rendered = "<s>sys<e>\n<s>user\nhi<e>\n<s>user\nstop<e>\n<s>model\n"
    plan = continue_from(first, rendered, FP, "<e>\n")
    assert plan.divergence == "history_changed"
    assert plan.kept_ids == 6 and plan.text == "<s>user\nstop<e>\n<s>model\n"
    assert plan.base is not None and plan.base.parent is None
    assert [seg.ids.tolist() for seg in plan.base.prompt] == [[7, 1, 8], [7, 2, 8]]


# ------------------------------------------------------------------ after a divergence

MARK = "<s>"  # the turn marker of these examples (a special token: cuts are safe before it)


def _loop() -> TokenTurn:
    """A tool loop: a call with reasoning, the tool's answer, an answer with reasoning."""
    first = TokenTurn(
        None,
        FP,
        split_at_turns("<s>user\nq<e>\n<s>model\n", [7, 1, 8, 7, 2], ("<s>", 7)),
        Segment.of("<think>r1</think><call>", [30, 31]),
    )
    return TokenTurn(
        first,
        FP,
        split_at_turns("<e>\n<s>user\n<resp>42<e>\n<s>model\n", [8, 7, 3, 8, 7, 2], ("<s>", 7)),
        Segment.of("<think>r2</think>fine", [32, 33]),
    )


def test_only_the_rewritten_turns_are_tokenised_again_and_the_ids_between_are_kept() -> None:
    parent = _loop()
    # the user spoke again: both model turns lose their reasoning (Qwen3's template)
    rendered = (
        "<s>user\nq<e>\n<s>model\n<call><e>\n<s>user\n<resp>42<e>\n<s>model\nfine<e>\n"
        "<s>user\nwhy<e>\n<s>model\n"
    )
    plan = continue_from(parent, rendered, FP, "<e>\n", MARK)
    assert plan.divergences == ("generation_rerendered", "generation_rerendered")
    assert [g.text for g in plan.gaps] == [
        "<call><e>\n",
        "fine<e>\n<s>user\nwhy<e>\n<s>model\n",
    ]
    # the first prompt (before), the tool's answer and the model's turn (between) are kept
    assert plan.kept_ids == 5 + 3 + 2
    assert prompt_json(plan, b"90,8", b"91,8,7,92,8,7,2") == (
        b"[7,1,8,7,2,90,8,7,3,8,7,2,91,8,7,92,8,7,2]"
    )


def test_a_history_that_lost_turns_keeps_those_after_them() -> None:
    parent = _loop()
    # truncation dropped the first exchange: the tool's answer is where the history starts
    rendered = "<s>user\n<resp>42<e>\n<s>model\n<think>r2</think>fine<e>\n<s>user\nx"
    plan = continue_from(parent, rendered, FP, "<e>\n", MARK)
    assert plan.divergences == ("history_changed",)
    # the start of a prompt is tokenised (it gets the model's BOS): the first piece found
    # again is, and the model's turn and generation after it are kept
    assert plan.gaps[0].text == "<s>user\n<resp>42<e>\n" and plan.base is None
    assert plan.kept_ids == 2 + 2
    assert plan.gaps[-1].text == "<e>\n<s>user\nx" and plan.gaps[-1].reason is None


def test_a_generation_kept_before_a_gap_is_followed_by_the_end_of_its_turn() -> None:
    # the model ended on its end-of-turn id (8): a gap right after its generation begins with
    # the end of the turn, whose id is then not sent twice
    marker = ("<s>", 7)
    first = TokenTurn(
        None,
        FP,
        split_at_turns("<s>user\nq<e>\n<s>model\n", [7, 1, 8, 7, 2], marker),
        Segment.of("ok", [30, 8]),
        eos=True,
    )
    # its end-of-turn id was not sent again: the next prompt's ids start after it
    again = "<e>\n<s>user\nmore<e>\n<s>model\n"
    second = TokenTurn(
        first, FP, split_at_turns(again, [9, 7, 4, 8, 7, 2], marker), Segment.of("sure", [31])
    )
    rendered = "<s>user\nq<e>\n<s>model\nok<e>\n\n<s>user\nmore<e>\n<s>model\nsure<e>\n"
    plan = continue_from(second, rendered, FP, "<e>\n", MARK)
    assert plan.divergences == ("history_changed",)
    assert plan.gaps[0].text == "<e>\n\n" and plan.gaps[0].repeated == 8
    assert new_ids(plan.gaps[0], [8, 9, 9]) == [9, 9]
    # a generation that matched only as the start of longer text is not kept before a gap
    rendered = "<s>user\nq<e>\n<s>model\nokay<e>\n<s>user\nmore<e>\n<s>model\nsure<e>\n"
    plan = continue_from(second, rendered, FP, "<e>\n", MARK)
    assert plan.divergences == ("generation_rerendered",)
    assert plan.gaps[0].text == "okay<e>\n" and plan.gaps[0].repeated is None
    assert plan.kept_ids == 5 + 5 + 1  # the first prompt; the second prompt's turn and "sure"


def test_a_new_turn_after_a_divergence_keeps_the_chain_alternating() -> None:
    # the parts after a divergence go back into turns: each reused generation ends one
    parent = _loop()
    rendered = "<s>user\nq<e>\n<s>model\n<call><e>\n<s>user\n<resp>42<e>\n<s>model\n"
    rendered += "<think>r2</think>fine<e>\n<s>user\nwhy<e>\n<s>model\n"
    plan = continue_from(parent, rendered, FP, "<e>\n", MARK)
    assert plan.divergences == ("generation_rerendered",)
    kinds = [type(p).__name__ for p in plan.parts]
    assert kinds == ["Gap", "Segment", "Segment", "Reused", "Gap"]
    assert plan.repeated is None and plan.gaps[-1].text == "<e>\n<s>user\nwhy<e>\n<s>model\n"


def test_without_a_turn_marker_everything_after_a_divergence_is_tokenised_again() -> None:
    parent = _loop()
    rendered = "<s>user\nq<e>\n<s>model\n<call><e>\n<s>user\n<resp>42<e>\n<s>model\nfine"
    plan = continue_from(parent, rendered, FP, "<e>\n")
    assert len(plan.gaps) == 1 and plan.kept_ids == 5
    assert plan.text == rendered[len("<s>user\nq<e>\n<s>model\n") :]

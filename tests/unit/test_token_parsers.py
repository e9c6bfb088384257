"""The model output parsers of the token path (proxy/core/tokens/parsers.py): raw generated
text -> text, reasoning and tool call pieces, tested whole, at every split, one character at
a time and randomly chunked, and on the text a real base model wrote (../shared/upstreams)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from wsmode.core.tokens.formats import TOOL_FORMATS, parser_for
from wsmode.core.tokens.parsers import (
    MAX_CALL_CHARS,
    BrokenCall,
    CallArgs,
    CallPiece,
    CallStart,
    HermesParser,
    NoToolsParser,
    Piece,
    ReasoningEnd,
    ReasoningPiece,
    TextPiece,
)

from tests.support.chat_streams import TRANSCRIPTS, chunks_of
from tests.support.parser_pieces import Make, fed, joined

WEATHER = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
# Qwen3-style: reasoning, a message, two calls (the second's arguments a JSON string), junk
SAMPLE = (
    "<think>\nThe user wants the weather.\n</think>\n\n"
    "Let me check. 1 < 2 </b> <thinking>\n"
    f"<tool_call>\n{WEATHER}\n</tool_call>\n"
    '<tool_call>\n{"name": "get_time", "arguments": "{\\"tz\\": \\"CET\\"}"}\n</tool_call>\n'
    "<tool_response>\nsunny\n</tool_response>"
)
SAMPLE_PIECES: list[Piece] = [
    ReasoningPiece("The user wants the weather.\n"),
    TextPiece("Let me check. 1 < 2 </b> <thinking>\n"),
    CallPiece("get_weather", '{"city": "Paris"}'),  # streamed: as written
    CallPiece("get_time", '{"tz":"CET"}'),  # a string holding the object: written again
]
SAMPLES: list[tuple[str, Make]] = [
    (SAMPLE, HermesParser),
    ("The answer</think>\n\n is <tool_call>42", HermesParser),
    (
        "thinking <tool_call>{}</tool_call></think>\nSo: <tool_call>\n{",
        lambda: HermesParser(starts_in_think=True),
    ),
    (
        '<tool_call>{"name": "f", "arguments": {"a": "' + "x" * 20 + '"}}</tool_call> a',
        lambda: HermesParser(max_call_chars=16),
    ),
    (SAMPLE, NoToolsParser),
    (SAMPLE, lambda: HermesParser(think=False)),
]


def whole(text: str, make: Make = HermesParser) -> list[Piece]:
    return fed(make, [text])[0]


# ------------------------------------------------------------------ any cut, the same pieces


def test_the_sample_parses_into_reasoning_text_and_two_calls() -> None:
    assert fed(HermesParser, [SAMPLE]) == (SAMPLE_PIECES, True)


@pytest.mark.parametrize(("text", "make"), SAMPLES)
def test_every_two_way_split_gives_the_one_shot_pieces(text: str, make: Make) -> None:
    expected = fed(make, [text])
    for cut in range(len(text) + 1):
        assert fed(make, [text[:cut], text[cut:]]) == expected, cut


@pytest.mark.parametrize(("text", "make"), SAMPLES)
def test_one_character_fragments_give_the_one_shot_pieces(text: str, make: Make) -> None:
    assert fed(make, list(text)) == fed(make, [text])


@given(st.lists(st.integers(0, len(SAMPLE)), max_size=12), st.sampled_from(range(len(SAMPLES))))
def test_random_chunks_give_the_one_shot_pieces(cuts: list[int], which: int) -> None:
    text, make = SAMPLES[which]
    bounds = [0, *sorted(c for c in cuts if c <= len(text)), len(text)]
    fragments = [text[a:b] for a, b in itertools.pairwise(bounds)]
    assert fed(make, fragments) == fed(make, [text])


def test_text_is_emitted_at_once_but_for_what_may_begin_a_tag() -> None:
    parser = HermesParser()
    assert parser.feed("Hello wor") == [TextPiece("Hello wor")]
    assert parser.feed("ld <") == [TextPiece("ld ")]
    assert parser.feed("b") == [TextPiece("<b")]
    assert parser.feed(" <tool_") == [TextPiece(" ")]
    assert parser.feed("x") == [TextPiece("<tool_x")]
    assert parser.feed(" </thi") == [TextPiece(" ")]
    assert parser.feed("s") == [TextPiece("</this")]
    assert parser.feed(" <think") == [TextPiece(" ")]
    assert parser.feed("ing>") == [TextPiece("<thinking>")]
    assert parser.feed(" <") == [TextPiece(" ")]
    assert parser.end() == [TextPiece("<")]


def test_each_character_of_plain_text_is_emitted_when_fed() -> None:
    parser = HermesParser()
    assert [parser.feed(c) for c in "Hi there"] == [[TextPiece(c)] for c in "Hi there"]
    assert parser.end() == []


def test_reasoning_streams_likewise() -> None:
    parser = HermesParser()
    assert parser.feed("<thi") == []
    assert parser.feed("nk>\nLet me") == [ReasoningPiece("Let me")]
    assert parser.feed(" see</") == [ReasoningPiece(" see")]
    assert parser.feed("think>\n\nDone") == [ReasoningEnd(), TextPiece("Done")]


# ------------------------------------------------------------------ think blocks


def test_a_think_block_is_reasoning_and_the_whitespace_after_it_is_dropped() -> None:
    assert whole("<think>\nhmm, 2+2\n</think>\n\n4") == [
        ReasoningPiece("hmm, 2+2\n"),
        TextPiece("4"),
    ]


def test_an_empty_think_block_gives_nothing() -> None:
    # Qwen3 with thinking off writes an empty block
    assert whole("<think>\n\n</think>\n\nHi.") == [TextPiece("Hi.")]


def test_text_before_a_think_block_is_kept() -> None:
    assert whole("Hi <think>x</think> there") == [
        TextPiece("Hi "),
        ReasoningPiece("x"),
        TextPiece("there"),
    ]


def test_tool_call_tags_inside_a_think_block_are_reasoning() -> None:
    text = f"<think>I could write <tool_call>{WEATHER}</tool_call></think>No."
    assert whole(text) == [
        ReasoningPiece(f"I could write <tool_call>{WEATHER}</tool_call>"),
        TextPiece("No."),
    ]


def test_starts_in_think_reads_reasoning_until_the_close() -> None:
    parser = HermesParser(starts_in_think=True)
    assert parser.feed("\nOkay, the user") == [ReasoningPiece("Okay, the user")]
    assert parser.feed(" asks.</think>\n\nHello") == [
        ReasoningPiece(" asks."),
        ReasoningEnd(),
        TextPiece("Hello"),
    ]
    assert parser.end() == []


def test_without_starts_in_think_a_stray_close_is_dropped_from_the_text() -> None:
    assert whole("Okay.</think>\n\nHello") == [TextPiece("Okay.\n\nHello")]


def test_an_unclosed_think_block_flushes_as_reasoning() -> None:
    assert whole("<think>still thinking </thi") == [ReasoningPiece("still thinking </thi")]


def test_think_false_leaves_think_tags_as_text() -> None:
    text = "<think>a</think>b"
    assert whole(text, lambda: HermesParser(think=False)) == [TextPiece(text)]
    assert whole(text, lambda: NoToolsParser(think=False)) == [TextPiece(text)]


def test_starts_in_think_needs_think() -> None:
    with pytest.raises(ValueError, match="think"):
        HermesParser(think=False, starts_in_think=True)
    with pytest.raises(ValueError, match="think"):
        NoToolsParser(think=False, starts_in_think=True)


# ------------------------------------------------------------------ tool calls


def call(body: str) -> str:
    return f"<tool_call>\n{body}\n</tool_call>"


def test_one_call_is_one_piece_with_its_arguments_as_written() -> None:
    body = '{"name": "f", "arguments": {"a": [1, 2.5, null], "b": {"c": "é\\n"}}}'
    assert whole(call(body)) == [CallPiece("f", '{"a": [1, 2.5, null], "b": {"c": "é\\n"}}')]


def test_a_call_written_otherwise_than_name_first_is_read_whole_and_compact() -> None:
    body = '{"arguments": {"a": 1}, "name": "f"}'
    parser = HermesParser()
    assert parser.feed(call(body)) == [CallPiece("f", '{"a":1}')]  # no CallStart before it


def test_a_calls_arguments_stream_and_it_is_whole_only_when_it_closes() -> None:
    parser = HermesParser()
    assert parser.feed('<tool_call>\n{"name": "get_') == []  # the name is not whole yet
    assert parser.feed('weather", "arguments": {"ci') == [
        CallStart("get_weather"),
        CallArgs('{"ci'),
    ]
    assert parser.feed('ty": "Pa{r}is"}') == [CallArgs('ty": "Pa{r}is"}')]
    assert parser.feed("}\n</tool_") == []  # the object closing the call is not arguments
    assert parser.feed("call>") == [CallPiece("get_weather", '{"city": "Pa{r}is"}', True)]


def test_a_streamed_call_that_does_not_parse_is_broken_not_completed() -> None:
    parser = HermesParser()
    assert parser.feed('<tool_call>{"name": "f", "arguments": {"a": tru') == [
        CallStart("f"),
        CallArgs('{"a": tru'),
    ]
    raw = '{"name": "f", "arguments": {"a": tru}}'
    assert parser.feed("}}</tool_call>") == [CallArgs("}"), BrokenCall(raw, "invalid_json")]


def test_text_before_a_call_is_the_message() -> None:
    assert whole(f"I will look.\n{call(WEATHER)}") == [
        TextPiece("I will look.\n"),
        CallPiece("get_weather", '{"city": "Paris"}'),
    ]


def test_two_calls_and_the_whitespace_around_them() -> None:
    text = f"\n\n {call(WEATHER)}\n\n{call(WEATHER.replace('Paris', 'Rome'))}\n"
    assert fed(HermesParser, [text]) == (
        [
            CallPiece("get_weather", '{"city": "Paris"}'),
            CallPiece("get_weather", '{"city": "Rome"}'),
        ],
        False,
    )


def test_text_after_a_call_is_dropped_and_said_but_later_calls_count() -> None:
    parser = HermesParser()
    assert joined(parser.feed(call(WEATHER) + "\n")) == [
        CallPiece("get_weather", '{"city": "Paris"}')
    ]
    assert not parser.after_calls_text  # whitespace only so far
    assert parser.feed("<tool_response>\n{}\n</tool_response> Sunny. <think>x</think>") == []
    assert parser.after_calls_text
    assert joined(parser.feed(call('{"name": "g", "arguments": {}}'))) == [CallPiece("g", "{}")]
    assert parser.feed(" more") == []
    assert parser.end() == []
    assert parser.after_calls_text


def test_a_tag_fragment_left_after_a_call_counts_as_text_at_the_end() -> None:
    parser = HermesParser()
    parser.feed(call(WEATHER) + "\n<tool")
    assert not parser.after_calls_text
    assert parser.end() == []
    assert parser.after_calls_text


def test_arguments_as_a_json_string_holding_an_object() -> None:
    body = '{"name": "f", "arguments": "{\\"a\\": 1}"}'
    assert whole(call(body)) == [CallPiece("f", '{"a":1}')]


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ('{"name": "f", "arguments": {"a": 1}', "invalid_json"),  # a brace short
        ('{"name": "f", "arguments": {}} trailing', "invalid_json"),
        ("get_weather(city='Paris')", "invalid_json"),
        ("", "invalid_json"),
        ('[{"name": "f", "arguments": {}}]', "invalid_json"),  # a list is not one call
        ('"f"', "invalid_json"),
        ('{"arguments": {}}', "no_name"),
        ('{"name": 7, "arguments": {}}', "no_name"),
        ('{"name": "", "arguments": {}}', "no_name"),
        ('{"name": "f"}', "bad_arguments"),
        ('{"name": "f", "arguments": null}', "bad_arguments"),
        ('{"name": "f", "arguments": [1]}', "bad_arguments"),
        ('{"name": "f", "arguments": "city=Paris"}', "bad_arguments"),
        ('{"name": "f", "arguments": "[1]"}', "bad_arguments"),
        ('{"name": "f", "arguments": ' + "[" * 300 + "]" * 300 + "}", "bad_arguments"),
        ('{"name": "f", "arguments": {"a": ' + "[" * 300 + "]" * 300 + "}}", "too_deep"),
        ('{"name": "f", "arguments": {"a": 1e999}}', "invalid_json"),
    ],
)
def test_a_call_that_is_not_one_is_broken(body: str, reason: str) -> None:
    assert whole(call(body)) == [BrokenCall(f"\n{body}\n", reason)]


def test_a_broken_call_ends_the_message_like_a_call() -> None:
    parser = HermesParser()
    assert parser.feed("Sure.<tool_call>{nope}</tool_call>Sorry, again: ") == [
        TextPiece("Sure."),
        BrokenCall("{nope}", "invalid_json"),
    ]
    assert parser.after_calls_text
    assert joined(parser.feed(call(WEATHER))) == [CallPiece("get_weather", '{"city": "Paris"}')]


def test_an_unterminated_call_is_broken_at_the_end() -> None:
    parser = HermesParser()
    assert parser.feed(f"Hm.<tool_call>\n{WEATHER}\n</tool") == [
        TextPiece("Hm."),
        CallStart("get_weather"),
        CallArgs('{"city": "Paris"}'),
    ]
    assert parser.end() == [BrokenCall(f"\n{WEATHER}\n</tool", "unterminated")]


def test_a_call_at_the_bound_is_read_and_past_it_is_too_long() -> None:
    body = '{"name":"f","arguments":{}}'
    assert whole(call(body), lambda: HermesParser(max_call_chars=len(body) + 2)) == [
        CallPiece("f", "{}")
    ]
    parser = HermesParser(max_call_chars=len(body) + 1)
    text = call(body)
    assert parser.feed(text[:-1]) == [BrokenCall(f"\n{body}", "too_long")]
    assert parser.feed(text[-1] + " junk") == []  # the rest of the block, then junk
    assert parser.after_calls_text
    assert parser.end() == []


def test_too_long_is_said_when_the_bound_is_passed_and_the_rest_is_ignored() -> None:
    parser = HermesParser(max_call_chars=40)
    assert parser.feed("<tool_call>" + "1" * 40) == []
    assert parser.feed("2" + "</tool_call>" * 3) == [BrokenCall("1" * 40, "too_long")]
    assert joined(parser.feed(call('{"name": "g", "arguments": {}}'))) == [CallPiece("g", "{}")]
    big = HermesParser(max_call_chars=8)
    assert big.feed("<tool_call>" + "x" * 100) == [BrokenCall("x" * 8, "too_long")]
    assert big.end() == []  # reported once, not again as unterminated


def test_the_default_bound_is_one_mebi_characters() -> None:
    assert MAX_CALL_CHARS == 1 << 20
    args = "x" * (MAX_CALL_CHARS - 100)
    body = '{"name": "w", "arguments": {"s": "' + args + '"}}'
    assert whole(call(body)) == [CallPiece("w", '{"s": "' + args + '"}')]
    raw = f"\n{body}" + " " * 100
    assert whole(call(body + " " * 100)) == [BrokenCall(raw[:MAX_CALL_CHARS], "too_long")]


# ------------------------------------------------------------------ whitespace


@pytest.mark.parametrize("make", [HermesParser, NoToolsParser])
def test_whitespace_only_output_gives_nothing(make: Make) -> None:
    assert whole(" \n\t\n ", make) == []
    assert whole("", make) == []


def test_the_end_of_a_think_block_is_said_when_it_comes() -> None:
    parser = HermesParser()
    assert parser.feed("<think>plan") == [ReasoningPiece("plan")]
    assert parser.feed("</think>") == [ReasoningEnd()]  # the reasoning item can close now
    assert parser.feed("Answer") == [TextPiece("Answer")]


def test_the_text_is_the_models_exactly_leading_whitespace_included() -> None:
    # the history renders the message as it is, so it must be what the model wrote
    assert whole("\n\n  Hello,\n\n  world.\n") == [TextPiece("\n\n  Hello,\n\n  world.\n")]
    assert whole(" Hi") == [TextPiece(" Hi")]
    pieces, _ = fed(HermesParser, list(" \n Hi"))
    assert joined(pieces) == [TextPiece(" \n Hi")]


def test_whitespace_before_a_call_is_no_message() -> None:
    assert whole('\n <tool_call>{"name": "f", "arguments": {}}</tool_call>') == [
        CallPiece("f", "{}")
    ]


# ------------------------------------------------------------------ no tools


def test_no_tools_parser_passes_call_tags_as_text() -> None:
    parser = NoToolsParser()
    text = f"Look: {call(WEATHER)} done"
    assert parser.feed("<think>a</think>" + text) == [
        ReasoningPiece("a"),
        ReasoningEnd(),
        TextPiece(text),
    ]
    assert parser.end() == []
    assert not parser.after_calls_text


def test_no_tools_parser_starts_in_think() -> None:
    assert whole("a</think>b", lambda: NoToolsParser(starts_in_think=True)) == [
        ReasoningPiece("a"),
        TextPiece("b"),
    ]


# ------------------------------------------------------------------ one response each


@pytest.mark.parametrize("make", [HermesParser, NoToolsParser])
def test_a_parser_serves_one_response(make: Make) -> None:
    parser = make()
    parser.feed("x")
    parser.end()
    with pytest.raises(RuntimeError):
        parser.feed("y")
    with pytest.raises(RuntimeError):
        parser.end()


# ------------------------------------------------------------------ choosing a parser

HERMES_TEMPLATE = "{%- for m in messages %}...<tool_call>\n{{ tc | tojson }}\n</tool_call>"


def test_parser_for_choices() -> None:
    assert TOOL_FORMATS == ("auto", "hermes", "mistral", "llama3", "harmony", "none")
    assert isinstance(parser_for("auto", HERMES_TEMPLATE), HermesParser)
    assert isinstance(parser_for("auto", "{{ messages[0].content }}"), NoToolsParser)
    assert isinstance(parser_for("hermes", ""), HermesParser)
    assert isinstance(parser_for("none", HERMES_TEMPLATE), NoToolsParser)
    with pytest.raises(ValueError, match="encoding"):  # harmony reads ids with its vocabulary
        parser_for("harmony", "")


def test_parser_for_gives_a_new_parser_each_time() -> None:
    first = parser_for("hermes", "")
    first.feed("<think>")
    second = parser_for("hermes", "")
    assert second is not first
    assert second.feed("hi") == [TextPiece("hi")]


def test_parser_for_passes_starts_in_think() -> None:
    for tool_format in TOOL_FORMATS:
        if tool_format == "harmony":  # its channels say what is reasoning (test_token_harmony)
            continue
        parser = parser_for(tool_format, HERMES_TEMPLATE, starts_in_think=True)
        assert parser.feed("a</think>b") == [ReasoningPiece("a"), ReasoningEnd(), TextPiece("b")]


@pytest.mark.parametrize("bad", ["Hermes", "", "Harmony"])
def test_parser_for_names_the_choices_of_an_unknown_format(bad: str) -> None:
    with pytest.raises(ValueError, match="auto, hermes, mistral, llama3, harmony, none"):
        parser_for(bad, HERMES_TEMPLATE)


# ------------------------------------------------------------------ a real base model's text

LLAMA = TRANSCRIPTS / "llamacpp-xllamacpp"


def _chunks(name: str) -> list[dict[str, Any]]:
    path = LLAMA / name
    if not path.exists():
        pytest.skip(f"{path} is not available (../shared missing)")
    return chunks_of(path.read_bytes())


def _captured(name: str) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """A Chat stream's content deltas, and each tool call's name and argument deltas."""
    content: list[str] = []
    calls: list[tuple[str, list[str]]] = []
    for chunk in _chunks(name):
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content"):
                content.append(delta["content"])
            for tc in delta.get("tool_calls") or []:
                function = tc.get("function") or {}
                if tc["index"] == len(calls):
                    calls.append((function["name"], []))
                calls[tc["index"]][1].append(function.get("arguments") or "")
    return content, calls


def _raw_output(name: str, *, closed: bool = True) -> tuple[list[str], list[CallPiece]]:
    """The raw text Gemma 3 270M (base) wrote, in token-sized fragments, and its calls.

    llama.cpp parsed the model's calls before sending them, so the captures hold the text and
    the argument deltas as generated, but not the tags: they are put back as
    turns-with-tools.jinja writes a call (which the model copies from its examples), cut as
    Gemma's tokenizer cut the `<tool_response>` tags this model wrote in
    chat_tool_result_stream.txt. Those hallucinated tool results follow the last call.
    """
    content, calls = _captured(name)
    junk, _ = _captured("chat_tool_result_stream.txt")
    fragments = list(content)
    for i, (fname, args) in enumerate(calls):
        fragments += ["\n"] if i else []
        fragments += ["<tool_call", ">", "\n", '{"', "name", '":', ' "', fname, '",', ' "']
        fragments += ["arguments", '":', " ", *args, "}", "\n"]
        if closed or i < len(calls) - 1:
            fragments += ["</", "tool", "_", "call", ">"]
    if closed:
        fragments += ["\n", *junk]
    expected = [CallPiece(fname, "".join(args)) for fname, args in calls]  # as written
    return fragments, expected


def test_text_then_two_calls_then_hallucinated_results_from_a_base_model() -> None:
    fragments, calls = _raw_output("chat_tool_required_temp08_content_then_2calls.txt")
    assert len(calls) == 2
    pieces, after = fed(HermesParser, fragments)
    # the same message text llama.cpp's own parser found, and the same calls
    assert pieces == [TextPiece("To answer this, use the following block:\n"), *calls]
    assert calls[0] == CallPiece("get_weather", '{"city": "Paris"}')
    assert after  # the model kept talking after its calls
    assert fed(HermesParser, list("".join(fragments))) == (pieces, after)


def test_a_call_stopped_at_its_close_tag_needs_the_stop_text_fed_back() -> None:
    fragments, calls = _raw_output("chat_tool_fewshot_stop_stream.txt", closed=False)
    assert fed(HermesParser, [*fragments, "</tool_call>"]) == (calls, False)
    pieces, _ = fed(HermesParser, fragments)
    assert [type(p) for p in pieces] == [BrokenCall]
    assert isinstance(pieces[0], BrokenCall)
    assert pieces[0].reason == "unterminated"

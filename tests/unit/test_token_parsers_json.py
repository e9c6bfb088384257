"""The token path's JSON-ended tool call formats (proxy/core/tokens/parsers_json.py): Mistral's
`[TOOL_CALLS]` (a JSON list, or a name and `[ARGS]` object per call) and Llama 3's bare JSON
object, tested whole, at every split, one character at a time and randomly chunked."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st
from wsmode.core.tokens.formats import TOOL_FORMATS, detect_format, parser_for
from wsmode.core.tokens.parsers import (
    BrokenCall,
    CallPiece,
    HermesParser,
    NoToolsParser,
    OutputParser,
    Piece,
    ReasoningEnd,
    ReasoningPiece,
    TextPiece,
)
from wsmode.core.tokens.parsers_json import Llama3Parser, MistralParser

from tests.support.parser_pieces import Make, fed

PARIS = CallPiece("get_weather", '{"city":"Paris"}')
ROME = CallPiece("get_weather", '{"city":"Rome"}')

# v3 (Mistral 7B v0.3, Nemo): one list of calls, ids included as Nemo writes them
MISTRAL_LIST = (
    "Let me check [the weather].[TOOL_CALLS] ["
    '{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "a1b2c3d4e"}, '
    '{"name": "get_time", "arguments": {"tz": "CET", "note": "a ] } \\" ["}}]'
    "</s> and more"
)
MISTRAL_LIST_PIECES: list[Piece] = [
    TextPiece("Let me check [the weather]."),
    PARIS,
    CallPiece("get_time", '{"tz":"CET","note":"a ] } \\" ["}'),
]
# v11+ (Mistral Small 3.2, Magistral): reasoning, a message, a call per tag, one with its id
MISTRAL_V11 = (
    "[THINK]The user wants [weather].[/THINK]\n\nSure: {ok}"
    '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}'
    '[TOOL_CALLS]get_weather[CALL_ID]x9Y8z7W6v[ARGS]{"city": "Rome"}\n'
    '[TOOL_CALLS]get_time{"tz": "\\\\"}'
)
MISTRAL_V11_PIECES: list[Piece] = [
    ReasoningPiece("The user wants [weather]."),
    TextPiece("Sure: {ok}"),
    PARIS,
    ROME,
    CallPiece("get_time", '{"tz":"\\\\"}'),
]
LLAMA = (
    '<think>\nA call.\n</think>\n\n <|python_tag|>{"name": "get_weather", "parameters": '
    '{"city": "Paris"}}; {"type": "function", "name": "get_weather", "arguments": {"city": '
    '"Rome"}}\n{"name": "get_time", "parameters": {"s": "}{;"}}<|eom_id|> more'
)
LLAMA_PIECES: list[Piece] = [
    ReasoningPiece("A call.\n"),
    PARIS,
    ROME,
    CallPiece("get_time", '{"s":"}{;"}'),
]

SAMPLES: list[tuple[str, Make]] = [
    (MISTRAL_LIST, MistralParser),
    (MISTRAL_V11, MistralParser),
    ("[TOOL_CALLS][ARGS]{}[TOOL_CALLS]  [ [1], {} ]", MistralParser),
    (
        '[TOOL_CALLS]f[ARGS]{"a": "' + "x" * 20 + '"} after',
        lambda: MistralParser(max_call_chars=12),
    ),
    ("plan</think>[TOOL_CALLS]f[ARGS]nope", lambda: MistralParser(starts_in_think=True)),
    (LLAMA, Llama3Parser),
    ('\n {"answer": [1, {"x": "}"}]} is JSON <|python_tag|>{"name": "f"', Llama3Parser),
    (
        '{"name": "f", "parameters": {"a": "' + "y" * 30 + '"}}; x',
        lambda: Llama3Parser(max_call_chars=9),
    ),
    ("Hi {not a call} <|python_tag|>brave_search.call(query='x')", Llama3Parser),
]


def mistral(text: str) -> list[Piece]:
    return fed(MistralParser, [text])[0]


def llama(text: str) -> list[Piece]:
    return fed(Llama3Parser, [text])[0]


# ------------------------------------------------------------------ any cut, the same pieces


def test_the_samples_parse_as_the_models_meant() -> None:
    assert fed(MistralParser, [MISTRAL_LIST]) == (MISTRAL_LIST_PIECES, True)
    assert fed(MistralParser, [MISTRAL_V11]) == (MISTRAL_V11_PIECES, False)
    assert fed(Llama3Parser, [LLAMA]) == (LLAMA_PIECES, True)


@pytest.mark.parametrize(("text", "make"), SAMPLES)
def test_every_two_way_split_gives_the_one_shot_pieces(text: str, make: Make) -> None:
    expected = fed(make, [text])
    for cut in range(len(text) + 1):
        assert fed(make, [text[:cut], text[cut:]]) == expected, cut


@pytest.mark.parametrize(("text", "make"), SAMPLES)
def test_one_character_fragments_give_the_one_shot_pieces(text: str, make: Make) -> None:
    assert fed(make, list(text)) == fed(make, [text])


@given(st.lists(st.integers(0, len(LLAMA)), max_size=12), st.sampled_from(range(len(SAMPLES))))
def test_random_chunks_give_the_one_shot_pieces(cuts: list[int], which: int) -> None:
    text, make = SAMPLES[which]
    bounds = [0, *sorted(c for c in cuts if c <= len(text)), len(text)]
    fragments = [text[a:b] for a, b in itertools.pairwise(bounds)]
    assert fed(make, fragments) == fed(make, [text])


def test_text_streams_and_a_call_is_emitted_when_its_json_closes() -> None:
    parser = MistralParser()
    assert parser.feed("Hello [") == [TextPiece("Hello ")]  # `[` may begin a tag
    assert parser.feed("x] [") == [TextPiece("[x] ")]
    assert parser.feed("TOOL") == []
    assert parser.feed("_CALLS]get_weather[AR") == []
    assert parser.feed('GS]{"city": "Paris"') == []
    assert parser.feed("}") == [PARIS]
    assert parser.end() == []
    parser = Llama3Parser()
    assert parser.feed(' {"name": "get_weather", "parameters": {"city"') == []
    assert parser.feed(': "Paris"}') == []
    assert parser.feed("}") == [PARIS]


# ------------------------------------------------------------------ Mistral


def test_mistral_text_alone_is_the_message_exactly() -> None:
    text = "\n Plain [text] with {braces}, [TOOL_CALL] and <tool_call>.\n"
    assert fed(MistralParser, [text]) == ([TextPiece(text)], False)
    assert mistral(" \n ") == []


def test_mistral_v3_list_with_and_without_the_space_and_ids() -> None:
    one = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    assert mistral(f"[TOOL_CALLS] [{one}]") == [PARIS]
    assert mistral(f"[TOOL_CALLS][{one}, {one}]") == [PARIS, PARIS]
    assert mistral(f'[TOOL_CALLS]\n[{one[:-1]}, "id": "abcdefghi"}}]') == [PARIS]


def test_mistral_arguments_as_a_string_holding_the_object() -> None:
    assert mistral('[TOOL_CALLS][{"name": "f", "arguments": "{\\"a\\": 1}"}]') == [
        CallPiece("f", '{"a":1}')
    ]


def test_mistral_v11_calls_with_ids_and_whitespace_between() -> None:
    text = (
        '\n[TOOL_CALLS]get_weather[CALL_ID]123456789[ARGS]  {"city": "Paris"}\n\n'
        '[TOOL_CALLS] get_weather [ARGS]{"city": "Rome"}'
    )
    assert fed(MistralParser, [text]) == ([PARIS, ROME], False)


def test_mistral_text_after_calls_is_dropped_and_said_but_later_calls_count() -> None:
    parser = MistralParser()
    assert parser.feed("[TOOL_CALLS]f[ARGS]{}\n") == [CallPiece("f", "{}")]
    assert not parser.after_calls_text
    assert parser.feed("[TOOL_RESULTS]sunny[/TOOL_RESULTS]") == []
    assert parser.after_calls_text
    assert parser.feed('[TOOL_CALLS]g[ARGS]{"b": 2}') == [CallPiece("g", '{"b":2}')]
    assert parser.end() == []


def test_mistral_a_tag_fragment_left_after_a_call_counts_as_text_at_the_end() -> None:
    parser = MistralParser()
    parser.feed("[TOOL_CALLS]f[ARGS]{}[TOOL")
    assert not parser.after_calls_text
    assert parser.end() == []
    assert parser.after_calls_text


@pytest.mark.parametrize(
    ("after", "reason"),
    [
        ('[{"name": "f", "arguments": {}}', "unterminated"),  # the list never closes
        ('[{"name": "f", "arguments": {a: 1}}]', "invalid_json"),
        ('[{"name": "f", "arguments": {}}, ]', "invalid_json"),
        ("[]", "invalid_json"),  # no call in it
        ('["f"]', "invalid_json"),
        ('[{"arguments": {}}]', "no_name"),
        ('[{"name": "", "arguments": {}}]', "no_name"),
        ('[{"name": "f"}]', "bad_arguments"),
        ('[{"name": "f", "arguments": [1]}]', "bad_arguments"),
        ('[{"name": "f", "arguments": {"a": 1e999}}]', "invalid_json"),
        ('[{"name": "f", "arguments": {"a": ' + "[" * 300 + "]" * 300 + "}}]", "too_deep"),
        ("f[ARGS]{a}", "invalid_json"),
        ('f[ARGS]{"a": 1', "unterminated"),
        ("f[ARGS]", "unterminated"),
        ("f[CALL_ID]abc", "unterminated"),
        ("get_weather", "unterminated"),
        ("", "unterminated"),
        ("[ARGS]{}", "no_name"),
        ("get weather[ARGS]{}", "no_name"),
        ('"f"[ARGS]{}', "no_name"),
        ("f[ARGS]nope", "bad_arguments"),
        ('f[ARGS]["a"]', "bad_arguments"),
    ],
)
def test_mistral_a_call_that_is_not_one_is_broken(after: str, reason: str) -> None:
    pieces = mistral("Hm.[TOOL_CALLS]" + after)
    assert pieces[0] == TextPiece("Hm.")
    assert isinstance(pieces[1], BrokenCall)
    assert pieces[1].reason == reason
    assert after.startswith(pieces[1].raw)  # the call's text as the model wrote it


def test_mistral_one_bad_call_in_a_list_breaks_the_list() -> None:
    raw = ' [{"name": "f", "arguments": {}}, {"arguments": {}}]'
    assert mistral("[TOOL_CALLS]" + raw) == [BrokenCall(raw, "no_name")]


def test_mistral_a_broken_call_ends_the_message_and_later_calls_count() -> None:
    parser = MistralParser()
    assert parser.feed("Sure.[TOOL_CALLS]f[ARGS]{nope} sorry ") == [
        TextPiece("Sure."),
        BrokenCall("f[ARGS]{nope}", "invalid_json"),
    ]
    assert parser.after_calls_text
    assert parser.feed("[TOOL_CALLS]f[ARGS]{}") == [CallPiece("f", "{}")]


def test_mistral_arguments_that_are_not_an_object_leave_the_rest_as_junk() -> None:
    assert fed(MistralParser, ["[TOOL_CALLS]f[ARGS] 42"]) == (
        [BrokenCall("f[ARGS] ", "bad_arguments")],
        True,
    )


def test_mistral_a_call_at_the_bound_is_read_and_past_it_is_too_long() -> None:
    after = 'f[ARGS]{"a": 1}'
    make_at = lambda: MistralParser(max_call_chars=len(after))  # noqa: E731
    assert fed(make_at, ["[TOOL_CALLS]" + after]) == ([CallPiece("f", '{"a":1}')], False)
    parser = MistralParser(max_call_chars=len(after) - 1)
    assert parser.feed("[TOOL_CALLS]" + after) == [BrokenCall(after[:-1], "too_long")]
    # the rest of that JSON is skipped, and what follows is read again
    parser = MistralParser(max_call_chars=9)  # enough for g[ARGS]{}
    assert parser.feed('[TOOL_CALLS]f[ARGS]{"s": "}]' + "x" * 50) == [
        BrokenCall('f[ARGS]{"', "too_long")
    ]
    assert parser.feed('"}[TOOL_CALLS]g[ARGS]{}') == [CallPiece("g", "{}")]
    assert parser.end() == []


def test_mistral_too_long_before_the_json_drops_the_rest() -> None:
    parser = MistralParser(max_call_chars=10)
    assert parser.feed("[TOOL_CALLS]" + "name" * 5) == [BrokenCall("name" * 2 + "na", "too_long")]
    assert parser.feed("[ARGS]{}[TOOL_CALLS]g[ARGS]{}") == []
    assert parser.end() == []  # reported once, not again as unterminated


def test_mistral_think_blocks_of_both_kinds() -> None:
    assert mistral("[THINK]a <think> b[/THINK]Hi <think>c [/THINK]</think> there") == [
        ReasoningPiece("a <think> b"),
        TextPiece("Hi "),
        ReasoningPiece("c [/THINK]"),
        TextPiece("there"),
    ]
    # call tags inside a think block are reasoning; a stray close is dropped
    assert mistral("[THINK]maybe [TOOL_CALLS]f[ARGS]{}[/THINK]No.[/THINK]") == [
        ReasoningPiece("maybe [TOOL_CALLS]f[ARGS]{}"),
        TextPiece("No."),
    ]


def test_mistral_starts_in_think_until_either_close() -> None:
    for close in ("[/THINK]", "</think>"):
        parser = MistralParser(starts_in_think=True)
        assert parser.feed(f"\nplan{close}\n\nok") == [
            ReasoningPiece("plan"),
            ReasoningEnd(),
            TextPiece("ok"),
        ]


# ------------------------------------------------------------------ Llama 3


def test_llama_text_alone_is_the_message_exactly() -> None:
    text = '\n\n  The call would be {"name": "f", "parameters": {}}; fine.\n'
    assert fed(Llama3Parser, [text]) == ([TextPiece(text)], False)
    assert llama("\t \n") == []


def test_llama_a_bare_call_with_parameters_or_arguments() -> None:
    assert llama(' \n{"name": "get_weather", "parameters": {"city": "Paris"}}') == [PARIS]
    assert llama('{"name": "get_weather", "arguments": {"city": "Paris"}}') == [PARIS]
    # parameters win when both are written
    both = '{"name": "f", "parameters": {"a": 1}, "arguments": {"b": 2}}'
    assert llama(both) == [CallPiece("f", '{"a":1}')]
    assert llama('{"name": "f", "parameters": "{\\"a\\": 1}"}') == [CallPiece("f", '{"a":1}')]


def test_llama_calls_separated_by_semicolons_or_whitespace() -> None:
    one = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
    two = one.replace("Paris", "Rome")
    for sep in (";", "; ", " ;\n", "\n", ";;", "; <|python_tag|>"):
        assert fed(Llama3Parser, [one + sep + two]) == ([PARIS, ROME], False), sep


def test_llama_text_before_the_python_tag_is_the_message() -> None:
    text = 'Let me look. <|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}'
    assert llama(text) == [TextPiece("Let me look. "), PARIS]


def test_llama_an_object_that_is_no_call_is_text_and_the_message_goes_on() -> None:
    text = ' {"answer": 42, "list": [1, "}"]}\n{"name": "f", "parameters": {}} more'
    assert fed(Llama3Parser, [text]) == ([TextPiece(text)], False)


def test_llama_text_after_calls_ends_them() -> None:
    parser = Llama3Parser()
    assert parser.feed('{"name": "f", "parameters": {}}\n') == [CallPiece("f", "{}")]
    assert not parser.after_calls_text
    assert parser.feed("The weather is") == []
    assert parser.after_calls_text
    assert parser.feed('; {"name": "g", "parameters": {}}') == []  # no call in prose
    assert parser.end() == []


def test_llama_a_tag_fragment_left_after_a_call_counts_as_text_at_the_end() -> None:
    parser = Llama3Parser()
    parser.feed('{"name": "f", "parameters": {}}; <|python')
    assert not parser.after_calls_text
    assert parser.end() == []
    assert parser.after_calls_text


@pytest.mark.parametrize(
    ("text", "raw", "reason"),
    [
        (
            '{"name": "f", "parameters": {"a": 1}',
            '{"name": "f", "parameters": {"a": 1}',
            "unterminated",
        ),
        (
            '{"name": "f", "parameters": {a: 1}}',
            '{"name": "f", "parameters": {a: 1}}',
            "invalid_json",
        ),
        ("{not json} then text", "{not json}", "invalid_json"),
        ('{"parameters": {"a": 1}}', '{"parameters": {"a": 1}}', "no_name"),
        ('{"name": 3, "parameters": {}}', '{"name": 3, "parameters": {}}', "no_name"),
        ('{"name": "f"}', '{"name": "f"}', "bad_arguments"),
        ('{"name": "f", "parameters": [1]}', '{"name": "f", "parameters": [1]}', "bad_arguments"),
        (
            '{"name": "f", "parameters": {"a": 1e999}}',
            '{"name": "f", "parameters": {"a": 1e999}}',
            "invalid_json",
        ),
        ("<|python_tag|>", "", "unterminated"),
        ('<|python_tag|> {"name": "f"', ' {"name": "f"', "unterminated"),
        (
            "<|python_tag|>brave_search.call(query='x')",
            "brave_search.call(query='x')",
            "invalid_json",
        ),
        ("<|python_tag|>[1]", "[1]", "invalid_json"),
        ('<|python_tag|>{"answer": 1}', '{"answer": 1}', "no_name"),  # after the tag, a call
    ],
)
def test_llama_a_call_that_is_not_one_is_broken(text: str, raw: str, reason: str) -> None:
    assert llama(text) == [BrokenCall(raw, reason)]


def test_llama_a_call_at_the_bound_is_read_and_past_it_is_too_long() -> None:
    body = '{"name": "f", "parameters": {}}'
    assert fed(lambda: Llama3Parser(max_call_chars=len(body)), [body]) == (
        [CallPiece("f", "{}")],
        False,
    )
    parser = Llama3Parser(max_call_chars=len(body) - 1)
    # the rest of that JSON is skipped, and the next call is read
    assert parser.feed(body + '; {"name":"g","parameters":{}}') == [
        BrokenCall(body[:-1], "too_long"),
        CallPiece("g", "{}"),
    ]
    tagged = Llama3Parser(max_call_chars=5)
    assert tagged.feed("<|python_tag|>" + "print(1)" * 10) == [BrokenCall("print", "too_long")]
    assert tagged.end() == []


def test_llama_think_then_a_call_and_starts_in_think() -> None:
    call = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
    assert llama(f"<think>\nhmm\n</think>\n\n{call}") == [ReasoningPiece("hmm\n"), PARIS]
    parser = Llama3Parser(starts_in_think=True)
    assert parser.feed(f"plan</think>\n{call}") == [ReasoningPiece("plan"), ReasoningEnd(), PARIS]
    # once the message has text, a `{` is text
    assert llama(f"<think>x</think>So {call}") == [ReasoningPiece("x"), TextPiece(f"So {call}")]


# ------------------------------------------------------------------ both


@pytest.mark.parametrize("make", [MistralParser, Llama3Parser])
def test_a_parser_serves_one_response(make: Make) -> None:
    parser = make()
    parser.feed("x")
    parser.end()
    with pytest.raises(RuntimeError):
        parser.feed("y")
    with pytest.raises(RuntimeError):
        parser.end()


@pytest.mark.parametrize("make", [MistralParser, Llama3Parser])
def test_the_bound_must_be_positive(make: Callable[..., OutputParser]) -> None:
    with pytest.raises(ValueError, match="max_call_chars"):
        make(max_call_chars=0)


# ------------------------------------------------------------------ choosing a parser

# small pieces of the real templates, each the part `auto` goes by
MISTRAL_V3_TEMPLATE = '{{- "[TOOL_CALLS] [" }}{%- for tc in message.tool_calls %}...'
MISTRAL_V11_TEMPLATE = "{{- '[TOOL_CALLS]' + tool.name + '[ARGS]' + arguments }}"
LLAMA31_TEMPLATE = (
    '{{- "Environment: ipython\\n" }}...{{- "<|python_tag|>" + tool_call.name }}'
    "{{- '\"parameters\": ' }}"
)
LLAMA32_TEMPLATE = (
    '{{- \'Respond in the format {"name": function name, "parameters": dictionary}.\' }}'
    '{{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}'
)
HERMES_TEMPLATE = "{%- for m in messages %}...<tool_call>\n{{ tc | tojson }}\n</tool_call>"


def test_tool_formats() -> None:
    assert TOOL_FORMATS == ("auto", "hermes", "mistral", "llama3", "harmony", "none")


@pytest.mark.parametrize(
    ("template", "tool_format", "kind"),
    [
        (MISTRAL_V3_TEMPLATE, "mistral", MistralParser),
        (MISTRAL_V11_TEMPLATE, "mistral", MistralParser),
        (LLAMA31_TEMPLATE, "llama3", Llama3Parser),
        (LLAMA32_TEMPLATE, "llama3", Llama3Parser),
        (HERMES_TEMPLATE, "hermes", HermesParser),
        ("{{ messages[0].content }}", "none", NoToolsParser),
        # "parameters" alone (a tool's schema) or ipython alone is not Llama's format
        ('{{ tool.parameters | tojson }} "parameters"', "none", NoToolsParser),
        ("ipython <tool_call>", "hermes", HermesParser),
        # the order: [TOOL_CALLS] before the python tag before <tool_call>
        ("<tool_call> <|python_tag|> [TOOL_CALLS]", "mistral", MistralParser),
        ("<tool_call> <|python_tag|>", "llama3", Llama3Parser),
    ],
)
def test_auto_reads_the_template(template: str, tool_format: str, kind: type) -> None:
    assert detect_format(template) == tool_format
    assert type(parser_for("auto", template)) is kind


def test_named_formats_ignore_the_template() -> None:
    assert isinstance(parser_for("mistral", HERMES_TEMPLATE), MistralParser)
    assert isinstance(parser_for("llama3", MISTRAL_V11_TEMPLATE), Llama3Parser)
    assert isinstance(parser_for("hermes", LLAMA31_TEMPLATE), HermesParser)
    assert isinstance(parser_for("none", MISTRAL_V11_TEMPLATE), NoToolsParser)


@pytest.mark.parametrize("tool_format", ["mistral", "llama3"])
def test_parser_for_gives_a_new_parser_each_time_and_passes_starts_in_think(
    tool_format: str,
) -> None:
    first = parser_for(tool_format, "")
    first.feed("<think>")
    second = parser_for(tool_format, "", starts_in_think=True)
    assert second is not first
    assert second.feed("a</think>b") == [ReasoningPiece("a"), ReasoningEnd(), TextPiece("b")]


@pytest.mark.parametrize("bad", ["Mistral", "llama", "gpt-oss", "llama3_json"])
def test_parser_for_names_the_choices_of_an_unknown_format(bad: str) -> None:
    with pytest.raises(ValueError, match="auto, hermes, mistral, llama3, harmony, none"):
        parser_for(bad, "")

"""The token dialect's stream (proxy/core/tokens/dialect.py): llama.cpp's `/completion`
events in, the canonical Responses sequence out, the generated ids kept exactly."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from wsmode.core.errors import UpstreamError
from wsmode.core.sse import SSEEvent
from wsmode.core.tokens.chain import fresh
from wsmode.core.tokens.dialect import TokenPrompt, TokenStream
from wsmode.core.tokens.engine import LlamaCppEngine, Sampling
from wsmode.core.tokens.parsers import HermesParser, OutputParser
from wsmode.core.tokens.parsers_json import MistralParser

from tests.support.event_checks import check_sequence

REQUEST = {"model": "m", "input": "hi", "store": False}


def _stream(
    parser: OutputParser | None = None, tags: dict[int, str] | None = None, vocab_size: int = 0
) -> TokenStream:
    counter = iter(range(1000))
    stream = TokenStream(
        REQUEST,
        {"previous_response_id": None, "store": False},
        engine=LlamaCppEngine(),
        parser=parser or HermesParser(),
        tags=tags,
        vocab_size=vocab_size,
        names={},
        model="gemma",
        clock=lambda: 1000.0,
        new_id=lambda prefix: f"{prefix}_{next(counter)}",
    )
    stream.prompt = TokenPrompt(LlamaCppEngine(), fresh("<prompt>"), Sampling())
    stream.fingerprint = "fp"
    return stream


def _token(text: str, ids: list[int], **extra: Any) -> SSEEvent:
    doc = {"index": 0, "content": text, "tokens": ids, "stop": False, **extra}
    return SSEEvent(None, orjson.dumps(doc))


def _final(stop_type: str, cache_n: int = 0, prompt_n: int = 5, predicted: int = 3) -> SSEEvent:
    doc = {
        "index": 0,
        "content": "",
        "tokens": [],
        "stop": True,
        "stop_type": stop_type,
        "tokens_predicted": predicted,
        "timings": {"cache_n": cache_n, "prompt_n": prompt_n},
    }
    return SSEEvent(None, orjson.dumps(doc))


def _run(stream: TokenStream, events: list[SSEEvent]) -> list[dict[str, Any]]:
    out: list[bytes] = []
    for ev in events:
        out += stream.feed(ev)
    out += stream.eof()
    return [orjson.loads(b) for b in out]


def test_text_streams_as_a_message_and_the_ids_are_kept() -> None:
    s = _stream()
    events = _run(s, [_token("Hel", [10]), _token("lo", [11]), _final("eos", 7, 4, 2)])
    summary = check_sequence(events)
    final = summary.terminal
    assert final["status"] == "completed"
    assert final["output"][0]["content"][0]["text"] == "Hello"
    assert final["usage"]["input_tokens"] == 11
    assert final["usage"]["input_tokens_details"]["cached_tokens"] == 7
    assert final["usage"]["output_tokens"] == 2
    assert final["model"] == "gemma"
    s.prompt_ids = [[1, 2, 3]]
    turn = s.turn()
    assert turn is not None and turn.eos
    assert turn.generated.text == "Hello" and turn.generated.ids.tolist() == [10, 11]
    assert turn.prompt[0].ids.tolist() == [1, 2, 3] and turn.prompt_length == 3


def test_a_hermes_tool_call_becomes_a_function_call_item() -> None:
    s = _stream()
    pieces = [
        "<tool",
        "_call>\n",
        '{"name": "get_weather", ',
        '"arguments": {"city": "Paris"}}',
        "\n</tool_call>",
    ]
    events = _run(s, [_token(p, [i]) for i, p in enumerate(pieces)] + [_final("eos")])
    final = check_sequence(events).terminal
    calls = [i for i in final["output"] if i["type"] == "function_call"]
    assert len(calls) == 1 and calls[0]["name"] == "get_weather"
    assert orjson.loads(calls[0]["arguments"]) == {"city": "Paris"}
    assert final["status"] == "completed"
    assert [e["type"] for e in events].count("response.function_call_arguments.done") == 1


def test_a_hermes_call_streams_its_arguments_and_is_done_only_once_it_parses() -> None:
    s = _stream()
    pieces = [
        "<tool_call>\n",
        '{"name": "get_weather", ',
        '"arguments": {"ci',
        'ty": "Pa',
        'ris"}}\n',
    ]
    fed = [orjson.loads(b) for i, p in enumerate(pieces[:-1]) for b in s.feed(_token(p, [i]))]
    kinds = [e["type"] for e in fed]
    assert "response.output_item.added" in kinds
    deltas = [e["delta"] for e in fed if e["type"] == "response.function_call_arguments.delta"]
    assert "".join(deltas) == '{"city": "Pa'  # as it arrives, before the call is whole
    assert "response.function_call_arguments.done" not in kinds


def test_broken_tool_call_json_ends_incomplete_never_a_completed_call() -> None:
    s = _stream()
    events = _run(
        s,
        [
            _token('<tool_call>{"name": "x", "arguments": {', [1]),
            _token("</tool_call>", [2]),
            _final("eos"),
        ],
    )
    final = check_sequence(events).terminal
    assert final["status"] == "incomplete"
    # no reason of the API's vocabulary fits a broken call: none is given
    assert final["incomplete_details"] is None
    # its arguments streamed, but it never completed: no `.done`, the item is incomplete
    kinds = [e["type"] for e in events]
    assert "response.function_call_arguments.done" not in kinds
    calls = [i for i in final["output"] if i["type"] == "function_call"]
    assert [(c["status"], c["arguments"]) for c in calls] == [("incomplete", "{")]
    # a call that is no call from its start is its text, as before
    s = _stream()
    events = _run(s, [_token("<tool_call>{nope}</tool_call>", [1]), _final("eos")])
    final = check_sequence(events).terminal
    assert final["status"] == "incomplete"
    assert final["output"][0]["content"][0]["text"] == "{nope}"
    assert not [i for i in final["output"] if i["type"] == "function_call"]


def test_a_call_cut_by_the_token_limit_ends_incomplete_for_the_limit() -> None:
    s = _stream()
    events = _run(s, [_token('<tool_call>{"name": "x"', [1]), _final("limit")])
    final = check_sequence(events).terminal
    assert final["status"] == "incomplete"
    assert final["incomplete_details"] == {"reason": "max_output_tokens"}
    s.prompt_ids = [[]]
    turn = s.turn()
    assert turn is not None and not turn.eos


def test_reasoning_becomes_a_reasoning_item() -> None:
    s = _stream()
    events = _run(s, [_token("<think>plan</think>", [1]), _token("Done.", [2]), _final("eos")])
    final = check_sequence(events).terminal
    assert [i["type"] for i in final["output"]] == ["reasoning", "message"]


def test_an_answer_without_token_ids_is_a_protocol_error() -> None:
    s = _stream()
    doc = {"index": 0, "content": "x", "stop": False}
    try:
        s.feed(SSEEvent(None, orjson.dumps(doc)))
    except Exception as exc:
        from wsmode.core.errors import UpstreamError

        assert isinstance(exc, UpstreamError)
        assert exc.status == 502 and exc.code == "upstream_protocol_error"
        assert "tokens" in exc.message
    else:
        raise AssertionError("an event without ids was accepted")


def test_a_body_that_ends_before_its_final_event_fails() -> None:
    s = _stream()
    s.feed(_token("a", [1]))
    from wsmode.core.errors import UpstreamError

    try:
        s.eof()
    except UpstreamError as exc:
        assert exc.started
    else:
        raise AssertionError("a cut stream was accepted")


def test_the_prompt_body_carries_the_kept_ids_then_the_new_ones() -> None:
    from wsmode.core.tokens.chain import Segment, TokenTurn
    from wsmode.core.tokens.walk import continue_from

    parent = TokenTurn(None, "fp", (Segment.of("<p>", [1, 2]),), Segment.of("ok", [3]))
    plan = continue_from(parent, "<p>ok<e>more", "fp")
    prompt = TokenPrompt(LlamaCppEngine(), plan, Sampling(max_tokens=5, slot=2))
    (tokenize,) = prompt.tokenize_bodies()
    assert tokenize is not None
    assert orjson.loads(tokenize) == {
        "content": "<e>more",
        "add_special": False,
        "parse_special": True,
    }
    body = orjson.loads(prompt.body(prompt.new_ids([orjson.dumps({"tokens": [4, 5]})])))
    assert body["prompt"] == [1, 2, 3, 4, 5]
    assert body["n_predict"] == 5 and body["id_slot"] == 2 and body["stream"] is True
    assert body["return_tokens"] is True and body["cache_prompt"] is True
    # a new conversation is tokenised with the model's BOS, as the chat endpoint does
    (first,) = TokenPrompt(LlamaCppEngine(), fresh("<p>"), Sampling()).tokenize_bodies()
    assert first is not None and orjson.loads(first)["add_special"] is True


def test_a_tag_the_server_streams_as_an_id_only_is_written_back_for_the_parser() -> None:
    # llama.cpp without --special streams a control token's id with empty content
    s = _stream(MistralParser(), tags={9: "[TOOL_CALLS]"})
    events = _run(
        s,
        [_token("", [9]), _token('[{"name": "f", "arguments": {"a": 1}}]', [10]), _final("eos")],
    )
    final = check_sequence(events).terminal
    calls = [i for i in final["output"] if i["type"] == "function_call"]
    assert [(c["name"], orjson.loads(c["arguments"])) for c in calls] == [("f", {"a": 1})]
    # the generated text the token cache keeps has the tag, as the history renders it
    assert "".join(s.text).startswith("[TOOL_CALLS]")
    # a tag the server did write is not written twice
    s = _stream(MistralParser(), tags={9: "[TOOL_CALLS]"})
    _run(
        s,
        [
            _token("[TOOL_CALLS]", [9]),
            _token('[{"name": "f", "arguments": {}}]', [10]),
            _final("eos"),
        ],
    )
    assert "".join(s.text).count("[TOOL_CALLS]") == 1


def test_ids_outside_the_servers_vocabulary_are_a_protocol_error_naming_the_id() -> None:
    """The vocabulary the server reports bounds the ids it tokenises and generates."""
    prompt = TokenPrompt(LlamaCppEngine(), fresh("<p>"), Sampling(), vocab_size=100)
    assert prompt.new_ids([b'{"tokens": [2, 99]}']) == [[2, 99]]
    for answer in (b'{"tokens": [2, 100]}', b'{"tokens": [-1]}'):
        with pytest.raises(UpstreamError) as caught:
            prompt.new_ids([answer])
        assert caught.value.status == 502 and caught.value.code == "upstream_protocol_error"
        assert "outside its vocabulary of 100 ids" in caught.value.message
    s = _stream(vocab_size=100)
    s.feed(_token("ok", [99]))
    with pytest.raises(UpstreamError) as caught:
        s.feed(_token("no", [100]))
    assert caught.value.code == "upstream_protocol_error" and "token id 100" in caught.value.message
    assert s.ids.tolist() == [99]  # the id past the vocabulary is not kept


def test_an_id_no_token_cache_can_hold_is_a_protocol_error_when_the_vocabulary_is_unknown() -> None:
    """A server that reports no vocabulary size still cannot send an id past a C int: the
    token cache could not keep it (it was an OverflowError in the cache, after the answer)."""
    prompt = TokenPrompt(LlamaCppEngine(), fresh("<p>"), Sampling())
    assert prompt.new_ids([b'{"tokens": [2, 2147483647]}']) == [[2, 2147483647]]
    with pytest.raises(UpstreamError) as caught:
        prompt.new_ids([b'{"tokens": [2, 2147483648]}'])
    assert caught.value.code == "upstream_protocol_error"
    assert "token id 2147483648, outside any vocabulary" in caught.value.message
    s = _stream()
    with pytest.raises(UpstreamError) as caught:
        s.feed(_token("no", [1 << 40]))
    assert caught.value.code == "upstream_protocol_error" and "outside any vocabulary" in (
        caught.value.message
    )
    assert s.ids.tolist() == []

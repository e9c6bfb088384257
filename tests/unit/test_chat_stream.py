"""Chat chunks -> Responses events, on real servers' streams and documented formats.

Golden inputs: llama.cpp's server and llama-cpp-python's (recorded, ../shared/upstreams/
transcripts) and hand-written vLLM, DeepSeek, Ollama and OpenAI-style streams
(tests/fixtures/chat_streams). Each is fed whole, one byte at a time and randomly chunked;
the events must be a spec-complete sequence whose deltas add up to what the upstream sent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from wsmode.core.errors import UpstreamError
from wsmode.core.sse import SSEEvent

from tests.support.chat_streams import FIXTURES, TRANSCRIPTS, run, translator, upstream_content
from tests.support.event_checks import check_sequence

# path, outcome, incomplete reason, [(name, call_id)], usage (in, cached, out, reasoning)
GOLDEN: list[tuple[str, str, str | None, list[tuple[str, str]], tuple[int, ...] | None]] = [
    (
        "llamacpp-xllamacpp/chat_plain_stream.txt",
        "incomplete",
        "max_output_tokens",
        [],
        (17, 1, 16, 0),
    ),
    (
        "llamacpp-xllamacpp/chat_plain_stream_nousage.txt",
        "incomplete",
        "max_output_tokens",
        [],
        None,
    ),
    (
        "llamacpp-xllamacpp/chat_tool_fewshot_stop_stream.txt",
        "completed",
        None,
        [("get_weather", "Ekt11sYgaiEJ3CZBe2J2t2wVZM7FsPYm")],
        (311, 306, 29, 0),
    ),
    (
        "llamacpp-xllamacpp/chat_tool_fewshot_stream.txt",
        "incomplete",
        "max_output_tokens",
        [
            ("get_weather", "HKPCEZOXDoQBJGoUAQvG5dB90EfntUZm"),
            ("get_weather", "iR9r7AXu55GApfa4RQIzkVJ0ipoJuv1o"),
        ],
        (311, 132, 60, 0),
    ),
    (
        "llamacpp-xllamacpp/chat_tool_required_temp08_content_then_2calls.txt",
        "incomplete",
        "max_output_tokens",
        [
            ("get_weather", "UE1asVlPLGIoAliP7VF3K0p4i9pmA215"),
            ("get_weather", "urIH71fmv7SIQe3TtoSgzPignlPigcrp"),
        ],
        (146, 0, 60, 0),
    ),
    ("llamacpp-xllamacpp/chat_tool_result_stream.txt", "incomplete", "max_output_tokens", [], None),
    ("llama-cpp-python/chat_plain_stream.txt", "incomplete", "max_output_tokens", [], None),
    (
        "llama-cpp-python/chat_tool_named_stream.txt",
        "completed",
        None,
        [("get_weather", "call__0_get_weather_cmpl-d6be8b0f-f829-4b2a-929c-0c41e147347a")],
        None,
    ),
    (
        "vllm_reasoning_tool.txt",
        "completed",
        None,
        [("get_weather", "chatcmpl-tool-8e2f4c1d")],
        (212, 0, 39, 0),
    ),
    ("vllm_reasoning_content_no_done.txt", "completed", None, [], (30, 16, 12, 6)),
    (
        "parallel_interleaved.txt",
        "completed",
        None,
        [("get_weather", "call_a1"), ("get_time", "call_b2")],
        (90, 64, 40, 0),
    ),
    (
        "ollama_thinking_tool.txt",
        "completed",
        None,
        [("get_weather", "call_k3v9xq2a")],
        (152, 0, 24, 0),
    ),
    ("ollama_text_nousage.txt", "completed", None, [], None),
    (
        "ollama_tools_noindex.txt",
        "completed",
        None,
        [("get_weather", "call_one"), ("get_weather", "call_two")],
        None,
    ),
    ("refusal_content_filter.txt", "incomplete", "content_filter", [], None),
]


def _path(name: str) -> Path:
    path = (TRANSCRIPTS / name) if "/" in name else (FIXTURES / name)
    if not path.exists():
        pytest.skip(f"{path} is not available (../shared missing)")
    return path


def _check_golden(events: list[dict[str, Any]], raw: bytes, case: tuple[Any, ...]) -> None:
    _, outcome, reason, calls, usage = case
    summary = check_sequence(events)
    final = summary.terminal
    assert events[-1]["type"] == f"response.{outcome}"
    assert final["status"] == outcome
    assert final["incomplete_details"] == ({"reason": reason} if reason else None)
    text, reasoning, args = upstream_content(raw)
    assert summary.text == text
    assert summary.reasoning == reasoning
    assert [(c["name"], c["call_id"]) for c in summary.calls] == calls
    assert [c["arguments"] for c in summary.calls] == [args[i] for i in range(len(calls))]
    if usage is None:
        assert final["usage"] is None
    else:
        u = final["usage"]
        got = (
            u["input_tokens"],
            u["input_tokens_details"]["cached_tokens"],
            u["output_tokens"],
            u["output_tokens_details"]["reasoning_tokens"],
        )
        assert got == usage
        assert u["total_tokens"] == usage[0] + usage[2]


@pytest.mark.parametrize("case", GOLDEN, ids=[c[0].split("/")[-1] for c in GOLDEN])
def test_golden_stream_whole_and_bytewise(case: tuple[Any, ...]) -> None:
    raw = _path(case[0]).read_bytes()
    whole = run(translator("chat"), [raw])
    _check_golden(whole, raw, case)
    bytewise = run(translator("chat"), [raw[i : i + 1] for i in range(len(raw))])
    assert bytewise == whole


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_golden_streams_randomly_chunked(data: st.DataObject) -> None:
    case = data.draw(st.sampled_from(GOLDEN))
    path = (TRANSCRIPTS / case[0]) if "/" in case[0] else (FIXTURES / case[0])
    if not path.exists():
        return
    raw = path.read_bytes()
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(raw) - 1)), max_size=40)))
    pieces = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]
    assert run(translator("chat"), pieces) == run(translator("chat"), [raw])


def test_reasoning_item_comes_first_and_closes_before_text() -> None:
    raw = _path("vllm_reasoning_tool.txt").read_bytes()
    events = run(translator("chat"), [raw])
    kinds = [e["type"] for e in events if e["type"].startswith("response.output_item")]
    items = [e["item"]["type"] for e in events if e["type"] == "response.output_item.added"]
    assert items == ["reasoning", "message", "function_call"]
    assert kinds == ["response.output_item.added", "response.output_item.done"] * 3
    deltas = [e for e in events if e["type"] == "response.reasoning_text.delta"]
    assert deltas[0]["content_index"] == 0 and deltas[0]["output_index"] == 0


def test_interleaved_parallel_calls_keep_their_own_arguments() -> None:
    events = run(translator("chat"), [_path("parallel_interleaved.txt").read_bytes()])
    deltas = [
        (e["output_index"], e["delta"])
        for e in events
        if e["type"] == "response.function_call_arguments.delta"
    ]
    assert deltas == [(1, '{"city":'), (2, '{"tz":'), (2, '"CET"}'), (1, '"Rome"}')]
    done = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    assert [(d["name"], d["arguments"]) for d in done] == [
        ("get_weather", '{"city":"Rome"}'),
        ("get_time", '{"tz":"CET"}'),
    ]
    # the text came first and was closed before the first call opened
    first_call = next(
        i for i, e in enumerate(events) if e.get("item", {}).get("type") == "function_call"
    )
    msg_done = next(i for i, e in enumerate(events) if e["type"] == "response.output_item.done")
    assert msg_done < first_call


def test_ids_are_minted_by_the_proxy_and_object_is_complete() -> None:
    raw = _path("ollama_thinking_tool.txt").read_bytes()
    request = {
        "model": "qwen3:4b",
        "instructions": "be brief",
        "temperature": 0.2,
        "previous_response_id": "resp_prev",
        "tools": [{"type": "function", "name": "f"}],
    }
    events = run(translator("chat", request), [raw])
    final = events[-1]["response"]
    assert final["id"].startswith("resp_") and final["id"] == events[0]["response"]["id"]
    assert [i["id"].split("_")[0] for i in final["output"]] == ["rs", "fc"]
    assert final["instructions"] == "be brief" and final["temperature"] == 0.2
    assert final["previous_response_id"] == "resp_prev" and final["store"] is False
    # the tool as the API reports it: the fields the request left out, with their defaults
    tool = {"type": "function", "name": "f", "description": None, "parameters": None}
    assert final["tools"] == [{**tool, "strict": True}]
    assert final["reasoning"] == {"effort": None, "summary": None}
    assert final["completed_at"] == 1_767_000_000


def test_namespaced_call_names_are_reversed() -> None:
    request = {
        "model": "m",
        "tools": [
            {
                "type": "namespace",
                "name": "crm",
                "description": "d",
                "tools": [{"type": "function", "name": "lookup"}],
            }
        ],
    }
    body = (
        b'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c1",'
        b'"type":"function","function":{"name":"crm__lookup","arguments":"{}"}}]}}]}\n\n'
        b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}\n\n'
        b"data: [DONE]\n\n"
    )
    summary = check_sequence(run(translator("chat", request), [body]))
    call = summary.calls[0]
    assert (call["name"], call["namespace"], call["call_id"]) == ("lookup", "crm", "c1")


def _chunk(delta: str, finish: str = "null") -> bytes:
    return (
        b'data: {"choices":[{"index":0,"delta":'
        + delta.encode()
        + b',"finish_reason":'
        + (finish.encode())
        + b"}]}\n\n"
    )


def test_missing_done_and_usage_is_tolerated_after_a_finish_reason() -> None:
    body = _chunk('{"content":"hi"}') + _chunk("{}", '"stop"')
    events = run(translator("chat"), [body])
    assert events[-1]["type"] == "response.completed"
    assert events[-1]["response"]["usage"] is None


def test_done_without_finish_reason_completes() -> None:
    events = run(translator("chat"), [_chunk('{"content":"hi"}') + b"data: [DONE]\n\n"])
    summary = check_sequence(events)
    assert summary.text == "hi" and events[-1]["type"] == "response.completed"


def test_terminal_waits_for_the_usage_chunk() -> None:
    t = translator("chat")
    first = run(t, [_chunk('{"content":"hi"}') + _chunk("{}", '"stop"')], eof=False)
    assert first[-1]["type"] == "response.output_item.done" and t.outcome is None
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1}}\n\n'
    rest = run(t, [usage], eof=False)
    assert [e["type"] for e in rest] == ["response.completed"] and t.outcome == "completed"
    assert rest[0]["response"]["usage"]["total_tokens"] == 4
    assert t.feed(SSEEvent(None, b"[DONE]")) == []  # nothing after the terminal event


def test_stream_cut_before_finish_is_a_failure() -> None:
    t = translator("chat")
    events = run(t, [_chunk('{"content":"hi"}')], eof=False)
    assert events[0]["type"] == "response.created"
    with pytest.raises(UpstreamError) as err:
        t.eof()
    assert err.value.started and err.value.code == "server_error"
    assert t.response is not None and t.last_seq == len(events) - 1


@pytest.mark.parametrize(
    "data",
    [b"{not json", b"[1,2]", b'{"error":{"message":"boom","code":500}}', b'{"error":"bad"}'],
)
def test_garbage_and_error_chunks_fail_the_response(data: bytes) -> None:
    t = translator("chat")
    with pytest.raises(UpstreamError) as err:
        t.feed(SSEEvent(None, data))
    assert err.value.started
    if b"boom" in data:
        assert err.value.message == "boom" and err.value.status == 500


def test_empty_body_is_a_failure_without_created() -> None:
    t = translator("chat")
    with pytest.raises(UpstreamError):
        t.eof()
    assert t.response is None and t.last_seq == -1


def test_fragments_before_the_name_are_kept() -> None:
    body = (
        _chunk('{"tool_calls":[{"index":0,"id":"c9","function":{"arguments":"{\\"a\\""}}]}')
        + _chunk('{"tool_calls":[{"index":0,"function":{"name":"f","arguments":":1}"}}]}')
        + _chunk("{}", '"tool_calls"')
    )
    summary = check_sequence(run(translator("chat"), [body]))
    assert [(c["name"], c["call_id"], c["arguments"]) for c in summary.calls] == [
        ("f", "c9", '{"a":1}')
    ]


def test_deprecated_function_call_delta() -> None:
    body = (
        _chunk('{"function_call":{"name":"f","arguments":"{}"}}')
        + _chunk("{}", '"function_call"')
        + b"data: [DONE]\n\n"
    )
    summary = check_sequence(run(translator("chat"), [body]))
    call = summary.calls[0]
    assert call["name"] == "f" and call["arguments"] == "{}" and call["call_id"].startswith("call")

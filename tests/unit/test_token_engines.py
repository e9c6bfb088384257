"""The token engines (llama.cpp, vLLM, SGLang): the bodies they build and the streams they
read, in the servers' own shapes (proxy/core/tokens/engine.py, vllm.py and sglang.py cite
them)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from wsmode.core.errors import UpstreamError
from wsmode.core.sse import SSEEvent
from wsmode.core.tokens.engine import (
    LLAMACPP_FINAL_FIELDS,
    EngineUsage,
    Generated,
    LlamaCppEngine,
    Sampling,
)
from wsmode.core.tokens.sglang import SglangEngine
from wsmode.core.tokens.vllm import VllmEngine

PROMPT = b"[2,3,500]"
FULL = Sampling(model="m", max_tokens=5, temperature=0.5, top_p=0.9, seed=7, stop=("x",))


def ev(doc: Any) -> SSEEvent:
    return SSEEvent(None, doc if isinstance(doc, bytes) else orjson.dumps(doc))


def feed_all(stream: Any, docs: list[Any]) -> list[Generated]:
    out = [stream.feed(ev(d)) for d in docs]
    out.append(stream.eof())
    return out


# ---------------------------------------------------------------------------- vLLM


def test_vllm_bodies() -> None:
    e = VllmEngine()
    assert orjson.loads(e.tokenize_body("<bos>hi")) == {
        "prompt": "<bos>hi",
        "add_special_tokens": False,
    }
    assert e.tokenize_ids(b'{"count":2,"max_model_len":9,"tokens":[4,5]}') == [4, 5]
    body = orjson.loads(e.generate_body(PROMPT, FULL))
    assert body["token_ids"] == [2, 3, 500] and body["model"] == "m"
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["sampling_params"] == {
        "max_tokens": 5,
        "temperature": 0.5,
        "top_p": 0.9,
        "seed": 7,
        "stop": ["x"],
    }
    bare = orjson.loads(e.generate_body(PROMPT, Sampling(logprobs=True, session="s")))
    assert "model" not in bare and bare["sampling_params"] == {"logprobs": 0}
    assert "session" not in orjson.dumps(bare).decode()


def _chunk(ids: list[int], finish: str | None = None, text: str | None = "") -> Any:
    """A stream chunk as vLLM sends it for `output_mode: "text"` (`text` None: left out)."""
    choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish}
    choice["token_ids"] = ids
    if text is not None:
        choice["text"] = text
    chunk = {"request_id": "generate-tokens-1", "output_mode": "text", "choices": [choice]}
    return {**chunk, "usage": None}


USAGE = {
    "request_id": "generate-tokens-1",
    "output_mode": "text",
    "choices": [],
    "usage": {
        "prompt_tokens": 10,
        "total_tokens": 12,
        "completion_tokens": 2,
        "prompt_tokens_details": {"cached_tokens": 8},
    },
}


def test_vllm_stream_reports_finish_with_usage() -> None:
    out = feed_all(
        VllmEngine().stream(),
        [_chunk([7], text="a"), _chunk([8], "length", "b"), USAGE, b"[DONE]"],
    )
    assert [(g.text, g.ids, g.finish) for g in out[:2]] == [("a", [7], None), ("b", [8], None)]
    assert out[2].finish == "length" and out[2].usage == EngineUsage(10, 2, 8)
    assert out[3] == Generated() and out[4] == Generated()


def test_vllm_stream_without_usage_finishes_on_done_or_eof() -> None:
    s = VllmEngine().stream()
    s.feed(ev(_chunk([1], "stop")))
    done = s.feed(ev(b"[DONE]"))
    assert done.finish == "stop" and done.usage is None
    s = VllmEngine().stream()
    s.feed(ev(_chunk([1], "stop")))
    assert s.eof().finish == "stop"


def test_vllm_logprobs() -> None:
    doc = _chunk([5])
    doc["choices"][0]["logprobs"] = {
        "content": [{"token": "token_id:5", "logprob": -0.5, "bytes": None, "top_logprobs": []}]
    }
    assert VllmEngine().stream().feed(ev(doc)).logprobs == [-0.5]


@pytest.mark.parametrize(
    ("doc", "code"),
    [
        (
            {"output_mode": "text", "choices": [{"index": 0, "finish_reason": None}]},
            "upstream_protocol_error",
        ),
        ({"request_id": "x", "output_mode": "text"}, "upstream_protocol_error"),
        ({"error": {"message": "boom", "type": "BadRequestError", "code": 400}}, "server_error"),
        (_chunk([1], "abort"), "server_error"),
        (b"not json", None),
    ],
)
def test_vllm_stream_errors(doc: Any, code: str | None) -> None:
    with pytest.raises(UpstreamError) as caught:
        VllmEngine().stream().feed(ev(doc))
    if code is not None:
        assert caught.value.code == code


def _older(doc: dict[str, Any]) -> dict[str, Any]:
    """The chunk of a vLLM that predates `output_mode`: no echo, no text."""
    choices = [{k: v for k, v in c.items() if k != "text"} for c in doc["choices"]]
    return {k: v for k, v in doc.items() if k != "output_mode"} | {"choices": choices}


@pytest.mark.parametrize("at", [0, 1], ids=["first-chunk", "a-later-chunk"])
def test_a_vllm_that_ignores_output_mode_is_a_protocol_error_naming_it(at: int) -> None:
    chunks = [_chunk([7], text="a"), _chunk([8], "stop", "b"), USAGE]
    chunks[at] = _older(chunks[at])
    s = VllmEngine().stream()
    for chunk in chunks[:at]:
        s.feed(ev(chunk))
    with pytest.raises(UpstreamError) as caught:
        s.feed(ev(chunks[at]))
    assert caught.value.status == 502 and caught.value.code == "upstream_protocol_error"
    assert "`output_mode`" in caught.value.message


def test_vllm_ids_without_their_text_are_a_protocol_error_naming_the_field() -> None:
    s = VllmEngine().stream()
    assert s.feed(ev(_chunk([], text=""))).ids == []  # text alone, or none with no ids: fine
    with pytest.raises(UpstreamError) as caught:
        s.feed(ev(_chunk([8], text=None)))
    assert caught.value.code == "upstream_protocol_error"
    assert "`choices[].text`" in caught.value.message


def test_vllm_reported_error_keeps_its_status() -> None:
    with pytest.raises(UpstreamError) as caught:
        VllmEngine().stream().feed(ev({"error": {"message": "bad", "code": 400}}))
    assert caught.value.status == 400 and "bad" in str(caught.value)


def test_vllm_eof_before_finish() -> None:
    s = VllmEngine().stream()
    s.feed(ev(_chunk([1])))
    with pytest.raises(UpstreamError):
        s.eof()
    s = VllmEngine().stream()
    with pytest.raises(UpstreamError):
        s.feed(ev(b"[DONE]"))


# ---------------------------------------------------------------------------- SGLang


def test_sglang_bodies() -> None:
    e = SglangEngine()
    assert orjson.loads(e.tokenize_body("x")) == {"prompt": "x", "add_special_tokens": False}
    assert e.tokenize_ids(b'{"tokens":[1],"count":1,"max_model_len":5}') == [1]
    body = orjson.loads(e.generate_body(PROMPT, FULL))
    assert body["input_ids"] == [2, 3, 500] and body["stream"] is True
    assert body["sampling_params"] == {
        "max_new_tokens": 5,
        "temperature": 0.5,
        "top_p": 0.9,
        "sampling_seed": 7,
        "stop": ["x"],
    }
    assert "model" not in body and "session_id" not in body
    more = orjson.loads(e.generate_body(PROMPT, Sampling(logprobs=True, session="chain-1")))
    assert more["return_logprob"] is True and more["session_id"] == "chain-1"
    assert "session_params" not in more


def _out(text: str, ids: list[int], finish: Any = None, **meta: Any) -> Any:
    info = {"id": "r", "finish_reason": finish, "prompt_tokens": 10, "completion_tokens": len(ids)}
    info["cached_tokens"] = 4
    info.update(meta)
    return {"text": text, "output_ids": ids, "meta_info": info}


def test_sglang_cumulative_becomes_deltas() -> None:
    docs = [
        _out("he", [1], output_token_logprobs=[[-0.1, 1, None]]),
        _out("hell", [1, 2], output_token_logprobs=[[-0.1, 1, None], [-0.2, 2, None]]),
        _out("hello", [1, 2, 3], {"type": "stop", "matched": 1}),
        b"[DONE]",
    ]
    out = feed_all(SglangEngine().stream(), docs)
    assert [(g.text, g.ids) for g in out[:3]] == [("he", [1]), ("ll", [2]), ("o", [3])]
    assert out[1].logprobs == [-0.2]
    assert out[2].finish == "stop" and out[2].usage == EngineUsage(10, 3, 4)
    assert out[3] == Generated() and out[4] == Generated()


def test_sglang_incremental_is_taken_as_is() -> None:
    docs = [_out("he", [1]), _out("ll", [2]), _out("o", [3], {"type": "length", "length": 3})]
    out = feed_all(SglangEngine(incremental=True).stream(), docs)
    assert [(g.text, g.ids) for g in out[:3]] == [("he", [1]), ("ll", [2]), ("o", [3])]
    assert out[2].finish == "length"


def test_sglang_cumulative_that_does_not_extend_is_a_protocol_error() -> None:
    s = SglangEngine().stream()
    s.feed(ev(_out("ab", [1, 2])))
    with pytest.raises(UpstreamError) as caught:
        s.feed(ev(_out("c", [3])))
    assert caught.value.code == "upstream_protocol_error"


@pytest.mark.parametrize(
    "doc",
    [
        {"text": "x", "meta_info": {}},
        {"error": {"message": "Either text, input_ids or input_embeds should be provided."}},
        _out("", [], {"type": "abort", "message": "aborted"}),
        b"[1, 2]",
    ],
)
def test_sglang_stream_errors(doc: Any) -> None:
    with pytest.raises(UpstreamError):
        SglangEngine().stream().feed(ev(doc))


def test_sglang_eof_before_finish() -> None:
    s = SglangEngine().stream()
    s.feed(ev(_out("a", [1])))
    with pytest.raises(UpstreamError):
        s.eof()


# ---------------------------------------------------------------------------- llama.cpp


def test_llamacpp_asks_for_the_final_fields_it_reads() -> None:
    """The generate body names the final event's fields (`response_fields`), so llama.cpp
    leaves out the prompt's text; the final event trimmed to them reads as the whole one."""
    body = orjson.loads(LlamaCppEngine().generate_body(PROMPT, FULL))
    assert body["response_fields"] == list(LLAMACPP_FINAL_FIELDS)
    final = {
        "index": 0,
        "content": "",
        "tokens": [],
        "id_slot": 0,
        "stop": True,
        "model": "m",
        "tokens_predicted": 3,
        "tokens_evaluated": 12,
        "generation_settings": {"seed": 7},
        "prompt": "<start_of_turn>user\n" + "history " * 1000,
        "has_new_line": False,
        "truncated": False,
        "stop_type": "limit",
        "stopping_word": "",
        "tokens_cached": 14,
        "timings": {"cache_n": 9, "prompt_n": 3, "predicted_n": 3},
    }
    trimmed = {k: final[k] for k in LLAMACPP_FINAL_FIELDS if k in final}
    assert "prompt" not in trimmed
    token = {"index": 0, "content": "a", "tokens": [5], "stop": False}
    whole, short = (feed_all(LlamaCppEngine().stream(), [token, doc]) for doc in (final, trimmed))
    assert whole == short
    assert whole[1].finish == "length"
    assert whole[1].usage == EngineUsage(prompt_tokens=12, completion_tokens=3, cached_tokens=9)

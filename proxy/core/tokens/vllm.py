"""vLLM's token engine: `POST /inference/v1/generate` (token ids in, token ids out) and
`POST /tokenize`.

Built from vLLM's own sources and docs (github.com/vllm-project/vllm, read in 2025; the
generate models and stream at commits 06408932 and later, the doc at 006ebac2):
- `docs/serving/online_serving/token_in_token_out.md`: the endpoint exists on `vllm serve`
  started with `--enable-scale-out` (always with `--tokens-only`); `output_mode: "text"` adds
  each choice's `text`, a delta when streaming, and every answer echoes `output_mode`.
- `vllm/entrypoints/serve/disagg/protocol.py`: the request is `token_ids`, `sampling_params`
  (vLLM's `SamplingParams`: `max_tokens`, `temperature`, `top_p`, `seed`, `stop`,
  `logprobs`), an optional `model` (checked against the served name), `stream` and
  `stream_options`; a stream chunk is `{"request_id", "choices": [{"index", "token_ids",
  "finish_reason", "logprobs"}], "usage"}`.
- `vllm/entrypoints/serve/disagg/serving.py`: streamed `token_ids` are deltas; the finish
  rides on the chunk of the last ids; with `stream_options.include_usage` a last chunk with
  no choices carries `usage` (`prompt_tokens`, `completion_tokens`, and
  `prompt_tokens_details.cached_tokens` only when the server runs with
  `--enable-prompt-tokens-details` and something was cached); an error is a
  `data: {"error": {...}}` event; the stream always ends with `data: [DONE]`. Logprobs are
  OpenAI chat-style: `logprobs.content[].logprob`.
- `vllm/entrypoints/serve/tokenize/protocol.py`: `/tokenize` takes `prompt` and
  `add_special_tokens` (default true) and answers `tokens` (with `count` and
  `max_model_len`). The Hugging Face tokenizer behind it parses special tokens written in
  the text, which is what the token path asks for.

vLLM takes no session or conversation key on this endpoint, so `Sampling.session` is not
sent, nor `Sampling.slot` (a llama.cpp notion). `output_mode: "text"` is asked for because
the token path reads the generated text. A server that predates the field ignores it and
streams ids only, without echoing it (the doc above says to check the echo): every chunk
must echo `output_mode: "text"`, and a choice with ids must carry its `text`, else the
answer is a 502 `upstream_protocol_error` naming the field, never a response that completes
with no text. A `--tokens-only` server, which has no tokenizer, refuses the field with a 400.
The start-up probe (upstream/token_probe.py) sends one such request of one token, so either
shows in `/readyz` before any turn.
"""

from __future__ import annotations

from typing import Any

from .. import wire
from ..api_objects import count
from ..errors import UpstreamError
from ..sse import SSEEvent
from .engine import (
    EngineUsage,
    Generated,
    HfTokenize,
    Sampling,
    int_list,
    json_object,
    protocol_error,
    reported_error,
    sampling_params,
)

_DONE = b"[DONE]"
OUTPUT_MODE = "text"  # asked for, and echoed by every chunk of a server that knows it
# vLLM's finish reasons (vllm/v1/engine FinishReason): "stop" (EOS, a stop string or stop
# token), "length" (max_tokens or the context), "abort" (the request was cancelled), "error"
_FINISH = {"stop": "stop", "length": "length"}


def _usage(doc: Any) -> EngineUsage:
    details = doc.get("prompt_tokens_details") if isinstance(doc, dict) else None
    return EngineUsage(
        prompt_tokens=count(doc, "prompt_tokens"),
        completion_tokens=count(doc, "completion_tokens"),
        cached_tokens=count(details, "cached_tokens"),
    )


def _logprobs(value: Any) -> list[float]:
    content = value.get("content") if isinstance(value, dict) else None
    if not isinstance(content, list):
        return []
    return [
        float(entry["logprob"])
        for entry in content
        if isinstance(entry, dict) and isinstance(entry.get("logprob"), int | float)
    ]


class VllmStream:
    """The `/inference/v1/generate` stream. Its finish and its usage come on two chunks (the
    last ids' and the usage one); they are reported together, on the usage chunk, or on
    `[DONE]` or the body's end when no usage came."""

    def __init__(self) -> None:
        self._finish: str | None = None  # seen, not yet reported
        self._usage: EngineUsage | None = None
        self._done = False  # the finish was reported

    def feed(self, event: SSEEvent) -> Generated:
        if self._done:
            return Generated()
        if event.data == _DONE:
            return self._finished()
        doc = json_object(event.data, "a generate chunk")
        if (err := reported_error(doc)) is not None:
            raise err
        if (mode := doc.get("output_mode")) != OUTPUT_MODE:
            raise protocol_error(
                f"upstream answer has `output_mode` {mode!r}, not the {OUTPUT_MODE!r} asked "
                "for (vLLM /inference/v1/generate; a vLLM that predates `output_mode` "
                "ignores it and streams ids without their text)"
            )
        out = Generated()
        choices = doc.get("choices")
        if not isinstance(choices, list):
            raise protocol_error("upstream answer has no `choices` (vLLM /inference/v1/generate)")
        for choice in choices:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue  # one sequence is asked for (n = 1)
            out.ids = int_list(choice.get("token_ids"), "vLLM generate `choices[].token_ids`")
            text = choice.get("text")
            if isinstance(text, str):
                out.text = text
            elif out.ids:
                raise protocol_error(
                    "upstream answer has ids without their text (vLLM generate `choices[].text`)"
                )
            out.logprobs = _logprobs(choice.get("logprobs"))
            reason = choice.get("finish_reason")
            if reason is not None:
                if reason not in _FINISH:
                    raise UpstreamError(
                        f"upstream ended the generation with finish_reason {reason!r}",
                        started=True,
                        code="server_error",
                    )
                self._finish = _FINISH[reason]
        if isinstance(doc.get("usage"), dict):
            self._usage = _usage(doc["usage"])
            if self._finish is not None and not choices:  # the usage chunk
                return self._finished()
        return out

    def _finished(self) -> Generated:
        if self._finish is None:
            raise UpstreamError(
                "upstream stream ended before a finish_reason", started=True, code="server_error"
            )
        self._done = True
        return Generated(finish=self._finish, usage=self._usage)

    def eof(self) -> Generated:
        if self._done:
            return Generated()
        return self._finished()


class VllmEngine(HfTokenize):
    """vLLM's token-in/token-out endpoint (`vllm serve --enable-scale-out`)."""

    name = "vllm"
    generate_path = "/inference/v1/generate"

    def generate_body(self, prompt: bytes, sampling: Sampling) -> bytes:
        params = sampling_params(sampling, limit="max_tokens", seed="seed")
        if sampling.logprobs:
            params["logprobs"] = 0  # the sampled token's own log probability only
        head: dict[str, Any] = {
            "stream": True,
            "stream_options": {"include_usage": True},
            "output_mode": OUTPUT_MODE,
            "sampling_params": params,
        }
        if sampling.model is not None:
            head["model"] = sampling.model
        return wire.dumps(head)[:-1] + b',"token_ids":' + prompt + b"}"

    def stream(self) -> VllmStream:
        return VllmStream()


__all__ = ["VllmEngine", "VllmStream"]

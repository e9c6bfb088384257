"""SGLang's token engine: its native `POST /generate` with `input_ids`, and `POST /tokenize`.

Built from SGLang's sources (github.com/sgl-project/sglang, read in 2025 at commits
001067ff, 0025436e, 0351c1fa and 00c17caf):
- `python/sglang/srt/managers/io_struct.py`, `GenerateReqInput`: the prompt as `input_ids`,
  `sampling_params` (a dict), `stream`, `return_logprob`, and `session_id`, a stable key
  shared by a session's requests that, unlike `session_params` (continual prompting, which
  rebuilds the prompt from the server's own session state), leaves the prompt as sent. The
  chain's key (`Sampling.session`) goes there; `session_params` is never used, since the
  token path sends the whole prompt itself.
- `python/sglang/srt/sampling/sampling_params.py`: `max_new_tokens`, `temperature`,
  `top_p`, `stop`, `sampling_seed`.
- `python/sglang/srt/entrypoints/http_server.py`: `/generate` streams `data: <json>` events
  and ends with `data: [DONE]`; a failure inside the stream is `{"error": {"message"}}`.
  `/tokenize` (also at `/v1/tokenize`) is the OpenAI-style one.
- `python/sglang/srt/managers/tokenizer_manager_components/output_processor.py`: each event
  is `{"text", "output_ids", "meta_info"}`. By default the streamed `text` and `output_ids`
  are everything generated so far (cumulative, as are `meta_info.output_token_logprobs`);
  only a server started with `--incremental-streaming-output` sends deltas. `meta_info`
  carries `finish_reason` (null until the end, then an object whose `type` is "stop",
  "length" or "abort"), `prompt_tokens`, `completion_tokens` and `cached_tokens`.
- `python/sglang/srt/entrypoints/openai/serving_tokenize.py`: `/tokenize` takes `prompt` and
  `add_special_tokens` and answers `tokens` (and `count`, `max_model_len`), from the Hugging
  Face tokenizer's `encode`, which parses special tokens written in the text.

The engine cannot tell from one event whether the server sends cumulative or incremental
output, so it is told (`incremental`, the server's flag); a cumulative event that does not
extend what was seen is a protocol error.
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
_FINISH = {"stop": "stop", "length": "length"}


def _finish_type(value: Any) -> str:
    """`meta_info.finish_reason`'s kind: an object with `type` (or, from older servers, the
    bare string)."""
    kind = value.get("type") if isinstance(value, dict) else value
    return str(kind)


def _logprobs(value: Any) -> list[float]:
    """`output_token_logprobs`: one `[logprob, token_id, text]` per generated token."""
    if not isinstance(value, list):
        return []
    return [
        float(entry[0])
        for entry in value
        if isinstance(entry, list | tuple) and entry and isinstance(entry[0], int | float)
    ]


class SglangStream:
    def __init__(self, *, incremental: bool = False) -> None:
        self._incremental = incremental
        self._ids = 0  # generated ids seen (cumulative mode)
        self._last_id: int | None = None  # the last of them, to check the next event extends it
        self._chars = 0  # text characters seen
        self._logprobs = 0  # logprobs seen
        self._done = False

    def feed(self, event: SSEEvent) -> Generated:
        if self._done or event.data == _DONE:
            return Generated()
        doc = json_object(event.data, "a generate event")
        if (err := reported_error(doc)) is not None:
            raise err
        ids = int_list(doc.get("output_ids"), "SGLang /generate `output_ids`")
        meta = doc.get("meta_info")
        meta = meta if isinstance(meta, dict) else {}
        text = doc.get("text")
        probs = _logprobs(meta.get("output_token_logprobs"))
        out = Generated()
        if self._incremental:
            out.ids, out.logprobs = ids, probs
            out.text = text if isinstance(text, str) else ""
        else:
            out.ids = self._new_ids(ids)
            out.logprobs = probs[self._logprobs :]
            self._logprobs = max(self._logprobs, len(probs))
            if isinstance(text, str):
                out.text = text[self._chars :]
                self._chars = max(self._chars, len(text))
        reason = meta.get("finish_reason")
        if reason is not None:
            kind = _finish_type(reason)
            if kind not in _FINISH:
                message = reason.get("message") if isinstance(reason, dict) else None
                raise UpstreamError(
                    str(message or f"upstream ended the generation ({kind})"),
                    started=True,
                    code="server_error",
                )
            self._done = True
            out.finish = _FINISH[kind]
            out.usage = EngineUsage(
                prompt_tokens=count(meta, "prompt_tokens"),
                completion_tokens=count(meta, "completion_tokens"),
                cached_tokens=count(meta, "cached_tokens"),
            )
        return out

    def _new_ids(self, ids: list[int]) -> list[int]:
        """The ids a cumulative event adds to those seen."""
        seen = self._ids
        if len(ids) < seen or (seen and ids[seen - 1] != self._last_id):
            raise protocol_error(
                "SGLang /generate `output_ids` do not extend the earlier ones (is the server "
                "started with --incremental-streaming-output?)"
            )
        self._ids = len(ids)
        if ids:
            self._last_id = ids[-1]
        return ids[seen:]

    def eof(self) -> Generated:
        if not self._done:
            raise UpstreamError(
                "upstream stream ended before its finish_reason", started=True, code="server_error"
            )
        return Generated()


class SglangEngine(HfTokenize):
    """SGLang's native API. `incremental`: the server runs with
    `--incremental-streaming-output` (its streamed text and ids are then deltas)."""

    name = "sglang"
    generate_path = "/generate"

    def __init__(self, *, incremental: bool = False) -> None:
        self.incremental = incremental

    def generate_body(self, prompt: bytes, sampling: Sampling) -> bytes:
        params = sampling_params(sampling, limit="max_new_tokens", seed="sampling_seed")
        head: dict[str, Any] = {"stream": True, "sampling_params": params}
        if sampling.logprobs:
            head["return_logprob"] = True
        if sampling.session is not None:
            head["session_id"] = sampling.session
        return wire.dumps(head)[:-1] + b',"input_ids":' + prompt + b"}"

    def stream(self) -> SglangStream:
        return SglangStream(incremental=self.incremental)


__all__ = ["SglangEngine", "SglangStream"]

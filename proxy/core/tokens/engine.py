"""Token engines: the model servers that take token ids in and give token ids out
(docs/tokens.md "Engines").

An engine knows three things about its server: how to ask it to tokenise a piece of text
exactly as it tokenises a prompt (special tokens in the text parsed, none added), how to send
it a prompt of token ids with the turn's sampling settings, and how to read its streamed
answer into `Generated` deltas (new text, new ids, the finish, the usage). Everything else of
the token path (rendering, the token cache, parsing the output into Responses items) is the
same for every engine.

Engines are sans-I/O: bodies are bytes, answers are parsed from bytes. llama.cpp's is here;
vLLM's and SGLang's are in `vllm.py` and `sglang.py`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from .. import wire
from ..api_objects import count
from ..errors import UpstreamError
from ..sse import SSEEvent


def protocol_error(message: str) -> UpstreamError:
    """An answer that lacks what the token path needs (ids, a field): 502
    `upstream_protocol_error`, naming what is missing."""
    return UpstreamError(message, status=502, started=True, code="upstream_protocol_error")


@dataclass(frozen=True, slots=True)
class EngineUsage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int  # prompt tokens the server took from its cache


@dataclass(slots=True)
class Generated:
    """What one streamed event of a token engine adds."""

    text: str = ""  # new text (a delta)
    ids: list[int] = field(default_factory=list)  # new generated token ids (a delta)
    logprobs: list[float] = field(default_factory=list)  # one per new id, when asked for
    # set once: "stop" (end of generation or a stop sequence), "length" (the token limit)
    finish: str | None = None
    usage: EngineUsage | None = None


@dataclass(frozen=True, slots=True)
class Sampling:
    """The turn's settings an engine sends beside the prompt (docs/tokens.md "Settings")."""

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: bool = False  # the generated ids' log probabilities
    slot: int | None = None  # llama.cpp `id_slot` (upstream.llamacpp_slots)
    session: str | None = None  # the chain's key, for engines that take one


class EngineStream(Protocol):
    def feed(self, event: SSEEvent) -> Generated:
        """One SSE event of the answer. Raises UpstreamError on garbage, on an error the
        server reports, and (`protocol_error`) on an answer without token ids."""
        ...

    def eof(self) -> Generated:
        """The body ended. Raises UpstreamError when it ended before a finish."""
        ...


class TokenEngine(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def generate_path(self) -> str:
        """The generate endpoint, from the server's root (not its `/v1`)."""
        ...

    @property
    def tokenize_path(self) -> str: ...

    def tokenize_body(self, text: str, *, add_special: bool = False) -> bytes:
        """Asks for `text`'s ids as the server tokenises a prompt: special tokens written in
        the text are parsed; those the model adds to a prompt (BOS) only with `add_special`
        (the start of a prompt, as the server's chat endpoint tokenises it)."""
        ...

    def tokenize_ids(self, body: bytes) -> list[int]:
        """The ids in the tokenise answer. Raises `protocol_error` without them."""
        ...

    def generate_body(self, prompt: bytes, sampling: Sampling) -> bytes:
        """The generate request; `prompt` is the JSON array of the prompt's ids."""
        ...

    def stream(self) -> EngineStream: ...


def int_list(value: Any, what: str) -> list[int]:
    """A list of token ids from an answer, or `protocol_error` naming `what`."""
    # every value an int as JSON decodes one (a bool's type is not `int`), at C speed
    if not isinstance(value, list) or not set(map(type, value)) <= {int}:
        raise protocol_error(f"upstream answer has no token ids ({what})")
    return value


def json_object(data: bytes, what: str) -> dict[str, Any]:
    try:
        doc = wire.loads(data)
    except wire.JSONDecodeError:
        raise UpstreamError(f"upstream sent {what} that is not JSON", started=True) from None
    if not isinstance(doc, dict):
        raise UpstreamError(f"upstream sent {what} that is not a JSON object", started=True)
    return doc


def reported_error(doc: dict[str, Any]) -> UpstreamError | None:
    """An `error` the server put in a streamed event (llama.cpp, vLLM and SGLang do so)."""
    err = doc.get("error")
    if err is None:
        return None
    inner = err if isinstance(err, dict) else {"message": str(err)}
    status = inner.get("code")
    return UpstreamError(
        str(inner.get("message") or "upstream reported an error"),
        started=True,
        status=status if wire.is_int(status) and 400 <= status < 600 else 502,
        code="server_error",
    )


class HfTokenize:
    """`POST /tokenize` as vLLM and SGLang serve it: `prompt` and `add_special_tokens` in,
    `tokens` out, from the model's Hugging Face tokenizer (which parses special tokens
    written in the text)."""

    name: str
    tokenize_path = "/tokenize"

    def tokenize_body(self, text: str, *, add_special: bool = False) -> bytes:
        return wire.dumps({"prompt": text, "add_special_tokens": add_special})

    def tokenize_ids(self, body: bytes) -> list[int]:
        doc = json_object(body, "a tokenize answer")
        return int_list(doc.get("tokens"), f"{self.name} /tokenize `tokens`")


def sampling_params(sampling: Sampling, *, limit: str, seed: str) -> dict[str, Any]:
    """The turn's sampling settings, under the engine's names for the token limit and the
    seed (vLLM `max_tokens`, `seed`; SGLang `max_new_tokens`, `sampling_seed`)."""
    params: dict[str, Any] = {}
    for key, value in (
        (limit, sampling.max_tokens),
        ("temperature", sampling.temperature),
        ("top_p", sampling.top_p),
        (seed, sampling.seed),
    ):
        if value is not None:
            params[key] = value
    if sampling.stop:
        params["stop"] = list(sampling.stop)
    return params


# ---------------------------------------------------------------- llama.cpp

# llama.cpp's /completion `stop_type`: "eos" (an end-of-generation token), "word" (a stop
# string), "limit" (n_predict or the context)
_LLAMACPP_FINISH = {"eos": "stop", "word": "stop", "limit": "length"}
# the fields of the final /completion event that `LlamaCppStream` reads, and `id_slot` (the
# slot that served the request: what the traffic shows of `upstream.llamacpp_slots`), asked
# for by name (`response_fields`): llama.cpp's final event otherwise carries the whole prompt
# as text (128 KB at 32K tokens) and the generation settings, written by the server and read
# here on every turn. A server that predates the field sends them all; nothing else changes.
LLAMACPP_FINAL_FIELDS: Final = (
    "content",
    "tokens",
    "completion_probabilities",
    "stop",
    "stop_type",
    "timings",
    "tokens_predicted",
    "id_slot",
)


class LlamaCppStream:
    """llama-server's `/completion` stream: one `data:` event per token with `content` and
    (with `return_tokens`) `tokens`, then a final event with `stop: true`, `stop_type` and
    `timings` (`prompt_n` computed, `cache_n` from the slot's cache)."""

    def __init__(self) -> None:
        self._done = False

    def feed(self, event: SSEEvent) -> Generated:
        if self._done:
            return Generated()
        doc = json_object(event.data, "a completion event")
        if (err := reported_error(doc)) is not None:
            raise err
        out = Generated()
        content = doc.get("content")
        if isinstance(content, str):
            out.text = content
        out.ids = int_list(doc.get("tokens"), "llama.cpp /completion `tokens`")
        probs = doc.get("completion_probabilities")
        if isinstance(probs, list):
            out.logprobs = [
                float(p["logprob"])
                for p in probs
                if isinstance(p, dict) and isinstance(p.get("logprob"), int | float)
            ]
        if doc.get("stop") is True:
            self._done = True
            out.finish = _LLAMACPP_FINISH.get(str(doc.get("stop_type")), "stop")
            timings = doc.get("timings")
            prompt_n, cache_n = count(timings, "prompt_n"), count(timings, "cache_n")
            out.usage = EngineUsage(
                prompt_tokens=prompt_n + cache_n,
                completion_tokens=count(doc, "tokens_predicted"),
                cached_tokens=cache_n,
            )
        return out

    def eof(self) -> Generated:
        if not self._done:
            raise UpstreamError(
                "upstream stream ended before its final event", started=True, code="server_error"
            )
        return Generated()


class LlamaCppEngine:
    """llama-server (`tools/server/README.md` in llama.cpp): `POST /completion` with `prompt`
    as an array of ids, `POST /tokenize`."""

    name = "llamacpp"
    generate_path = "/completion"
    tokenize_path = "/tokenize"

    def tokenize_body(self, text: str, *, add_special: bool = False) -> bytes:
        return wire.dumps({"content": text, "add_special": add_special, "parse_special": True})

    def tokenize_ids(self, body: bytes) -> list[int]:
        doc = json_object(body, "a tokenize answer")
        return int_list(doc.get("tokens"), "llama.cpp /tokenize `tokens`")

    def generate_body(self, prompt: bytes, sampling: Sampling) -> bytes:
        head: dict[str, Any] = {
            "stream": True,
            "return_tokens": True,
            "cache_prompt": True,
            "response_fields": LLAMACPP_FINAL_FIELDS,
        }
        if sampling.max_tokens is not None:
            head["n_predict"] = sampling.max_tokens
        if sampling.temperature is not None:
            head["temperature"] = sampling.temperature
        if sampling.top_p is not None:
            head["top_p"] = sampling.top_p
        if sampling.seed is not None:
            head["seed"] = sampling.seed
        if sampling.stop:
            head["stop"] = list(sampling.stop)
        if sampling.logprobs:
            head["n_probs"] = 1
            head["post_sampling_probs"] = False
        if sampling.slot is not None:
            head["id_slot"] = sampling.slot
        return wire.dumps(head)[:-1] + b',"prompt":' + prompt + b"}"

    def stream(self) -> LlamaCppStream:
        return LlamaCppStream()


def sampling_of(
    settings: Mapping[str, Any], extra: Mapping[str, Any], model: str | None
) -> Sampling:
    """A turn's sampling settings from the request's `settings` and wsmode's `extra` fields
    (`id_slot`, `prompt_cache_key`); `model` is the server's served name."""

    def number(key: str) -> float | None:
        v = settings.get(key)
        return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None

    limit = settings.get("max_output_tokens")
    seed = settings.get("seed")
    include = settings.get("include")
    slot = extra.get("id_slot")
    chain = extra.get("prompt_cache_key")
    return Sampling(
        model=model,  # the served name: a client's may be any
        max_tokens=limit if wire.is_int(limit) else None,
        temperature=number("temperature"),
        top_p=number("top_p"),
        seed=seed if wire.is_int(seed) else None,
        logprobs=(isinstance(include, list) and "message.output_text.logprobs" in include)
        or wire.is_int(settings.get("top_logprobs")),
        slot=slot if wire.is_int(slot) else None,
        session=chain if isinstance(chain, str) else None,
    )


__all__ = [
    "EngineStream",
    "EngineUsage",
    "Generated",
    "LlamaCppEngine",
    "LlamaCppStream",
    "Sampling",
    "TokenEngine",
    "int_list",
    "json_object",
    "protocol_error",
    "reported_error",
    "sampling_of",
]

"""The Chat Completions dialect: `POST /v1/chat/completions` upstreams (docs/protocol.md "Chat
Completions upstreams").

The request is translated by `chat_request` (Responses items -> Chat messages, memoised per
item) and `chat_settings` (tools and the other settings). The stream is rebuilt event by
event: Chat chunks carry deltas, never item boundaries, so `ChatStream` decides them and
`OutputBuilder` writes the canonical Responses sequence, with ids minted here (`resp_`,
`msg_`, `rs_`, `fc_`).

Chunk handling, tolerant of what real servers send:

- `delta.reasoning_content` (vLLM, DeepSeek) or `delta.reasoning` (newer vLLM, Ollama) ->
  a reasoning item with `response.reasoning_text.*` events; `delta.content` -> a message
  item; `delta.refusal` -> a refusal part of the message.
- `delta.tool_calls[]`: one `function_call` item per `index`, opened by the first fragment
  that has a name (llama.cpp's 32-character ids without a `call_` prefix are kept as they
  are; llama-cpp-python repeats id and name on every fragment, which is ignored); fragments
  without an `index` (old Ollama) go to the call with their `id`, else the latest call. The
  deprecated `delta.function_call` counts only when `tool_calls` is absent.
- `finish_reason` closes every open item; `stop`/`tool_calls` -> `response.completed`,
  `length` -> `response.incomplete` (`max_output_tokens`), `content_filter` ->
  `response.incomplete` (`content_filter`).
- `usage` (from any chunk; the last wins) -> the response's usage, cached tokens included.
  The terminal event goes out once the finish reason and the usage are both known, or at
  `[DONE]`, or at the end of the body after a finish reason: a missing usage chunk or a
  missing `[DONE]` is tolerated. A body that ends before any finish reason is a failure.
- Only choice 0 is followed (the proxy never asks for `n` > 1).
- A chunk with an `error` object (llama.cpp and vLLM report mid-stream failures so) fails
  the response with the upstream's message.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

from .. import wire
from ..api_objects import count, usage_of
from ..errors import UpstreamError
from ..ids import new_id as mint_id
from ..sse import SSEEvent
from .builder import BuiltStream
from .chat_request import TranslationMemo, messages
from .chat_settings import NAMESPACE_SEP, ChatOptions, chat_settings

_FINISH: dict[str, tuple[str, str | None]] = {
    "stop": ("completed", None),
    "tool_calls": ("completed", None),
    "function_call": ("completed", None),
    "length": ("incomplete", "max_output_tokens"),
    "content_filter": ("incomplete", "content_filter"),
}


_ROUTING_FIELDS = ("prompt_cache_key", "id_slot")


def map_usage(usage: dict[str, Any], timings: dict[str, Any] | None = None) -> dict[str, Any]:
    """Chat usage -> Responses usage (docs/protocol.md "Chat Completions upstreams"). Chat
    reports no cache writes: 0.

    llama.cpp's finish chunk carries `timings`; its `cache_n` (prompt tokens taken from the
    slot's cache, `prompt_n` being those computed) stands in for a missing `cached_tokens`."""
    prompt = count(usage, "prompt_tokens")
    completion = count(usage, "completion_tokens")
    details = usage.get("prompt_tokens_details")
    cached = count(details, "cached_tokens")
    if not (isinstance(details, dict) and "cached_tokens" in details) and timings is not None:
        cached = count(timings, "cache_n")
    return usage_of(
        prompt,
        completion,
        cached=cached,
        reasoning=count(usage.get("completion_tokens_details"), "reasoning_tokens"),
        total=count(usage, "total_tokens") or prompt + completion,
    )


def namespace_names(tools: Any) -> dict[str, tuple[str, str]]:
    """Flattened namespace function names -> (namespace, name), as `translate_tools` makes."""
    names: dict[str, tuple[str, str]] = {}
    for tool in tools if isinstance(tools, list) else []:
        if isinstance(tool, dict) and tool.get("type") == "namespace":
            ns = tool.get("name")
            for sub in tool.get("tools") or []:
                if (
                    isinstance(sub, dict)
                    and isinstance(ns, str)
                    and isinstance(sub.get("name"), str)
                ):
                    names[f"{ns}{NAMESPACE_SEP}{sub['name']}"] = (ns, sub["name"])
    return names


class _Call:
    __slots__ = ("args", "id", "name", "opened")

    def __init__(self) -> None:
        self.id: str | None = None
        self.name: str | None = None
        self.args: list[str] = []  # fragments that arrived before the call could open
        self.opened = False


class ChatStream(BuiltStream):
    def __init__(
        self,
        request: dict[str, Any],
        patch: dict[str, Any],
        *,
        names: dict[str, tuple[str, str]],
        clock: Callable[[], float],
        new_id: Callable[[str], str],
    ) -> None:
        super().__init__(request, patch, clock=clock, new_id=new_id)
        self._names = names
        self._calls: dict[Hashable, _Call] = {}
        self._last_call: Hashable | None = None
        self._finish: str | None = None  # the finish_reason, once seen
        self._usage: dict[str, Any] | None = None
        self._timings: dict[str, Any] | None = None  # llama.cpp's, in its finish chunk

    # ------------------------------------------------------------ StreamTranslator

    def feed(self, event: SSEEvent) -> list[bytes]:
        if self.outcome is not None:
            return []
        data = event.data.strip()
        if data == b"[DONE]":
            return self._terminal()
        try:
            chunk = wire.loads(data)
        except wire.JSONDecodeError:
            raise UpstreamError("upstream sent a chunk that is not JSON", started=True) from None
        if not isinstance(chunk, dict):
            raise UpstreamError("upstream sent a chunk that is not a JSON object", started=True)
        if isinstance(chunk.get("error"), dict | str):
            raise _chunk_error(chunk["error"])
        out = self._start(chunk)
        choices = chunk.get("choices")
        for choice in choices if isinstance(choices, list) else []:
            if isinstance(choice, dict) and choice.get("index", 0) == 0:
                out += self._choice(choice)
        timings = chunk.get("timings")
        if isinstance(timings, dict):  # only its counts are read
            self._timings = timings
        usage = chunk.get("usage")
        if isinstance(usage, dict):  # kept and written in the response object: bounded
            try:
                wire.check_depth(usage, wire.MAX_DEPTH - 3)
            except wire.TooDeep:
                raise UpstreamError(
                    "upstream sent a usage object nested too deeply", started=True
                ) from None
            self._usage = usage
        if self._finish is not None and self._usage is not None:
            out += self._terminal()
        return out

    def eof(self) -> list[bytes]:
        if self.outcome is not None:
            return []
        if self._finish is None:
            raise UpstreamError(
                "upstream stream ended before a finish_reason", started=True, code="server_error"
            )
        return self._terminal()

    # ------------------------------------------------------------ internals

    def _start(self, chunk: dict[str, Any] | None) -> list[bytes]:
        if self._builder is not None:
            return []
        model = chunk.get("model") if chunk is not None else None
        return self._begin(self._new_id("resp"), None, model)

    def _choice(self, choice: dict[str, Any]) -> list[bytes]:
        if self._finish is not None:
            return []  # nothing after the finish reason belongs to this response
        b = self._builder
        assert b is not None
        out: list[bytes] = []
        delta = choice.get("delta")
        if isinstance(delta, dict):
            reasoning = delta.get("reasoning_content")
            if not isinstance(reasoning, str):
                reasoning = delta.get("reasoning")
            if isinstance(reasoning, str):
                out += b.reasoning(reasoning)
            if isinstance(delta.get("content"), str):
                out += b.text(delta["content"])
            if isinstance(delta.get("refusal"), str):
                out += b.refusal(delta["refusal"])
            calls = delta.get("tool_calls")
            if isinstance(calls, list):
                for frag in calls:
                    if isinstance(frag, dict):
                        out += self._fragment(frag)
            elif isinstance(delta.get("function_call"), dict):
                out += self._fragment({"index": 0, "function": delta["function_call"]})
        reason = choice.get("finish_reason")
        if isinstance(reason, str) and reason:
            self._finish = reason
            status, _ = _FINISH.get(reason, ("completed", None))
            out += self._open_pending() + b.close_all(status)
        return out

    def _fragment(self, frag: dict[str, Any]) -> list[bytes]:
        b = self._builder
        assert b is not None
        index = frag.get("index")
        fid = frag.get("id") if isinstance(frag.get("id"), str) and frag.get("id") else None
        key: Hashable
        if wire.is_int(index):
            key = index
        elif fid is not None:  # no index (old Ollama): the call with this id, or a new one
            key = next((k for k, c in self._calls.items() if c.id == fid), ("id", fid))
        else:
            key = self._last_call if self._last_call is not None else 0
        call = self._calls.get(key)
        if call is None:
            call = self._calls[key] = _Call()
        self._last_call = key
        fn = frag.get("function")
        fn = fn if isinstance(fn, dict) else {}
        if call.id is None and fid is not None:
            call.id = fid
        name = fn.get("name")
        if call.name is None and isinstance(name, str) and name:
            call.name = name
        args = fn.get("arguments")
        args = args if isinstance(args, str) else ""
        out: list[bytes] = []
        if not call.opened and call.name is not None:
            out += self._open(key, call)
        if call.opened:
            out += b.call_args(key, args)
        elif args:
            call.args.append(args)
        return out

    def _open(self, key: Hashable, call: _Call) -> list[bytes]:
        b = self._builder
        assert b is not None
        call.opened = True
        name = call.name or ""
        namespace: str | None = None
        if name in self._names:
            namespace, name = self._names[name]
        out = b.call_open(
            key, call_id=call.id or self._new_id("call"), name=name, namespace=namespace
        )
        if call.args:
            out += b.call_args(key, "".join(call.args))
            call.args.clear()
        return out

    def _open_pending(self) -> list[bytes]:
        """Calls that never got a name still become items, so no arguments are lost."""
        out: list[bytes] = []
        for key, call in self._calls.items():
            if not call.opened:
                out += self._open(key, call)
        return out

    def _terminal(self) -> list[bytes]:
        out = self._start(None)
        status, reason = _FINISH.get(self._finish or "stop", ("completed", None))
        if self._finish is None:
            out += self._open_pending()
        usage = map_usage(self._usage, self._timings) if self._usage is not None else None
        return out + self._end(status, usage, None, reason)


def _chunk_error(err: Any) -> UpstreamError:
    inner = err if isinstance(err, dict) else {"message": str(err)}
    raw = inner.get("code")
    status = raw if isinstance(raw, int) and 400 <= raw < 600 else 500
    etype = inner.get("type")
    return UpstreamError(
        str(inner.get("message") or "upstream reported an error"),
        started=True,
        status=status,
        code=raw if isinstance(raw, str) else "server_error",
        type=etype if isinstance(etype, str) else "server_error",
    )


class ChatDialect:
    name = "chat"
    path = "/chat/completions"

    def __init__(
        self,
        options: ChatOptions | None = None,
        *,
        clock: Callable[[], float] = lambda: 0.0,
        new_id: Callable[[str], str] = mint_id,
    ) -> None:
        self.options = options or ChatOptions()
        self.memo = TranslationMemo(self.options.translation_cache_bytes)
        self._clock = clock
        self._new_id = new_id

    def body(
        self, settings: dict[str, Any], extra: dict[str, Any], items: list[bytes]
    ) -> list[bytes]:
        """`extra` (stream, store, previous_response_id) has no Chat meaning: the Chat body
        always streams with usage, and Chat's `store` is something else. Its session key
        (`prompt_cache_key`) and llama.cpp slot (`id_slot`) go as they are (core/routing.py)."""
        head, _ = chat_settings(settings, self.options)
        for key in _ROUTING_FIELDS:
            if key in extra:
                head[key] = extra[key]
        instructions = settings.get("instructions")
        msgs = messages(
            items, self.options, self.memo, instructions if isinstance(instructions, str) else None
        )
        prefix = wire.dumps(head)
        pieces = [prefix[:-1], b',"messages":[']
        for i, msg in enumerate(msgs):
            if i:
                pieces.append(b",")
            pieces.append(msg)
        pieces.append(b"]}")
        return pieces

    def translator(self, patch: dict[str, Any], request: dict[str, Any]) -> ChatStream:
        return ChatStream(
            request,
            patch,
            names=namespace_names(request.get("tools")),
            clock=self._clock,
            new_id=self._new_id,
        )

    def retry_elsewhere(self, status: int, stream: object) -> bool:
        return False

"""The token path's start-up (docs/tokens.md "Start-up"): which engine the server is, its
chat template and special tokens, its vocabulary and context window.

`upstream.token_engine = "auto"` asks the server's root in turn: llama.cpp answers
`GET /props` (with `default_generation_settings`), SGLang `GET /get_model_info` (with
`model_path`), vLLM `GET /version`. The template is `upstream.chat_template_file`, else the
one llama.cpp reports in `/props`; vLLM and SGLang report none, so they need the file.

vLLM serves its generate endpoint only when started with `--enable-scale-out`, and a vLLM
that predates `output_mode` answers it with ids and no text: one generate of one token, as
a turn sends it, finds either. llama.cpp's `/completion` and SGLang's `/generate` are there on
every server that answers the engine's own info route, so they are not asked to generate.

The tokenizer is identified (core/tokens/identity.py) by the ids of a fixed probe text with
the template's special tokens in it, checked against the vocabulary like every id the server
gives. A generation prompt that ends inside an open `<think>` (Qwen3's thinking templates,
DeepSeek-R1's) makes the output parser start in reasoning.

Until this succeeds the token path is not ready (upstream/token_replicas.py: every replica is
probed): `/readyz` answers 503 with the reason, turns fail with `upstream_not_ready`, and the
probe is tried again every few seconds. Nothing falls back to text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp

from ..config import UpstreamSettings
from ..core import wire
from ..core.errors import UpstreamError
from ..core.sse import SSEDecoder
from ..core.tokens.dialect import TokenSetup
from ..core.tokens.engine import LlamaCppEngine, Sampling, TokenEngine
from ..core.tokens.formats import closing, markers, parser_for, resolve
from ..core.tokens.identity import out_of_vocab, tokenizer_digest, vocabulary
from ..core.tokens.parsers import THINK_CLOSE, THINK_OPEN
from ..core.tokens.sglang import SglangEngine
from ..core.tokens.template import ChatTemplate, TemplateFailed
from ..core.tokens.vllm import VllmEngine
from ..core.urls import redact_url, server_root
from .client import UpstreamClient
from .failures import describe
from .harmony_vocab import HarmonyUnavailable, harmony_encoding

PROBE_TIMEOUT = 5.0  # seconds per request of the probe
_JSON = {"Content-Type": "application/json"}
# the text whose ids identify the tokenizer, after the probe conversation's rendering (which
# brings the template's special tokens): words, digits, spacing, accents and other scripts
PROBE_TEXT = " Tokenizer probe: Hello, wörld! 0123456789\n\t  ça, 日本語, ελληνικά, 🙂."
_PROBE = [{"role": "user", "content": "hi"}]


class NotReady(Exception):
    """Why the token path cannot start yet (shown in /readyz and in turns' errors).
    `answered`: the server answered, and what it answered will not do (not merely down)."""

    def __init__(self, message: str, *, answered: bool = True) -> None:
        super().__init__(message)
        self.answered = answered


async def _fetch(client: UpstreamClient, url: str, body: bytes | None = None) -> tuple[int, bytes]:
    """`GET url`, or `POST` `body` as JSON: its status and body. Raises NotReady when the
    server does not answer in time."""
    assert client.session is not None
    timeout = aiohttp.ClientTimeout(total=min(PROBE_TIMEOUT, client.settings.connect_timeout))
    method, headers = ("GET", None) if body is None else ("POST", _JSON)
    try:
        async with client.session.request(
            method, url, data=body, headers=headers, timeout=timeout
        ) as resp:
            return resp.status, await resp.read()
    except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as exc:
        message = f"{redact_url(url)} did not answer ({describe(exc)})"
        raise NotReady(message, answered=False) from None


async def _get(client: UpstreamClient, url: str) -> dict[str, Any] | None:
    """The JSON object `GET url` answers with 200, else None."""
    status, body = await _fetch(client, url)
    if status != 200:
        return None
    try:
        doc = wire.loads(body)
    except wire.JSONDecodeError:
        return None
    return doc if isinstance(doc, dict) else None


async def _engine(
    client: UpstreamClient, root: str, choice: str
) -> tuple[TokenEngine, dict[str, Any]]:
    """The engine at `root` and what it said about itself."""
    if choice in ("auto", "llamacpp"):
        props = await _get(client, root + "/props")
        if props is not None and "default_generation_settings" in props:
            return LlamaCppEngine(), props
        if choice == "llamacpp":
            raise NotReady(f"{redact_url(root)}/props is not llama.cpp's")
    if choice in ("auto", "sglang"):
        info = await _get(client, root + "/get_model_info")
        if info is not None and "model_path" in info:
            # its server arguments say whether /generate streams deltas or all so far
            args = await _get(client, root + "/get_server_info") or {}
            incremental = args.get("incremental_streaming_output") is True
            return SglangEngine(incremental=incremental), {**args, **info}
        if choice == "sglang":
            raise NotReady(f"{redact_url(root)}/get_model_info is not SGLang's")
    if choice in ("auto", "vllm"):
        version = await _get(client, root + "/version")
        if version is not None and "version" in version:
            return VllmEngine(), version
        if choice == "vllm":
            raise NotReady(f"{redact_url(root)}/version is not vLLM's")
    raise NotReady(
        f"{redact_url(root)} is none of the token engines (llama.cpp /props, SGLang "
        "/get_model_info, vLLM /version); point upstream.url at one, or use api = chat"
    )


async def _served_model(client: UpstreamClient, base: str) -> tuple[str | None, int]:
    """The model `GET /v1/models` lists first, and its vocabulary size when the server says
    (llama.cpp: `meta.n_vocab`; 0 otherwise)."""
    try:
        doc = await _get(client, base.rstrip("/") + "/models")
    except NotReady:
        return None, 0
    data = doc.get("data") if doc else None
    first = data[0] if isinstance(data, list) and data and isinstance(data[0], dict) else {}
    meta = first.get("meta")
    n = meta.get("n_vocab") if isinstance(meta, dict) else None
    name = first.get("id")
    return (name if isinstance(name, str) else None), (n if wire.is_int(n) else 0)


class _Server:
    """One server's tokenize endpoint, its answers checked against its vocabulary."""

    def __init__(self, client: UpstreamClient, root: str, engine: TokenEngine, vocab: int) -> None:
        self.client, self.root, self.engine, self.vocab = client, root, engine, vocab

    async def tokenize(self, text: str, *, add_special: bool = False) -> list[int]:
        url = self.root + self.engine.tokenize_path
        body = self.engine.tokenize_body(text, add_special=add_special)
        status, answer = await _fetch(self.client, url, body)
        if status != 200:
            raise NotReady(f"{redact_url(url)} answered {status}")
        try:
            ids = self.engine.tokenize_ids(answer)
        except UpstreamError as exc:
            raise NotReady(f"{redact_url(url)}: {exc.message}") from None
        if (bad := out_of_vocab(ids, self.vocab)) is not None:
            raise NotReady(
                f"{redact_url(url)} answered token id {bad}, outside {vocabulary(self.vocab)}"
            )
        return ids


def _generation_prompt(template: ChatTemplate) -> str:
    """What the template writes to ask for the model's turn ("" when it cannot tell)."""
    try:
        with_prompt = template.render(_PROBE, add_generation_prompt=True)
        without = template.render(_PROBE, add_generation_prompt=False)
    except TemplateFailed:
        return ""
    if not with_prompt.startswith(without):
        return ""
    return with_prompt[len(without) :]


def opens_think(template: ChatTemplate) -> bool:
    """Whether the generation prompt ends inside an open think block, so the model's output
    starts as reasoning (Qwen3-Thinking writes `<|im_start|>assistant\n<think>\n`)."""
    prompt = _generation_prompt(template)
    return prompt.rfind(THINK_OPEN) > prompt.rfind(THINK_CLOSE)


async def _turn_marker(server: _Server, template: ChatTemplate) -> tuple[str, int] | None:
    """The special token a turn starts with, as text and id: the first token of the
    generation prompt (`<start_of_turn>model\n` starts with `<start_of_turn>`), found as the
    longest start of it that the server tokenises to that one id. None when there is none
    (a template whose turns start with plain text): a turn's ids are then kept whole."""
    prompt = _generation_prompt(template)[:64]
    if not prompt:
        return None
    ids = await server.tokenize(prompt)
    if not ids:
        return None
    for n in range(len(prompt), 0, -1):
        if await server.tokenize(prompt[:n]) == [ids[0]]:
            return prompt[:n], ids[0]
    return None


async def _single_token_tags(server: _Server, tags: tuple[str, ...]) -> dict[int, str]:
    """The parser's tags that the server's vocabulary has as one token each, by id."""
    found: dict[int, str] = {}
    for tag in tags:
        ids = await server.tokenize(tag)
        if len(ids) == 1:
            found[ids[0]] = tag
    return found


async def _probe_ids(server: _Server, template: ChatTemplate) -> list[int]:
    """The ids of the probe conversation, rendered and followed by `PROBE_TEXT`, tokenised
    as the start of a prompt: what identifies the tokenizer."""
    try:
        rendered = template.render(_PROBE, add_generation_prompt=True)
    except TemplateFailed:
        rendered = ""
    return await server.tokenize(rendered + PROBE_TEXT, add_special=True)


async def _generates(server: _Server, prompt: list[int], model: str | None) -> None:
    """One generate request of one token, as a turn sends it, read as a turn reads it.
    Raises NotReady when the endpoint is not there or its answer will not do."""
    engine = server.engine
    url = server.root + engine.generate_path
    sampling = Sampling(model=model, max_tokens=1)
    status, body = await _fetch(
        server.client, url, engine.generate_body(wire.dumps(prompt), sampling)
    )
    if status == 404 and isinstance(engine, VllmEngine):
        raise NotReady(
            f"{redact_url(url)} answered 404: vLLM serves its token endpoint only when started "
            "with --enable-scale-out"
        )
    if status != 200:
        raise NotReady(f"{redact_url(url)} answered {status}: {_message(body)}")
    stream, decoder = engine.stream(), SSEDecoder(server.client.settings.max_event_bytes)
    try:
        for event in decoder.feed(body):
            if stream.feed(event).finish is not None:
                return
        stream.eof()
    except UpstreamError as exc:
        raise NotReady(f"{redact_url(url)}: {exc.message}") from None


def _message(body: bytes) -> str:
    """An error answer's message, briefly."""
    try:
        doc = wire.loads(body)
    except wire.JSONDecodeError:
        return body[:200].decode(errors="replace")
    err = doc.get("error", doc) if isinstance(doc, dict) else doc
    found = err.get("message") or err.get("detail") if isinstance(err, dict) else None
    return str(found or doc)[:200]


async def setup(client: UpstreamClient, settings: UpstreamSettings, base: str) -> TokenSetup:
    """The token path's setup from the server at `base`. Raises NotReady."""
    root = server_root(base)
    engine, said = await _engine(client, root, settings.token_engine)
    source, where = "", ""
    if settings.chat_template_file:
        where = settings.chat_template_file
        source = Path(where).read_text(encoding="utf-8")
    elif isinstance(said.get("chat_template"), str) and said["chat_template"]:
        source, where = said["chat_template"], f"{redact_url(root)}/props"
    if not source:
        raise NotReady(
            f"the {engine.name} server reports no chat template: set upstream.chat_template_file"
        )

    def token(key: str) -> str:
        value = said.get(key)
        return value if isinstance(value, str) else ""

    try:
        template = ChatTemplate(
            source, name=where, bos_token=token("bos_token"), eos_token=token("eos_token")
        )
    except ValueError as exc:
        raise NotReady(str(exc)) from None
    gen = said.get("default_generation_settings")
    n_ctx = gen.get("n_ctx") if isinstance(gen, dict) else None
    model, vocab = await _served_model(client, base)
    server = _Server(client, root, engine, vocab)
    probe_ids = await _probe_ids(server, template)
    if isinstance(engine, VllmEngine):  # the one engine whose generate route may be missing
        await _generates(server, probe_ids, model)
    tool_format = resolve(settings.tool_format, source)  # once, not per response
    thinking = opens_think(template)
    harmony = None
    if tool_format == "harmony":
        try:
            harmony = await harmony_encoding()
        except HarmonyUnavailable as exc:
            raise NotReady(str(exc)) from None
    return TokenSetup(
        engine=engine,
        template=template,
        parser=lambda: parser_for(tool_format, source, starts_in_think=thinking, harmony=harmony),
        vocab_size=vocab,
        context_window=n_ctx if wire.is_int(n_ctx) else 0,
        model=model,
        turn_end=template.turn_end(),
        turn_marker=await _turn_marker(server, template),
        tags=await _single_token_tags(server, markers(tool_format, source)),
        tokenizer=tokenizer_digest(probe_ids),
        starts_in_think=thinking,
        closing=closing(tool_format, source),
    )


__all__ = ["PROBE_TEXT", "NotReady", "opens_think", "setup"]

"""The token path's start-up (docs/tokens.md "Start-up"): which engine the server is, its
chat template and special tokens, its vocabulary and context window.

`upstream.token_engine = "auto"` asks the server's root in turn: llama.cpp answers
`GET /props` (with `default_generation_settings`), SGLang `GET /get_model_info` (with
`model_path`), vLLM `GET /version`. The template is `upstream.chat_template_file`, else the
one llama.cpp reports in `/props`; vLLM and SGLang report none, so they need the file. Until
this succeeds the token path is not ready: `/readyz` answers 503 with the reason, turns fail
with `upstream_not_ready`, and the probe is tried again every few seconds. Nothing falls back
to text.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import aiohttp

from ..config import UpstreamSettings
from ..core import wire
from ..core.errors import UpstreamError
from ..core.tokens.dialect import TokenDialect, TokenSetup
from ..core.tokens.engine import LlamaCppEngine, TokenEngine
from ..core.tokens.formats import closing, detect_format, markers, parser_for
from ..core.tokens.sglang import SglangEngine
from ..core.tokens.template import ChatTemplate, TemplateFailed
from ..core.tokens.vllm import VllmEngine
from ..core.urls import redact_url, server_root
from .client import UpstreamClient, describe
from .harmony_vocab import HarmonyUnavailable, harmony_encoding

log = logging.getLogger("wsmode.upstream")

PROBE_TIMEOUT = 5.0  # seconds per request of the probe
RETRY_SECONDS = 3.0  # between attempts while the server is not there
_JSON = {"Content-Type": "application/json"}


class NotReady(Exception):
    """Why the token path cannot start yet (shown in /readyz and in turns' errors)."""


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
        raise NotReady(f"{redact_url(url)} did not answer ({describe(exc)})") from None


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


async def _tokenize(client: UpstreamClient, root: str, engine: TokenEngine, text: str) -> list[int]:
    url = root + engine.tokenize_path
    status, body = await _fetch(client, url, engine.tokenize_body(text))
    if status != 200:
        raise NotReady(f"{redact_url(url)} answered {status}")
    try:
        return engine.tokenize_ids(body)
    except UpstreamError as exc:
        raise NotReady(f"{redact_url(url)}: {exc.message}") from None


async def _turn_marker(
    client: UpstreamClient, root: str, engine: TokenEngine, template: ChatTemplate
) -> tuple[str, int] | None:
    """The special token a turn starts with, as text and id: the first token of the
    generation prompt (`<start_of_turn>model\n` starts with `<start_of_turn>`), found as the
    longest start of it that the server tokenises to that one id. None when there is none
    (a template whose turns start with plain text): a turn's ids are then kept whole."""
    probe = [{"role": "user", "content": "hi"}]
    try:
        with_prompt = template.render(probe, add_generation_prompt=True)
        without = template.render(probe, add_generation_prompt=False)
    except TemplateFailed:
        return None
    if not with_prompt.startswith(without) or len(with_prompt) == len(without):
        return None
    prompt = with_prompt[len(without) :][:64]
    ids = await _tokenize(client, root, engine, prompt)
    if not ids:
        return None
    for n in range(len(prompt), 0, -1):
        if await _tokenize(client, root, engine, prompt[:n]) == [ids[0]]:
            return prompt[:n], ids[0]
    return None


async def _single_token_tags(
    client: UpstreamClient, root: str, engine: TokenEngine, tags: tuple[str, ...]
) -> dict[int, str]:
    """The parser's tags that the server's vocabulary has as one token each, by id."""
    found: dict[int, str] = {}
    for tag in tags:
        ids = await _tokenize(client, root, engine, tag)
        if len(ids) == 1:
            found[ids[0]] = tag
    return found


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
    tool_format = settings.tool_format
    harmony = None
    if tool_format == "harmony" or (tool_format == "auto" and detect_format(source) == "harmony"):
        try:
            harmony = await harmony_encoding()
        except HarmonyUnavailable as exc:
            raise NotReady(str(exc)) from None
    return TokenSetup(
        engine=engine,
        template=template,
        parser=lambda: parser_for(tool_format, source, harmony=harmony),
        vocab_size=vocab,
        context_window=n_ctx if wire.is_int(n_ctx) else 0,
        model=model,
        turn_end=template.turn_end(),
        turn_marker=await _turn_marker(client, root, engine, template),
        tags=await _single_token_tags(client, root, engine, markers(tool_format, source)),
        closing=closing(tool_format, source),
    )


async def prepare(
    client: UpstreamClient, settings: UpstreamSettings, dialect: TokenDialect, base: str
) -> None:
    """Probe until the token path is ready (the task is cancelled at shutdown)."""
    attempt = 0
    while True:
        try:
            found = await setup(client, settings, base)
        except NotReady as exc:
            dialect.not_ready = str(exc)
            if attempt == 0:
                log.error("the token path is not ready: %s (trying again)", exc)
            attempt += 1
            await asyncio.sleep(RETRY_SECONDS)
            continue
        dialect.ready(found)
        log.info(
            "token path: %s at %s (template %s, vocabulary %s, context %s, tool format %s)",
            found.engine.name,
            redact_url(server_root(base)),
            found.template.name,
            found.vocab_size or "unknown",
            found.context_window or "unknown",
            settings.tool_format,
        )
        return


__all__ = ["NotReady", "prepare", "setup"]

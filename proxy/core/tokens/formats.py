"""Which output parser a response gets: `upstream.tool_format` (docs/tokens.md "Parsing the
output"), or the format its chat template writes when that is "auto". The parsers are in
parsers.py (Hermes, none), parsers_json.py (Mistral, Llama 3) and harmony.py (gpt-oss)."""

from __future__ import annotations

from typing import Any

from .harmony import HARMONY_ENDS, HARMONY_TAGS, HarmonyParser
from .parsers import (
    CALL_CLOSE,
    CALL_OPEN,
    THINK_CLOSE,
    THINK_OPEN,
    HermesParser,
    NoToolsParser,
    OutputParser,
)
from .parsers_json import (
    ARGS,
    CALL_ID,
    MISTRAL_THINK_CLOSE,
    MISTRAL_THINK_OPEN,
    PYTHON_TAG,
    TOOL_CALLS,
    Llama3Parser,
    MistralParser,
)

TOOL_FORMATS = ("auto", "hermes", "mistral", "llama3", "harmony", "none")


def parser_for(
    tool_format: str,
    template_source: str,
    *,
    starts_in_think: bool = False,
    harmony: Any = None,
) -> OutputParser:
    """A new parser for one response. `tool_format` is one of `TOOL_FORMATS`; "auto" reads
    the chat template (its Jinja source), see `detect_format`. Think blocks are recognised
    in every format but harmony (a model that never writes them loses nothing);
    `starts_in_think` as for `HermesParser`. `harmony` is the loaded gpt-oss encoding the
    harmony format needs (upstream/harmony_vocab.py)."""
    if tool_format not in TOOL_FORMATS:
        raise ValueError(f"tool_format must be one of {', '.join(TOOL_FORMATS)}: {tool_format!r}")
    tool_format = resolve(tool_format, template_source)
    if tool_format == "harmony":
        if harmony is None:
            raise ValueError("the harmony format needs its encoding loaded")
        return HarmonyParser(harmony)
    if tool_format == "hermes":
        return HermesParser(starts_in_think=starts_in_think)
    if tool_format == "mistral":
        return MistralParser(starts_in_think=starts_in_think)
    if tool_format == "llama3":
        return Llama3Parser(starts_in_think=starts_in_think)
    return NoToolsParser(starts_in_think=starts_in_think)


def resolve(tool_format: str, template_source: str) -> str:
    """`tool_format` itself, or for "auto" the format the template writes (`detect_format`):
    a caller that makes many parsers resolves it once."""
    return detect_format(template_source) if tool_format == "auto" else tool_format


def detect_format(template_source: str) -> str:
    """The tool format a chat template writes, tried in this order: "harmony" when it
    mentions `<|channel|>` (gpt-oss); "mistral" when it mentions `[TOOL_CALLS]`; "llama3"
    when it mentions `<|python_tag|>`, or `"parameters"` together with the `ipython` role (a
    Llama 3 template that never writes the tag); "hermes" when it mentions `<tool_call>`;
    else "none"."""
    if "<|channel|>" in template_source:
        return "harmony"
    if "[TOOL_CALLS]" in template_source:
        return "mistral"
    if "<|python_tag|>" in template_source or (
        '"parameters"' in template_source and "ipython" in template_source
    ):
        return "llama3"
    if CALL_OPEN in template_source:
        return "hermes"
    return "none"


def markers(tool_format: str, template_source: str) -> tuple[str, ...]:
    """The tags a format's parser reads. A server may leave special tokens out of the text it
    streams (llama.cpp without `--special`, vLLM and SGLang skipping special tokens), so the
    token stream writes back those that are one token each, from the ids (dialect.py)."""
    tool_format = resolve(tool_format, template_source)
    think = (THINK_OPEN, THINK_CLOSE)
    if tool_format == "harmony":
        return HARMONY_TAGS
    if tool_format == "mistral":
        return (TOOL_CALLS, ARGS, CALL_ID, MISTRAL_THINK_OPEN, MISTRAL_THINK_CLOSE, *think)
    if tool_format == "llama3":
        return (PYTHON_TAG, *think)
    if tool_format == "hermes":
        return (CALL_OPEN, CALL_CLOSE, *think)
    return think


def closing(tool_format: str, template_source: str) -> tuple[str, ...]:
    """The special tokens that end a model's turn inside its own generation (harmony's
    `<|call|>`, `<|return|>`, `<|end|>`): a generation ending with one needs no turn end
    after it in the history (chain.py `continue_from`). None for the other formats, whose
    template writes the turn's end after the generation."""
    tool_format = resolve(tool_format, template_source)
    return HARMONY_ENDS if tool_format == "harmony" else ()


__all__ = ["TOOL_FORMATS", "closing", "detect_format", "markers", "parser_for", "resolve"]

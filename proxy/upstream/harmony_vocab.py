"""Loading gpt-oss's harmony encoding for the token path's output parser (core/tokens/harmony.py).

`openai-harmony` (the optional extra `wsmode[harmony]`) reads the o200k vocabulary from the
file `o200k_base.tiktoken`: from the folder in `TIKTOKEN_ENCODINGS_BASE` when that is set,
else it downloads the file once into its cache. A proxy that cannot reach the internet gets
the file beforehand (docs/tokens.md "gpt-oss"). The load reads and checks the whole file
(a second or two), so it runs once, off the event loop, when the token path is set up.
"""

from __future__ import annotations

import asyncio
from typing import Any


class HarmonyUnavailable(Exception):
    """The harmony format was chosen, but its package or vocabulary is missing."""


def _load() -> Any:
    try:
        import openai_harmony
    except ImportError:
        raise HarmonyUnavailable(
            "upstream.tool_format harmony (gpt-oss) needs the openai-harmony package:"
            " pip install 'wsmode[harmony]'"
        ) from None
    try:
        return openai_harmony.load_harmony_encoding(
            openai_harmony.HarmonyEncodingName.HARMONY_GPT_OSS
        )
    except openai_harmony.HarmonyError as exc:
        raise HarmonyUnavailable(
            f"openai-harmony could not load gpt-oss's vocabulary ({exc}): put o200k_base.tiktoken"
            " in a folder and point TIKTOKEN_ENCODINGS_BASE at it (docs/tokens.md)"
        ) from None


_loaded: Any = None


async def harmony_encoding() -> Any:
    """The gpt-oss encoding, loaded once per process. Raises HarmonyUnavailable."""
    global _loaded
    if _loaded is None:
        _loaded = await asyncio.to_thread(_load)
    return _loaded

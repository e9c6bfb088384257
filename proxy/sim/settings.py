"""The simulated model's settings (`[sim]`): plain data, so the config loader can name them
without importing the simulated server (and aiohttp)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SimSettings:
    ttft_ms: float = 50.0
    tokens_per_second: float = 1000.0  # 0 streams as fast as possible
    output_tokens: int = 60
    seed: int = 0
    tool_calls_per_turn: int = 1
    output_items: int = 1  # assistant messages a text answer is split over
    context_window: int = 0  # tokens; a larger input gets 400 context_length_exceeded
    # POST /v1/moderations flags an input containing this word (case-insensitive); "" never
    moderation_flag_word: str = "forbidden"
    moderation_delay_ms: float = 0.0  # how long the moderation endpoint takes to answer

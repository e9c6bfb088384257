"""The simulated model's settings (`[sim]`): plain data, so the config loader can name them
without importing the simulated server (and aiohttp)."""

from __future__ import annotations

from dataclasses import dataclass

TOKEN_SERVERS = ("all", "llamacpp", "vllm", "sglang")
TOKENIZERS = ("pairs", "chars")


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
    # ---- prefix cache (sim/prefix_cache.py): cached prompt tokens, prefill time for the rest
    prefill_tokens_per_second: float = 0.0  # per process, one prefill at a time; 0: no delay
    prefix_cache_tokens: int = 0  # the LRU's capacity in tokens; 0: no cache
    prefix_cache_block_tokens: int = 16  # tokens per cached block (vLLM's default)
    # ---- the token endpoints (sim/tokens.py): llama.cpp's, vLLM's and SGLang's
    # CPU time burnt per token whenever the sim tokenises text (a tokenize endpoint, a
    # string prompt, and the whole history of a /v1/responses or /v1/chat/completions
    # request), per token of sim/model.py's counting tokenizer (4 bytes) everywhere
    tokenize_us_per_token: float = 0.0
    # SGLang's `--incremental-streaming-output`: streamed text and ids are deltas, not the
    # whole output so far
    sglang_incremental_output: bool = False
    # whose token routes it answers (sim/token_apis.py): "all" (every engine's, llama.cpp's
    # `/props` among them, so `token_engine = "auto"` finds llama.cpp), or only those of
    # "llamacpp", "vllm" or "sglang", with that server's `/v1/models`
    token_server: str = "all"
    vllm_scale_out: bool = True  # vLLM's `--enable-scale-out`: False, no /inference/v1/generate
    # vLLM's `output_mode`: False, a vLLM that predates it (ids only, nothing echoed)
    vllm_output_mode: bool = True
    # its tokenizer (sim/vocab.py): "pairs" (two ASCII characters a token) or "chars" (one
    # character a token), the same vocabulary tokenised otherwise: another model's tokenizer
    tokenizer: str = "pairs"
    # words of reasoning the token endpoints' answers open with, as `<think>...</think>`
    # (a reasoning model, Qwen3 say); 0: none
    think_words: int = 0

    def __post_init__(self) -> None:
        if self.token_server not in TOKEN_SERVERS:
            raise ValueError(f"sim.token_server must be one of {', '.join(TOKEN_SERVERS)}")
        if self.tokenizer not in TOKENIZERS:
            raise ValueError(f"sim.tokenizer must be one of {', '.join(TOKENIZERS)}")
        if self.prefill_tokens_per_second < 0 or self.prefix_cache_tokens < 0:
            raise ValueError(
                "sim.prefill_tokens_per_second and sim.prefix_cache_tokens must not be negative"
            )
        if self.tokenize_us_per_token < 0:
            raise ValueError("sim.tokenize_us_per_token must not be negative")
        if self.think_words < 0:
            raise ValueError("sim.think_words must not be negative")
        if self.prefix_cache_block_tokens < 1:
            raise ValueError("sim.prefix_cache_block_tokens must be at least 1")

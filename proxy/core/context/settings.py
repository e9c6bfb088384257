"""The settings of the context manager: the config's [tokens] and [compaction] sections.

These classes *are* the config sections (proxy/config.py imports them), so each default is
written once and each field name is its config key (`[tokens] output_reserve`,
`WSMODE_TOKENS_OUTPUT_RESERVE`, `--set tokens.output_reserve=...`). Checks that need only one
section run on construction and raise `ValueError`; the config loader reports them as
`ConfigError` with the same message.

Some keys serve the adapters, not the manager: `tokens.tokenize_url` and
`tokens.max_pending_jobs` (proxy/upstream/tokenizer.py), `compaction.enabled` and
`compaction.key` (proxy/build.py). They stay here because a section is one table.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .sealing import decode_key

MiB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class TokensSettings:
    # "auto": POST /tokenize at the upstream URL's origin (llama.cpp, vLLM); "": estimates
    # only; or a full URL
    tokenize_url: str = "auto"
    bytes_per_token: float = 4.0  # the estimate without a tokenizer
    output_reserve: int = 1024  # kept free for output under truncation "auto"
    max_pending_jobs: int = 1024  # tokenizer jobs waiting; beyond, estimates stay

    def __post_init__(self) -> None:
        url = self.tokenize_url
        if url not in ("", "auto") and not url.startswith(("http://", "https://")):
            raise ValueError('tokens.tokenize_url must be "", "auto" or an http(s) URL')
        if self.bytes_per_token <= 0:
            raise ValueError("tokens.bytes_per_token must be positive")
        if self.output_reserve < 0 or self.max_pending_jobs < 0:
            raise ValueError(
                "tokens.output_reserve and tokens.max_pending_jobs must not be negative"
            )

    @property
    def tokenize(self) -> bool:
        """The upstream has a tokenizer: the manager hands out CountTokens jobs."""
        return bool(self.tokenize_url)


@dataclass(frozen=True, slots=True)
class CompactionSettings:
    enabled: bool = True  # false: context_management and /responses/compact go upstream as-is
    # standard base64 of 32 bytes; empty: generated at start-up (not kept). A secret:
    # check-config shows a marker (config.SECRET is this metadata; core does not import config)
    key: str = field(default="", metadata={"secret": True})
    keep_recent_fraction: float = 0.25  # of the threshold, kept verbatim after compacting
    summary_max_output_tokens: int = 2048
    expansion_cache_bytes: int = 64 * MiB  # opened compaction items kept in memory
    # response.compaction.compacting while a compaction_trigger's summary runs
    progress_events: bool = True

    def __post_init__(self) -> None:
        if not 0 <= self.keep_recent_fraction < 1:
            raise ValueError("compaction.keep_recent_fraction must be at least 0 and below 1")
        if self.summary_max_output_tokens < 1:
            raise ValueError("compaction.summary_max_output_tokens must be positive")
        if self.key:
            try:
                decode_key(self.key)
            except ValueError as exc:
                raise ValueError(f"compaction.key: {exc}") from None


@dataclass(frozen=True, slots=True)
class ContextSettings:
    """What the manager reads, from three places in the config: the [tokens] and
    [compaction] sections as they are, and `upstream.context_window` (a fact about the
    upstream, so it stays in [upstream]). Holding the sections themselves, rather than a
    copy of their fields, keeps one default per key."""

    tokens: TokensSettings = field(default_factory=TokensSettings)
    compaction: CompactionSettings = field(default_factory=CompactionSettings)
    context_window: int = 0  # tokens; 0 = unknown (no truncation, no overflow check)

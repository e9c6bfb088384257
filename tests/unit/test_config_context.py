"""Settings of compaction and context windows: [tokens], [compaction], upstream.context_window."""

from __future__ import annotations

import base64

import pytest
from wsmode.build import build_context
from wsmode.config import ConfigError, load_settings
from wsmode.upstream.tokenizer import tokenize_url

KEY = base64.b64encode(bytes(range(32))).decode()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"compaction.key": "%%%"}, "compaction.key: the key is not standard base64"),
        ({"compaction.key": bytes(range(32)).hex()}, "compaction.key: the key looks like 64 hex"),
        ({"compaction.key": base64.b64encode(bytes(8)).decode()}, "compaction.key: the key must"),
        ({"compaction.keep_recent_fraction": 1.0}, "keep_recent_fraction"),
        ({"compaction.summary_max_output_tokens": 0}, "summary_max_output_tokens"),
        ({"tokens.tokenize_url": "ftp://x"}, "tokens.tokenize_url"),
        ({"tokens.bytes_per_token": 0}, "bytes_per_token must be positive"),
        ({"tokens.output_reserve": -1}, "must not be negative"),
        ({"upstream.context_window": -5}, "must not be negative"),
    ],
)
def test_bad_settings(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_settings(None, {}, overrides)


def test_environment_names() -> None:
    s = load_settings(
        None,
        {
            "WSMODE_COMPACTION_KEY": KEY,
            "WSMODE_UPSTREAM_CONTEXT_WINDOW": "32768",
            "WSMODE_TOKENS_TOKENIZE_URL": "",
        },
    )
    assert s.compaction.key == KEY and s.upstream.context_window == 32768
    assert s.tokens.tokenize_url == ""


def test_build_context() -> None:
    s = load_settings(None, {}, {"compaction.key": KEY, "upstream.context_window": 9000})
    ctx = build_context(s)
    assert ctx is not None and ctx.settings.context_window == 9000 and ctx.tokenize
    assert build_context(load_settings(None, {}, {"compaction.enabled": False})) is None
    no_tokenizer = build_context(load_settings(None, {}, {"tokens.tokenize_url": ""}))
    assert no_tokenizer is not None and not no_tokenizer.tokenize


def test_tokenize_url() -> None:
    assert tokenize_url("auto", "http://127.0.0.1:8081/v1") == "http://127.0.0.1:8081/tokenize"
    assert tokenize_url("auto", "http://h/llama/v1/") == "http://h/llama/tokenize"
    assert tokenize_url("http://t:9/tok", "http://h/v1") == "http://t:9/tok"

"""Settings: the example file documents every key, and precedence is defaults < file < env <
flags."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest
from wsmode.config import ConfigError, Settings, load_settings
from wsmode.core.context.settings import CompactionSettings, TokensSettings
from wsmode.core.dialects.chat_request import ChatOptions
from wsmode.core.policy import SessionLimits

EXAMPLE = Path(__file__).parents[2] / "config" / "wsmode.example.toml"


def test_example_documents_every_key_with_its_default() -> None:
    doc = tomllib.loads(EXAMPLE.read_text())
    defaults = Settings()
    for section in dataclasses.fields(Settings):
        table = doc[section.name]
        obj = getattr(defaults, section.name)
        names = {f.name for f in dataclasses.fields(obj)}
        assert set(table) == names, f"[{section.name}] keys differ from the settings"
        for key in names:
            value = getattr(obj, key)
            value = list(value) if isinstance(value, tuple) else value
            assert table[key] == value, f"{section.name}.{key} default differs"
    assert load_settings(EXAMPLE) == defaults


def test_sections_the_core_reads_are_the_core_classes() -> None:
    """One class per section, so each default is written once and build.py copies nothing."""
    s = load_settings(None, {"WSMODE_LIMITS_MAX_ACTIVE_PER_CONNECTION": "3"})
    assert type(s.limits) is SessionLimits and s.limits.max_active_per_connection == 3
    assert type(s.chat) is ChatOptions and type(s.tokens) is TokensSettings
    assert type(s.compaction) is CompactionSettings
    with pytest.raises(ConfigError, match=r"chat\.system_role must be system or developer"):
        load_settings(None, {}, {"chat.system_role": "user"})


def test_precedence_file_env_flags(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[server]\nport = 1000\nhost = "0.0.0.0"\n[upstream]\nread_timeout = 5\n')
    env = {"WSMODE_PORT": "2000", "WSMODE_UPSTREAM_READ_TIMEOUT": "7.5"}
    s = load_settings(path, env, {"server.port": 3000})
    assert s.server.port == 3000 and s.server.host == "0.0.0.0"
    assert s.upstream.read_timeout == 7.5
    s = load_settings(path, env, {"server.port": None})
    assert s.server.port == 2000


def test_env_aliases_and_generic_names() -> None:
    env = {
        "WSMODE_HOST": "::1",
        "WSMODE_UPSTREAM": "http://127.0.0.1:9000/v1",
        "WSMODE_SERVER_COMPRESSION": "true",
        "WSMODE_CACHE_CONNECTION_MAX_ENTRIES": "7",
    }
    s = load_settings(None, env)
    assert s.server.host == "::1" and s.upstream.url == "http://127.0.0.1:9000/v1"
    assert s.server.compression is True and s.cache.connection_max_entries == 7


@pytest.mark.parametrize(
    ("text", "env", "message"),
    [
        ("[nope]\na = 1\n", {}, "unknown config section [nope]"),
        ("[server]\nprot = 1\n", {}, "unknown config key server.prot"),
        ("[server]\nport = 'x'\n", {}, "server.port: expected int"),
        ("", {"WSMODE_SERVER_PORT": "eighty"}, "server.port: expected int"),
        ("", {"WSMODE_BOGUS_KEY": "1"}, "unknown environment variable WSMODE_BOGUS_KEY"),
        ("[upstream]\nurl = 'ftp://x'\n", {}, "upstream.url must start with"),
        ("[upstream]\napi = 'grpc'\n", {}, "upstream.api must be one of"),
        ("[server]\nport = 70000\n", {}, "server.port must be between"),
        ("[cache]\nconnection_max_bytes = -1\n", {}, "must not be negative"),
        ("[sidecar]\nupstream = 'ws://x/v1'\n", {}, "sidecar.upstream must start with"),
        ("[sidecar]\nport = 70000\n", {}, "sidecar.port must be between"),
        ("[sidecar]\nmax_connections = 0\n", {}, "sidecar.max_connections must be at least 1"),
        ("", {"WSMODE_SIDECAR_IDLE_TIMEOUT": "-1"}, "must not be negative"),
        (
            "[limits]\nmax_queued_bytes_per_connection = 1000\n",
            {},
            "limits.max_queued_bytes_per_connection must be at least server.max_message_bytes",
        ),
        (
            "[limits]\nprocess_max_bytes = 1000\n",
            {},
            "limits.process_max_bytes must be at least server.max_message_bytes",
        ),
    ],
)
def test_bad_config_is_an_error(
    tmp_path: Path, text: str, env: dict[str, str], message: str
) -> None:
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_settings(path, env)


def test_sidecar_settings_from_env_and_flags() -> None:
    env = {"WSMODE_SIDECAR_UPSTREAM": "https://api.example.com/v1", "WSMODE_SIDECAR_PORT": "9"}
    s = load_settings(None, env, {"sidecar.port": 9999, "sidecar.max_connections": 4})
    assert s.sidecar.upstream == "https://api.example.com/v1"
    assert s.sidecar.port == 9999 and s.sidecar.max_connections == 4
    assert s.server.port == 8080  # `wsmode serve` settings are separate


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_settings(tmp_path / "missing.toml")

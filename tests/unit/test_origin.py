"""The Origin and Host policy's pure parts: normal forms, loopback names, config checks."""

from __future__ import annotations

import pytest
from wsmode.config import ConfigError, load_settings
from wsmode.ops.origin import SitePolicy, host_name, is_loopback, normalize_origin


@pytest.mark.parametrize(
    ("given", "normal"),
    [
        ("https://A.Example", "https://a.example"),
        ("https://a.example:443/", "https://a.example"),
        ("http://localhost:5173", "http://localhost:5173"),
        ("http://[::1]:80", "http://[::1]"),
        ("null", "null"),
        ("http://a.example:99999", "http://a.example:99999"),  # not an origin: matches nothing
    ],
)
def test_normalize_origin(given: str, normal: str) -> None:
    assert normalize_origin(given) == normal


@pytest.mark.parametrize(
    ("header", "name", "loopback"),
    [
        ("localhost:8080", "localhost", True),
        ("app.localhost", "app.localhost", True),
        ("127.0.0.2:1", "127.0.0.2", True),
        ("[::1]:8080", "::1", True),
        ("attacker.example.", "attacker.example", False),
        ("127.0.0.1.nip.io", "127.0.0.1.nip.io", False),
        ("10.0.0.1", "10.0.0.1", False),
    ],
)
def test_host_names(header: str, name: str, loopback: bool) -> None:
    assert host_name(header) == name
    assert is_loopback(name) is loopback


def test_wildcards() -> None:
    s = load_settings(None, {}, {"server.cors_origins": "*", "server.allowed_hosts": "*"})
    site = SitePolicy.from_settings(s.server)
    assert site.refusal({"Origin": "https://any.example", "Host": "x.example"}, "POST") is None
    assert site.cors_headers({"Origin": "https://any.example"})["Vary"] == "Origin"


@pytest.mark.parametrize("bad", ["evil.example", "https://a.example/path", "https://"])
def test_an_origin_that_is_not_one_is_a_config_error(bad: str) -> None:
    with pytest.raises(ConfigError, match="is not an origin"):
        load_settings(None, {}, {"server.allowed_origins": bad})

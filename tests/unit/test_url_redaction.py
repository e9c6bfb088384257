"""URLs as they are shown and as they are relayed. Every credential-bearing part of a URL
is hidden wherever a URL is shown (core/urls.py `redact_url`, logs.py `redact`, `wsmode
check-config`): the userinfo, and the value of a query parameter whose name is a
credential's (password, pass, token, key, secret, auth...). A request target is relayed in
its origin form (`request_target`), and a path's dot segments are found once decoded."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from wsmode.cli import main
from wsmode.config import load_settings
from wsmode.config_view import redacted
from wsmode.core.urls import has_dot_segment, redact_url, request_target
from wsmode.logs import redact


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://host/0?password=hunter2", "redis://host/0?password=<redacted>"),
        ("redis://h/0?db=1&Pass=hunter2", "redis://h/0?db=1&Pass=<redacted>"),
        ("https://h/hook?token=hunter2&x=1", "https://h/hook?token=<redacted>&x=1"),
        ("https://h/v1?api_key=hunter2", "https://h/v1?api_key=<redacted>"),
        ("https://h/v1?api%5Fkey=hunter2", "https://h/v1?api%5Fkey=<redacted>"),
        (
            "https://h/v1?secret=hunter2;auth=hunter2",
            "https://h/v1?secret=<redacted>;auth=<redacted>",
        ),
        ("https://h/v1?access_token=hunter2#f", "https://h/v1?access_token=<redacted>#f"),
        (
            "rediss://:hunter2@h:6380/0?password=hunter2",
            "rediss://:<redacted>@h:6380/0?password=<redacted>",
        ),
        ("https://bob:hunter2@h/v1?key=hunter2", "https://bob:<redacted>@h/v1?key=<redacted>"),
        ("https://h/v1?model=m&stream=true", "https://h/v1?model=m&stream=true"),
        ("https://h/v1", "https://h/v1"),
        ("http://[::1/?token=hunter2", "<redacted>"),  # does not parse: nothing of it shown
    ],
)
def test_redact_url_hides_the_userinfo_and_credential_parameters(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_log_lines_mask_credential_query_parameters() -> None:
    line = "store redis://h:6379/0?db=1&password=hunter2 down; hook https://h/x?Token=hunter2&a=b"
    assert redact(line) == (
        "store redis://h:6379/0?db=1&password=<redacted> down; "
        "hook https://h/x?Token=<redacted>&a=b"
    )


def test_redacted_settings_hide_query_passwords_and_url_lists() -> None:
    settings = load_settings(
        None,
        {},
        {
            "store.redis_url": "redis://h/0?password=hunter2",
            "upstream.urls": ("http://bob:hunter2@a/v1", "http://b/v1?token=hunter2"),
        },
    )
    shown = redacted(settings)
    assert shown["store"]["redis_url"] == "redis://h/0?password=<redacted>"
    assert shown["upstream"]["urls"] == [
        "http://bob:<redacted>@a/v1",
        "http://b/v1?token=<redacted>",
    ]
    assert "hunter2" not in repr(shown)


def test_check_config_never_prints_a_password_given_as_a_query_parameter() -> None:
    env = {
        "WSMODE_STORE_BACKEND": "redis",
        "WSMODE_STORE_REDIS_URL": "redis://cache.internal:6379/0?password=hunter2",
    }
    result = CliRunner().invoke(main, ["check-config"], env=env)
    assert result.exit_code == 0, result.output
    assert "hunter2" not in result.output
    assert 'redis_url = "redis://cache.internal:6379/0?password=<redacted>"' in result.output


@pytest.mark.parametrize(
    ("raw", "target"),
    [
        ("/v1/models?limit=2", "/v1/models?limit=2"),
        ("http://h:8080/v1/models?limit=2", "/v1/models?limit=2"),
        ("https://h/v1/a%20b", "/v1/a%20b"),
        ("http://h", "/"),
        ("http://[::1/v1", "/"),
    ],
)
def test_request_target_is_the_origin_form(raw: str, target: str) -> None:
    assert request_target(raw) == target


def test_dot_segments_are_found_once_decoded() -> None:
    assert (
        has_dot_segment("/v1/../x") and has_dot_segment("/v1/./x") and has_dot_segment("/v1/a/..")
    )
    assert not has_dot_segment("/v1/models/a..b") and not has_dot_segment("/v1/.well-known")

"""The [upstream] keys of the pool (docs/pool.md): several URLs from the file, the environment
and flags, and the combinations refused at load."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from wsmode.cli import main
from wsmode.config import ConfigError, load_settings

A, B = "http://127.0.0.1:9001/v1", "http://127.0.0.1:9002/v1"


def test_urls_from_the_file_the_environment_and_one_url(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(f'[upstream]\nurls = ["{A}", "{B}"]\n')
    assert load_settings(path).upstream.replicas == (A, B)
    env = {"WSMODE_UPSTREAM_URLS": f"{A}, {B}"}
    assert load_settings(None, env).upstream.replicas == (A, B)
    assert load_settings(None, {"WSMODE_UPSTREAM": A}).upstream.replicas == (A,)
    assert load_settings(None, {}).upstream.replicas == ()  # the built-in simulated model
    same = load_settings(None, {}, {"upstream.url": A, "upstream.urls": (A,)})
    assert same.upstream.replicas == (A,)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"upstream.url": A, "upstream.urls": (B,)}, "both set"),
        ({"upstream.urls": (A, "ftp://x/v1")}, "must start with http"),
        ({"upstream.urls": (A, A + "/")}, "the same URL twice"),
        (
            {"upstream.urls": (A, B), "upstream.native_previous_response_id": True},
            "needs a single upstream",
        ),
        ({"upstream.affinity": "sticky"}, "upstream.affinity must be one of"),
        ({"upstream.load_bound": 0.5}, "load_bound must be 0"),
        ({"upstream.unhealthy_threshold": 0}, "at least 1"),
        ({"upstream.session_header": "x session"}, "valid header name"),
    ],
)
def test_pool_settings_refused_at_load(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_settings(None, {}, overrides)


def test_native_previous_response_id_with_one_url_still_loads() -> None:
    s = load_settings(
        None, {}, {"upstream.urls": (A,), "upstream.native_previous_response_id": True}
    )
    assert s.upstream.native_previous_response_id


def test_check_config_prints_the_urls() -> None:
    env = {"WSMODE_UPSTREAM_URLS": f"{A},{B}"}
    result = CliRunner().invoke(main, ["check-config"], env=env)
    assert result.exit_code == 0, result.output
    assert A in result.output and B in result.output

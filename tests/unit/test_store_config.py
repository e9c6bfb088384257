"""The `[store]` keys of the shared store: backend, redis_url, redis_timeout."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest
from wsmode.config import ConfigError, load_settings


def test_the_memory_backend_is_the_default() -> None:
    st = load_settings(None, {}).store
    assert (st.backend, st.redis_timeout) == ("memory", 0.5)


def test_the_redis_backend_loads_from_the_environment() -> None:
    env = {"WSMODE_STORE_BACKEND": "redis", "WSMODE_STORE_REDIS_URL": "redis://10.0.0.5:6380/2"}
    st = load_settings(None, env).store
    assert (st.backend, st.redis_url) == ("redis", "redis://10.0.0.5:6380/2")


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        ({"store.backend": "postgres"}, "store.backend must be one of memory, redis"),
        ({"store.backend": "redis", "store.redis_url": "http://x"}, "store.redis_url"),
        ({"store.backend": "redis", "store.redis_timeout": 0.0}, "store.redis_timeout"),
    ],
)
def test_bad_store_settings_are_config_errors(overrides: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        load_settings(None, {}, overrides)


def test_the_redis_backend_without_its_package_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = importlib.util.find_spec

    def without_redis(name: str, *args: Any) -> Any:
        return None if name == "redis" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", without_redis)
    with pytest.raises(ConfigError, match=r"pip install 'wsmode\[redis\]'"):
        load_settings(None, {}, {"store.backend": "redis"})

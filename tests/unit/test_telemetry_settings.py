"""When turns are traced: `[telemetry]` and the standard OTEL_* variables
(telemetry/settings.py)."""

from __future__ import annotations

import pytest
from wsmode.config import ConfigError, load_settings
from wsmode.telemetry.settings import TelemetrySettings, tracing_on

AUTO = TelemetrySettings()
ENDPOINT = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}


@pytest.mark.parametrize(
    ("settings", "env", "on"),
    [
        (AUTO, {}, False),
        (AUTO, ENDPOINT, True),
        (AUTO, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, True),
        (AUTO, {**ENDPOINT, "OTEL_SDK_DISABLED": "true"}, False),
        (AUTO, {**ENDPOINT, "OTEL_TRACES_EXPORTER": "none"}, False),
        (TelemetrySettings(endpoint="http://c:4318/v1/traces"), {}, True),
        (TelemetrySettings(enabled=True), {}, True),
        (TelemetrySettings(enabled=False), ENDPOINT, False),
    ],
)
def test_tracing_on(settings: TelemetrySettings, env: dict[str, str], on: bool) -> None:
    assert tracing_on(settings, env) is on


def test_section_loads_from_the_environment() -> None:
    env = {"WSMODE_TELEMETRY_ENABLED": "true", "WSMODE_TELEMETRY_RECORD_CONTENT": "1"}
    t = load_settings(None, env).telemetry
    assert t.enabled is True and t.record_content is True and t.endpoint == ""


@pytest.mark.parametrize(
    "key",
    [
        {"telemetry.enabled": "sometimes"},
        {"telemetry.endpoint": "collector:4318"},
        {"telemetry.max_queue_size": 0},
        {"telemetry.max_export_batch_size": 4096},
        {"telemetry.export_interval": 0},
    ],
)
def test_bad_values_are_refused(key: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        load_settings(None, {}, key)

"""`[telemetry]`: OpenTelemetry traces of turns (docs/telemetry.md). Plain data, so the config
loader can name it without importing OpenTelemetry."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# the standard variables that name an OTLP endpoint: either one turns tracing on
ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


@dataclass(frozen=True, slots=True)
class TelemetrySettings:
    # "auto": on when OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set
    # (and OTEL_SDK_DISABLED is not true); true: on (the endpoint below, else the SDK's
    # default, http://localhost:4318/v1/traces); false: off, whatever the environment says
    enabled: bool | str = "auto"
    # where spans go: the full OTLP/HTTP traces URL (".../v1/traces"); "": the standard
    # variables', else the SDK's default
    endpoint: str = ""
    # put the text of inputs and outputs in spans (gen_ai.input.messages and
    # gen_ai.output.messages); off: counts, sizes and ids only
    record_content: bool = False
    # the span queue of the batch exporter: past it spans are dropped, never waited for
    max_queue_size: int = 2048
    max_export_batch_size: int = 512  # spans per export request
    export_interval: float = 5.0  # seconds between exports of a queue that is not full

    def __post_init__(self) -> None:
        if isinstance(self.enabled, str) and self.enabled != "auto":
            raise ValueError('telemetry.enabled must be "auto", true or false')
        if self.endpoint and not self.endpoint.startswith(("http://", "https://")):
            raise ValueError("telemetry.endpoint must start with http:// or https://")
        if self.max_queue_size < 1 or self.max_export_batch_size < 1:
            raise ValueError("telemetry.max_queue_size and max_export_batch_size must be >= 1")
        if self.max_export_batch_size > self.max_queue_size:
            raise ValueError("telemetry.max_export_batch_size cannot exceed max_queue_size")
        if self.export_interval <= 0:
            raise ValueError("telemetry.export_interval must be more than 0")


def tracing_on(settings: TelemetrySettings, env: Mapping[str, str]) -> bool:
    """Whether turns are traced: the setting, or with "auto" the standard variables."""
    if isinstance(settings.enabled, bool):
        return settings.enabled
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return False
    return bool(settings.endpoint) or any(env.get(name) for name in ENDPOINT_VARIABLES)

"""Tracing's plain parts: its settings (`[telemetry]`) and the hooks the upstream client
calls (`context.py`). Neither imports OpenTelemetry; the spans themselves are
proxy/ops/otel_spans.py's, imported only when tracing is on (docs/telemetry.md)."""

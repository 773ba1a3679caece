"""``telemetry-otel``: OpenTelemetry GenAI traces derived from the session log (see README.md)."""

from dsh_host.sdk import require_extra

with require_extra("otel"):
    from ._tracer import FINISH_REASONS, LogIds, SessionTracer
    from .plugin import (
        Telemetry,
        TelemetryConfig,
        TelemetryOtel,
        export_session,
        otlp_exporter,
        otlp_metric_reader,
    )

__all__ = [
    "FINISH_REASONS",
    "LogIds",
    "SessionTracer",
    "Telemetry",
    "TelemetryConfig",
    "TelemetryOtel",
    "export_session",
    "otlp_exporter",
    "otlp_metric_reader",
]

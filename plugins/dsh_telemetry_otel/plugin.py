"""The ``telemetry-otel`` row: every session event becomes part of an OpenTelemetry trace."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any, Literal

import msgspec
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.trace import SpanContext

from dsh_host.sdk import (
    DELEGATION_EVENT,
    SESSION_EVENT,
    TELEMETRY,
    TOKEN_METER,
    Context,
    Plugin,
    PriceTable,
    TokenMeter,
    event_to_builtins,
    session_link,
)

from ._tracer import LogIds, SessionTracer

__all__ = [
    "Telemetry",
    "TelemetryConfig",
    "TelemetryOtel",
    "export_session",
    "otlp_exporter",
    "otlp_metric_reader",
]

PLUGIN_NAME = "telemetry-otel"
#: What the spans say made them (instrumentation scope).
SCOPE = "dsh.telemetry-otel"


class TelemetryConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """YAML ``config:`` of a ``telemetry-otel`` row (DSH-style camelCase keys accepted)."""

    #: ``otlp``: OTLP over HTTP/protobuf, configured by the standard ``OTEL_EXPORTER_OTLP_*``
    #: variables (endpoint default ``http://localhost:4318``); ``none``: no exporter of the
    #: row's own (a program adds processors through the ``telemetry`` service)
    exporter: Literal["otlp", "none"] = "otlp"
    #: ``service.name`` of the resource, unless ``OTEL_SERVICE_NAME`` says otherwise
    service_name: str = "dsh"
    #: the agent name on ``invoke_agent`` spans
    agent_name: str = "dsh"
    #: record prompts, answers, tool arguments and results on the spans (off: they may hold
    #: secrets and personal data; the log keeps them either way)
    capture_content: bool = False
    #: also export the GenAI client metrics (operation duration, token usage) and
    #: ``dsh.cost.usd`` through the OpenTelemetry metrics API, with the row's exporter
    metrics: bool = True


def otlp_exporter() -> SpanExporter:
    """The OTLP/HTTP exporter, configured from the standard environment variables."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def otlp_metric_reader() -> MetricReader:
    """Periodic OTLP/HTTP metric export, configured from the standard environment variables
    (``OTEL_EXPORTER_OTLP_*``, ``OTEL_METRIC_EXPORT_INTERVAL``)."""
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

    return PeriodicExportingMetricReader(OTLPMetricExporter())


def _resource(service_name: str) -> Resource:
    attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": service_name}
    return Resource.create(attributes)


def _provider(service_name: str, ids: LogIds) -> TracerProvider:
    return TracerProvider(resource=_resource(service_name), id_generator=ids)


class Telemetry:
    """The ``telemetry`` service: the row's tracer provider and what it has exported."""

    def __init__(
        self, config: TelemetryConfig, metric_readers: Iterable[MetricReader] = ()
    ) -> None:
        self.config = config
        self.ids = LogIds()
        self.provider = _provider(config.service_name, self.ids)
        self._tracer = self.provider.get_tracer(SCOPE)
        readers = list(metric_readers)
        #: the row's meter provider (None: metrics off, or nowhere to send them)
        self.meter_provider = (
            MeterProvider(resource=_resource(config.service_name), metric_readers=readers)
            if config.metrics and readers
            else None
        )
        self._meter: metrics.Meter | None = (
            None if self.meter_provider is None else self.meter_provider.get_meter(SCOPE)
        )
        self._sessions: dict[str, SessionTracer] = {}
        self._caught_up: set[str] = set()
        self.prices = PriceTable()  #: prices the chat spans' ``dsh.cost.usd``

    def add_span_processor(self, processor: SpanProcessor) -> None:
        """Send the spans somewhere else too (a test's in-memory exporter, a second backend)."""
        self.provider.add_span_processor(processor)

    def tracer_for(self, session_id: str) -> SessionTracer:
        tracer = self._sessions.get(session_id)
        if tracer is None:
            tracer = SessionTracer(
                self._tracer,
                self.ids,
                session_id,
                agent_name=self.config.agent_name,
                capture_content=self.config.capture_content,
                prices=self.prices,
                meter=self._meter,
            )
            self._sessions[session_id] = tracer
        return tracer

    def on_event(self, session: Any, event: Any) -> None:
        """``session/event``: every append, the repair's closers included, reaches the trace.

        A session this process did not start (``dsh resume``, ``approvals continue``) may be in
        the middle of a turn: the first time one of its events arrives outside a turn, the
        turn's earlier events are read back from the session and fed first, so the closers a
        repair appends end the spans of the turn they close (with the same ids as if this
        process had seen the whole turn). Done once per session, never per event.
        """
        fresh = session.id not in self._sessions
        tracer = self.tracer_for(session.id)
        if fresh and event.type != DELEGATION_EVENT:
            # a sub-agent session this row meets mid-log: its link to the parent first (D30)
            tracer.link_to(session_link(session.events))
        if not tracer.in_turn and event.type != "turn/start" and session.id not in self._caught_up:
            self._caught_up.add(session.id)
            for earlier in _open_turn(session.events, event.seq):
                tracer.feed(event_to_builtins(earlier))
        tracer.feed(event_to_builtins(event))

    def forget(self, session: Any) -> None:
        self._caught_up.discard(session.id)
        tracer = self._sessions.pop(session.id, None)
        if tracer is not None:
            tracer.close()

    def shutdown(self) -> None:
        """End open spans (marked ``dsh.open``) and flush every exporter."""
        for tracer in self._sessions.values():
            tracer.close()
        self._sessions.clear()
        self.provider.shutdown()
        if self.meter_provider is not None:
            self.meter_provider.shutdown()


class TelemetryOtel(Plugin):
    """Entry point ``telemetry-otel``; provides ``telemetry``."""

    name = PLUGIN_NAME
    provides = ("telemetry",)
    #: spans follow every append, a repair's closers included
    boots_for_repair = True
    Config = TelemetryConfig

    def apply(self, ctx: Context, config: TelemetryConfig) -> None:
        readers = [otlp_metric_reader()] if config.exporter == "otlp" and config.metrics else []
        telemetry = Telemetry(config, readers)
        meter = ctx.get(TOKEN_METER)  # the composition's prices, when a token-meter row is on
        telemetry.prices = meter.prices if isinstance(meter, TokenMeter) else PriceTable()
        if config.exporter == "otlp":
            telemetry.add_span_processor(BatchSpanProcessor(otlp_exporter()))
        ctx.on(SESSION_EVENT, telemetry.on_event)
        ctx.on("session/disposed", telemetry.forget)

        async def shutdown() -> None:
            import anyio

            await anyio.to_thread.run_sync(telemetry.shutdown)  # the exporter may block on I/O

        ctx.effect(shutdown, "flush the trace exporter")
        ctx.provide(TELEMETRY, telemetry)


def _open_turn(events: Any, before: int) -> list[Any]:
    """The events of the turn still open at ``before`` (from its ``turn/start``), or none."""
    for index in range(min(before, len(events)) - 1, -1, -1):
        kind = events[index].type
        if kind == "turn/end":
            return []
        if kind == "turn/start":
            return [events[i] for i in range(index, min(before, len(events)))]
    return []


def export_session(
    session_id: str,
    events: Iterable[Mapping[str, Any]],
    exporter: SpanExporter,
    *,
    config: TelemetryConfig | None = None,
    prices: PriceTable | None = None,
    meter: metrics.Meter | None = None,
    children: Iterable[tuple[str, Iterable[Mapping[str, Any]]]] = (),
) -> dict[str, int]:
    """Export a stored session's events as a trace, after the fact; returns the span counts.

    The same :class:`SessionTracer` as the live row, so a session exported live and again here
    gives the same spans with the same ids. A turn the log has not closed (a crash not yet
    repaired) is exported open-ended and marked ``dsh.open``. ``children`` are its sub-agent
    sessions (and theirs), ``(id, events)``, each after its parent: each child's turn is
    exported under the delegating call's ``execute_tool`` span, in the parent's trace (D30);
    the counts are the sum over all of them.
    """
    config = config or TelemetryConfig()
    ids = LogIds()
    provider = _provider(config.service_name, ids)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracers: dict[str, SessionTracer] = {}

    def locate_call(parent: str, call_id: str) -> SpanContext | None:
        """A pre-D30 child's delegating call: its span, when the parent was exported first."""
        calls = tracers[parent].call_spans if parent in tracers else None
        return None if calls is None else calls.get(call_id)

    counts: dict[str, int] = {}
    for sid, stream in [(session_id, events), *children]:
        log = list(stream)
        tracers[sid] = tracer = SessionTracer(
            provider.get_tracer(SCOPE),
            ids,
            sid,
            agent_name=config.agent_name,
            capture_content=config.capture_content,
            prices=prices if prices is not None else PriceTable(),
            meter=meter,
            locate_call=locate_call,
        )
        tracer.call_spans = {}
        for event in log:
            tracer.feed(event)
        last = log[-1].get("time") if log else None
        tracer.close(None if last is None else int(last))
        for name, count in tracer.counts.items():
            counts[name] = counts.get(name, 0) + count
    provider.shutdown()
    return counts

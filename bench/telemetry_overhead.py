"""Benchmark: what the ``telemetry-otel`` row adds to one agent step.

Two measurements in one run:

1. **End to end.** The same scripted loop (one no-op tool call per step, in-memory store, so
   the figure is the harness and not a disk) with and without a ``telemetry-otel`` row. The
   row's exporter is ``none`` and an in-memory ``SimpleSpanProcessor`` is added through its
   ``telemetry`` service, so every span is built and exported synchronously on the loop's
   thread (an upper bound of the OTLP batch processor's on-thread cost; the network part of
   OTLP runs on the batch processor's thread). Variants alternate (ABBA over the repeats).
   Per step: ``agent/step-start`` to the next; the first step is left out.
2. **The tracer alone.** The events of one recorded turn fed through ``SessionTracer`` the way
   the row does (``event_to_builtins`` then ``feed``): spans only, and spans plus the GenAI
   metrics (an in-memory metric reader). Reported per step (events of the turn / steps).

Reported: median µs per step with and without the row, the overhead per step (difference of
medians) and its ratio; the tracer's µs per step with and without metrics; spans per step.
Writes ``bench/results/telemetry_overhead.json``. No assertion: numbers are reported.
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import anyio
from _common import (
    NOOP_TOOL,
    machine_info,
    median,
    now_ns,
    parser,
    print_table,
    ratio,
    scratch_dir,
    summary_us,
    write_result,
)

from dsh_host import Row, open_host
from dsh_host._session.events import CompletedReason, event_to_builtins

NAME = "telemetry_overhead"


def script(steps: int) -> list[dict[str, Any]]:
    responses: list[dict[str, Any]] = [
        {
            "text": f"Step {i}: checking the next item.",
            "tool_calls": [{"name": NOOP_TOOL, "arguments": {"i": i}}],
            "usage": {"input_tokens": 1000 + 40 * i, "output_tokens": 24},
        }
        for i in range(1, steps + 1)
    ]
    responses.append({"text": "All items checked."})
    return responses


def rows(steps: int, telemetry: bool) -> list[Row]:
    return [
        Row(name="sessions"),
        Row(name="session-persistence-memory"),
        Row(name="llm"),
        Row(name="tools"),
        Row(id="model", name="llm-scripted", config={"responses": script(steps)}),
        Row(
            name="agent",
            config={"provider": "scripted", "model": "scripted", "maxStepsPerTurn": steps + 1},
        ),
        Row(id="bench-tool", name="_common:NoopToolPlugin"),
        *([Row(name="telemetry-otel", config={"exporter": "none"})] if telemetry else []),
    ]


async def run_turn(steps: int, telemetry: bool, n: int) -> tuple[list[int], list[Any], int]:
    """Step times (ns, step 1 left out), the turn's events, and the spans exported."""
    marks: list[int] = []
    spans = 0
    async with open_host(rows(steps, telemetry)) as host:
        ctx = host.ctx
        exporter = None
        if telemetry:
            from opentelemetry.sdk.trace.export import SimpleSpanProcessor
            from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
                InMemorySpanExporter,
            )

            exporter = InMemorySpanExporter()
            ctx.telemetry.add_span_processor(SimpleSpanProcessor(exporter))
        ctx.on("agent/step-start", lambda _event: marks.append(now_ns()))
        agent = ctx.agent.create(session_id=f"bench-telemetry-{n}-{int(telemetry)}")
        reason = await agent.run_turn("Check every item, one tool call per item.")
        if reason != CompletedReason():
            raise RuntimeError(f"the benchmark turn did not complete: {reason!r}")
        events = list(agent.session.events)
        await agent.aclose()
        if exporter is not None:
            spans = len(exporter.get_finished_spans())
    if len(marks) != steps + 1:
        raise RuntimeError(f"expected {steps + 1} step starts, saw {len(marks)}")
    return [b - a for a, b in list(pairwise(marks))[1:]], events, spans


def tracer_samples(events: list[Any], repeats: int, metrics: bool) -> list[int]:
    """ns to turn one recorded turn into spans (and metrics), ``repeats`` times."""
    from dsh_telemetry_otel import LogIds, SessionTracer
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from dsh_host._session.prices import PriceTable

    samples: list[int] = []
    prices = PriceTable()
    for _ in range(repeats):
        ids = LogIds()
        provider = TracerProvider(id_generator=ids)
        provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
        meter = (
            MeterProvider(metric_readers=[InMemoryMetricReader()]).get_meter("bench")
            if metrics
            else None
        )
        tracer = SessionTracer(provider.get_tracer("bench"), ids, "bench", prices=prices,
                               meter=meter)  # fmt: skip
        start = now_ns()
        for event in events:
            tracer.feed(event_to_builtins(event))
        samples.append(now_ns() - start)
        provider.shutdown()
    return samples


def main() -> None:
    args = parser(__doc__.splitlines()[0]).parse_args()
    # nothing here touches a disk (in-memory store): the scratch is made and removed only
    # because every bench script accepts --scratch
    with scratch_dir(args.scratch, "telemetry"):
        anyio.run(measure, args, backend=args.backend)


async def measure(args: Any) -> None:
    steps, repeats = (8, 2) if args.small else (60, 6)
    without: list[int] = []
    with_row: list[int] = []
    spans = 0
    events: list[Any] = []
    for n in range(repeats):
        order = (False, True) if n % 2 == 0 else (True, False)  # ABBA
        for telemetry in order:
            times, turn_events, exported = await run_turn(steps, telemetry, n)
            (with_row if telemetry else without).extend(times)
            if telemetry:
                spans, events = exported, turn_events
    tracer_repeats = 5 if args.small else 30
    spans_only = [t / steps for t in tracer_samples(events, tracer_repeats, metrics=False)]
    with_metrics = [t / steps for t in tracer_samples(events, tracer_repeats, metrics=True)]

    base, row = median(without), median(with_row)
    overhead = row - base
    print_table(
        f"one agent step ({steps} steps x {repeats} turns, in-memory store)",
        ["variant", "median µs/step"],
        [["no telemetry row", f"{base / 1000:.1f}"], ["telemetry-otel row", f"{row / 1000:.1f}"],
         ["overhead", f"{overhead / 1000:.1f} ({ratio(overhead, base):.1%})"]],
    )  # fmt: skip
    print_table(
        "the tracer alone, per step (event_to_builtins + feed, in-memory exporter)",
        ["variant", "median µs/step"],
        [["spans", f"{median(spans_only) / 1000:.1f}"],
         ["spans + metrics", f"{median(with_metrics) / 1000:.1f}"]],
    )  # fmt: skip
    write_result(
        NAME,
        {
            "small": args.small,
            "backend": args.backend,
            "steps": steps,
            "repeats": repeats,
            "step_without_row_us": summary_us(without),
            "step_with_row_us": summary_us(with_row),
            "overhead_per_step_us": overhead / 1000,
            "overhead_ratio": ratio(overhead, base),
            "tracer_per_step_us": {
                "spans": summary_us(spans_only),
                "spans_and_metrics": summary_us(with_metrics),
            },
            "spans_per_turn": spans,
            "spans_per_step": spans / steps,
            "events_per_turn": len(events),
            "machine": machine_info(),
        },
        args.results_dir,
    )


if __name__ == "__main__":
    main()

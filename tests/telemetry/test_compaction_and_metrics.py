"""telemetry-otel (issue 40): compaction spans and the GenAI client metrics, derived from a real
compacted session (the compaction suite's child: JSONL, checkpoint policy, token meter, pruner,
compaction-basic, a scripted model), read back from the store; and a compaction SIGKILLed
mid-summary, repaired by ``resume``, exported with the span the closers ended."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from compaction.compaction_child import SESSION_ID, register_tool, rows
from dsh_telemetry_otel import export_session
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from dsh_host import Row, open_host
from dsh_host._session.events import event_to_builtins

pytestmark = [pytest.mark.slow, pytest.mark.anyio]  # a real child process each

COMPACTION = Path(__file__).resolve().parents[1] / "compaction"


def child(root: Path, point: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(COMPACTION / "compaction_child.py"), str(root),
                           point], capture_output=True, text=True, timeout=300)  # fmt: skip


async def stored_events(root: Path) -> list[dict[str, Any]]:
    async with open_host(
        [Row(name="sessions"), Row(name="session-persistence-jsonl", config={"root": str(root)})]
    ) as host:
        handle = await host.ctx.sessionPersistence.open(SESSION_ID, "read")
        load = await handle.read()
        await handle.close()
    return [event_to_builtins(event) for event in load.events]


def export(events: list[dict[str, Any]]) -> tuple[list[ReadableSpan], dict[str, Any], dict[str, int]]:
    spans = InMemorySpanExporter()
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    counts = export_session(SESSION_ID, events, spans, meter=provider.get_meter("test"))
    data = reader.get_metrics_data()
    assert data is not None
    metrics = {
        metric.name: metric
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
    }
    return list(spans.get_finished_spans()), metrics, counts


def _points(metric: Any, **attributes: str) -> list[Any]:
    return [p for p in metric.data.data_points
            if all(p.attributes.get(k) == v for k, v in attributes.items())]  # fmt: skip


async def test_a_compaction_is_a_child_span_of_its_turn_and_metrics_follow_the_spans(
    tmp_path: Path,
) -> None:
    root = tmp_path / "sessions"
    done = child(root, "none")
    assert done.returncode == 0, done.stderr
    events = await stored_events(root)
    spans, metrics, counts = export(events)
    [turn] = [s for s in spans if s.name.startswith("invoke_agent")]
    compactions = [s for s in spans if s.name == "compaction"]
    starts = [e for e in events if e["type"] == "compaction/start"]
    assert len(compactions) == len(starts) == counts["compaction"] >= 1
    for span in compactions:
        assert span.parent is not None and span.parent.span_id == turn.context.span_id
        assert span.context.trace_id == turn.context.trace_id
        attributes: dict[str, Any] = dict(span.attributes or {})
        assert attributes["dsh.compaction.trigger"] == "automatic"
        assert attributes["gen_ai.provider.name"] == "scripted"
        assert attributes["dsh.compaction.shadowed_tokens"] > 0
        assert span.status.status_code != StatusCode.ERROR
    # one duration point set per operation, counted as the spans are
    duration = metrics["gen_ai.client.operation.duration"]
    chats = [s for s in spans if s.name.startswith("chat")]
    tools = [s for s in spans if s.name.startswith("execute_tool")]
    assert sum(p.count for p in _points(duration, **{"gen_ai.operation.name": "chat"})) == len(
        chats
    )
    assert sum(
        p.count for p in _points(duration, **{"gen_ai.operation.name": "execute_tool"})
    ) == len(tools)
    assert sum(
        p.count for p in _points(duration, **{"gen_ai.operation.name": "compaction"})
    ) == len(compactions)
    tokens = metrics["gen_ai.client.token.usage"]
    outputs = _points(tokens, **{"gen_ai.operation.name": "chat", "gen_ai.token.type": "output"})
    output_tokens: list[Any] = [dict(s.attributes or {})["gen_ai.usage.output_tokens"]
                                for s in chats]
    expected = sum(int(n) for n in output_tokens)
    assert sum(p.sum for p in outputs) == expected


async def test_a_compaction_killed_mid_summary_ends_with_the_repaired_turn(
    tmp_path: Path,
) -> None:
    root = tmp_path / "sessions"
    killed = child(root, "in-summary")
    assert killed.returncode == -9, killed.stdout + killed.stderr
    before = await stored_events(root)
    open_spans, _, _ = export(before)
    [open_compaction] = [s for s in open_spans if s.name == "compaction"]
    assert (open_compaction.attributes or {}).get("dsh.open") is True  # not closed by the log

    async with open_host(rows(str(root))) as host:  # the repair appends the closers
        register_tool(host)
        agent = await host.ctx.agent.resume(SESSION_ID)
        await agent.aclose()
    spans, _, counts = export(await stored_events(root))
    [compaction] = [s for s in spans if s.name == "compaction"]
    assert (compaction.attributes or {}).get("dsh.open") is None
    assert compaction.status.status_code == StatusCode.ERROR
    assert (compaction.attributes or {})["error.type"] == "interrupted"
    assert counts["compaction"] == 1
    # same ids as the export before the repair: a backend deduplicates
    assert compaction.context.span_id == open_compaction.context.span_id

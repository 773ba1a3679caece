"""telemetry-otel and sub-agents (issue 40, D30): a child session's turn is part of its parent's
trace, its ``invoke_agent`` span a child of the delegating call's ``execute_tool`` span.

Live: a parent delegating to two children in parallel, in one process on a real JSONL store, its
spans taken by an in-memory exporter added to the row's provider; then the same sessions read
back from the store and exported after the fact (the parent with its children, and a child
alone) must give the same ids. Across a SIGKILL: real ``dsh run`` killed inside a child's tool
body, ``dsh resume`` of the parent, then ``dsh sessions export-otel`` to a real OTLP/HTTP
receiver on loopback.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from dsh_telemetry_otel import Telemetry, TelemetryConfig, export_session
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from subagents.test_crash import PARENT, _compose
from subagents.test_delegation import _child, _delegate, _model_row, _script
from subagents.test_delegation import anyio_backend as anyio_backend  # the fixture: trio

from dsh_host import Row
from dsh_host._front import Agent, tool
from dsh_host._session.events import event_to_builtins
from dsh_host._session.keys import TELEMETRY
from dsh_host._session.lineage import DELEGATION_EVENT

from .test_otel import Receiver, receiver  # noqa: F401  (the fixture)

pytestmark = [pytest.mark.anyio]

#: (name, trace id, span id, parent span id or None, conversation id) of a span
Shape = tuple[str, int, int, int | None, str]


def _shape(span: ReadableSpan) -> Shape:
    assert span.context is not None and span.attributes is not None
    parent = None if span.parent is None else span.parent.span_id
    conversation = str(span.attributes["gen_ai.conversation.id"])
    return (span.name, span.context.trace_id, span.context.span_id, parent, conversation)


async def test_two_parallel_delegations_are_one_trace_live_and_after_the_fact(
    tmp_path: Path,
) -> None:
    @tool
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    delegations = {"tool_calls": [_delegate("d1", "alpha"), _delegate("d2", "beta")]}
    parent = _script(tmp_path / "parent.yml", [delegations, {"text": "done"}])
    call_add = {"tool_calls": [{"name": "add", "id": "x1", "arguments": {"a": 2, "b": 3}}]}
    rows = [
        _model_row(tmp_path, "scripted-a", [call_add, {"text": "five"}]),
        _model_row(tmp_path, "scripted-b", [{"text": "B"}]),
        Row(id="subagents", name="subagents", config={"agents": [
            _child("alpha", "scripted-a", tools=["add"]), _child("beta", "scripted-b", tools=[])]}),
        Row(id="telemetry", name="telemetry-otel", config={"exporter": "none", "metrics": False}),
    ]  # fmt: skip
    live = InMemorySpanExporter()
    async with Agent(
        model=f"scripted:{parent}", tools=[add], store=tmp_path / "s", rows=rows
    ) as agent:
        telemetry = agent.host.ctx.get(TELEMETRY)
        assert isinstance(telemetry, Telemetry)
        telemetry.add_span_processor(SimpleSpanProcessor(live))
        result = await agent.run("go")
        assert result.output == "done"
        sid = agent.session_id
        store = agent.host.ctx.get("sessionPersistence")
        assert store is not None
        loads = {s: await store.inspect(s) for s in (sid, f"{sid}--d1", f"{sid}--d2")}
        stored = {s: [event_to_builtins(e) for e in load.events] for s, load in loads.items()}
    spans = list(live.get_finished_spans())
    shapes = {_shape(s) for s in spans}
    [root] = [s for s in spans if s.parent is None]
    assert root.name == "invoke_agent dsh" and _shape(root)[4] == sid
    assert {s.context.trace_id for s in spans if s.context} == {_shape(root)[1]}, "one trace"
    calls = {
        str((s.attributes or {})["gen_ai.tool.call.id"]): s
        for s in spans
        if s.name == "execute_tool subagent"
    }
    assert sorted(calls) == ["d1", "d2"]
    for call_id, agent_name in (("d1", "alpha"), ("d2", "beta")):
        [child] = [s for s in spans if s.name == f"invoke_agent {agent_name}"]
        attributes = child.attributes or {}
        assert child.parent is not None and calls[call_id].context is not None
        assert child.parent.span_id == calls[call_id].context.span_id, call_id
        assert attributes["gen_ai.operation.name"] == "invoke_agent"
        assert attributes["gen_ai.agent.name"] == agent_name
        assert attributes["gen_ai.conversation.id"] == f"{sid}--{call_id}"
        assert attributes["dsh.parent.session_id"] == sid
        assert attributes["dsh.parent.call_id"] == call_id
        inner = [s for s in spans if s is not child and _shape(s)[4] == f"{sid}--{call_id}"]
        assert inner and all(
            s.parent is not None and child.context is not None
            and s.parent.span_id == child.context.span_id
            for s in inner
        ), "the child's requests and calls are under its turn"  # fmt: skip
    counts = {name: sum(1 for s in spans if s.name.startswith(name))
              for name in ("invoke_agent", "chat", "execute_tool")}  # fmt: skip
    assert counts == {"invoke_agent": 3, "chat": 5, "execute_tool": 3}

    # after the fact: the parent with its children gives the same spans with the same ids
    again = InMemorySpanExporter()
    exported = export_session(
        sid, stored[sid], again, children=[(c, stored[c]) for c in (f"{sid}--d1", f"{sid}--d2")]
    )
    assert {_shape(s) for s in again.get_finished_spans()} == shapes
    assert exported == {**counts, "compaction": 0}
    # a child alone still names the parent's trace and the delegating call's span
    alone = InMemorySpanExporter()
    export_session(f"{sid}--d2", stored[f"{sid}--d2"], alone)
    assert {_shape(s) for s in alone.get_finished_spans()} <= shapes
    # a child written before D30 (no parentTurn, ...): the parent's export locates the call
    older = InMemorySpanExporter()
    export_session(sid, stored[sid], older, children=[
        (c, [_pre_d30(e) for e in stored[c]]) for c in (f"{sid}--d1", f"{sid}--d2")])  # fmt: skip
    assert {_shape(s) for s in older.get_finished_spans()} == shapes
    # a row that meets a child mid-log (another process continues it) reads its link first
    joining = Telemetry(TelemetryConfig(exporter="none", metrics=False))
    late = InMemorySpanExporter()
    joining.add_span_processor(SimpleSpanProcessor(late))
    child = loads[f"{sid}--d1"]
    start = next(i for i, e in enumerate(child.events) if e.type == "turn/start")
    for event in child.events[start:]:
        joining.on_event(child, event)
    joining.shutdown()
    assert {_shape(s) for s in late.get_finished_spans()} <= shapes
    assert len(late.get_finished_spans()) == 4  # alpha: its turn, 2 requests, 1 call


def _pre_d30(event: dict[str, Any]) -> dict[str, Any]:
    if event["type"] != DELEGATION_EVENT:
        return event
    added = {"parentTurn", "parentCallSeq", "rootSession", "rootTurn"}
    assert added <= set(event["data"])
    data = {k: v for k, v in event["data"].items() if k not in added}
    return {**event, "data": data}


def _dsh(tmp: Path, *args: str, endpoint: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
           "DSH_SESSION_ROOT": str(tmp / "x")}  # fmt: skip
    if endpoint is not None:
        env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = endpoint
    return subprocess.run([sys.executable, "-m", "dsh_host", *args], cwd=tmp, env=env,
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("point", ["child-tool", "grandchild-tool"])
def test_a_killed_delegation_resumed_is_exported_under_the_parents_call(
    tmp_path: Path,
    receiver: Receiver,  # noqa: F811
    point: str,
) -> None:
    # a tool body SIGKILLs the process mid-delegation (alpha's own, or that of gamma, which alpha
    # delegated to); resume repairs the children from the bottom up, then the parent
    config = str(_compose(tmp_path, "jsonl", point))
    crashed = _dsh(tmp_path, "run", "--config", config, "--model",
                   f"scripted:{tmp_path / 'parent.yml'}", "--session", PARENT, "--new", "go")  # fmt: skip
    assert crashed.returncode == -9, (crashed.stdout, crashed.stderr)
    resumed = _dsh(tmp_path, "resume", PARENT, "--config", config)
    assert resumed.returncode == 0, resumed.stderr

    exported = _dsh(tmp_path, "sessions", "export-otel", PARENT, "--config", config,
                    endpoint=receiver.endpoint)  # fmt: skip
    assert exported.returncode == 0, exported.stderr
    assert "sub-agent session(s)" in exported.stderr
    spans = list(receiver.spans)
    [root] = [s for s in spans if s.parent == ""]
    assert root.attributes["gen_ai.conversation.id"] == PARENT
    assert root.attributes["dsh.turn.end"] == "interrupted"
    assert {s.trace_id for s in spans} == {root.trace_id}, "the parent and its children: one trace"
    calls = {s.attributes["gen_ai.tool.call.id"]: s for s in spans
             if s.name == "execute_tool subagent"}  # fmt: skip
    assert calls["d1"].error and calls["d1"].attributes["error.type"] == "TOOL_OUTCOME_UNKNOWN"
    [alpha] = [s for s in spans if s.name == "invoke_agent alpha"]
    assert alpha.parent == calls["d1"].span_id
    assert alpha.error and alpha.attributes["dsh.turn.end"] == "interrupted"
    assert alpha.attributes["dsh.parent.call_id"] == "d1"
    [crash] = [s for s in spans if s.name == "execute_tool crash"]
    assert crash.error and crash.attributes["error.type"] == "TOOL_OUTCOME_UNKNOWN"
    if point == "child-tool":
        assert crash.parent == alpha.span_id
    else:  # gamma's turn hangs under alpha's delegating call g1, in the same trace
        [g1] = [s for s in spans if s.attributes.get("gen_ai.tool.call.id") == "g1"]
        assert g1.parent == alpha.span_id and g1.attributes["error.type"] == "TOOL_OUTCOME_UNKNOWN"
        [gamma] = [s for s in spans if s.name == "invoke_agent gamma"]
        assert gamma.parent == g1.span_id and gamma.attributes["dsh.turn.end"] == "interrupted"
        assert gamma.attributes["gen_ai.conversation.id"] == f"{PARENT}--d1--g1"
        assert crash.parent == gamma.span_id
    for beta in [s for s in spans if s.name == "invoke_agent beta"]:  # it may not have started
        assert beta.parent == calls["d2"].span_id

    # the child alone still links to the parent's trace and the delegating call's span
    before = len(receiver.spans)
    alone = _dsh(tmp_path, "sessions", "export-otel", f"{PARENT}--d1", "--config", config,
                 endpoint=receiver.endpoint)  # fmt: skip
    assert alone.returncode == 0, alone.stderr
    again = [s for s in receiver.spans[before:] if s.name == "invoke_agent alpha"]
    assert [(s.trace_id, s.span_id, s.parent) for s in again] == [
        (alpha.trace_id, alpha.span_id, alpha.parent)]  # fmt: skip


@pytest.mark.slow
def test_a_child_repaired_by_resume_is_exported_live(
    tmp_path: Path,
    receiver: Receiver,  # noqa: F811
) -> None:
    """The resume's own exporter sends the child's repair too: the sub-agent's repair writes
    the child's closers outside a live session, and announces them to the listeners."""
    path = _compose(tmp_path, "jsonl", "child-tool")
    rows = yaml.safe_load(path.read_text())
    rows.insert(-1, {"id": "telemetry", "name": "telemetry-otel", "config": {"metrics": False}})
    path.write_text(yaml.safe_dump(rows, sort_keys=False))
    config = str(path)
    crashed = _dsh(tmp_path, "run", "--config", config, "--model",
                   f"scripted:{tmp_path / 'parent.yml'}", "--session", PARENT, "--new", "go",
                   endpoint="http://127.0.0.1:9/v1/traces")  # fmt: skip
    assert crashed.returncode == -9, (crashed.stdout, crashed.stderr)
    resumed = _dsh(tmp_path, "resume", PARENT, "--config", config, endpoint=receiver.endpoint)
    assert resumed.returncode == 0, resumed.stderr
    spans = list(receiver.spans)
    [alpha] = [s for s in spans if s.name == "invoke_agent alpha"]
    assert alpha.error and alpha.attributes["dsh.turn.end"] == "interrupted"
    assert alpha.attributes["gen_ai.conversation.id"] == f"{PARENT}--d1"
    [crash] = [s for s in spans if s.name == "execute_tool crash"]
    assert crash.parent == alpha.span_id
    assert crash.error and crash.attributes["error.type"] == "TOOL_OUTCOME_UNKNOWN"
    calls = {s.attributes["gen_ai.tool.call.id"]: s for s in spans
             if s.name == "execute_tool subagent"}  # fmt: skip
    assert alpha.parent == calls["d1"].span_id
    assert {s.trace_id for s in spans} == {alpha.trace_id}

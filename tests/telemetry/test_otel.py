"""telemetry-otel: a turn as an OpenTelemetry trace, received by a real OTLP/HTTP endpoint.

Every test runs the real ``dsh`` with a composition holding a ``telemetry-otel`` row; the
standard ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` points the SDK's exporter at a receiver on
loopback, which decodes what arrives with ``opentelemetry-proto`` (the protobuf types the
collector uses). Nothing here reads the plugin's memory: what a backend would store is judged.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from dsh_telemetry_otel import export_session
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # several real dsh processes


@dataclass
class Received:
    name: str
    trace_id: str
    span_id: str
    parent: str
    attributes: dict[str, Any]
    error: bool


class Receiver:
    """An OTLP/HTTP trace endpoint: POST /v1/traces with a protobuf body, answered 200."""

    def __init__(self) -> None:
        self.spans: list[Received] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                with receiver.lock:
                    for resource in request.resource_spans:
                        for scope in resource.scope_spans:
                            for span in scope.spans:
                                receiver.spans.append(_received(span))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in any_value.array_value.values]
    return getattr(any_value, kind) if kind else None


def _received(span: Any) -> Received:
    return Received(
        name=span.name,
        trace_id=span.trace_id.hex(),
        span_id=span.span_id.hex(),
        parent=span.parent_span_id.hex(),
        attributes={a.key: _value(a.value) for a in span.attributes},
        error=span.status.code == 2,
    )


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    receiving = Receiver()
    yield receiving
    receiving.server.shutdown()


def _setup(tmp: Path, calls: list[dict[str, Any]]) -> tuple[Path, Path, Path]:
    workspace = tmp / "ws"
    workspace.mkdir()
    config = tmp / "dsh.yml"
    config.write_text(
        (REPO / "configs" / "default.yml").read_text()
        + "\n- id: telemetry\n  name: telemetry-otel\n"
    )
    script = tmp / "script.json"
    script.write_text(json.dumps({"responses": [
        {"text": "Working.", "tool_calls": calls}, {"text": "Finished."}]}))  # fmt: skip
    return workspace, config, script


def _dsh(tmp: Path, receiver: Receiver, *args: str) -> tuple[list[str], dict[str, str]]:
    env = {
        **os.environ,
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "50",
    }
    env.pop("DSH_SESSION_ROOT", None)
    return [sys.executable, "-m", "dsh_host", *args, "--root", str(tmp / "sessions")], env


def test_a_turn_is_one_trace_with_a_span_per_request_and_call(
    tmp_path: Path, receiver: Receiver
) -> None:
    call = {"name": "bash", "id": "call-1",
            "arguments": {"command": "echo ran", "description": "say it"}}  # fmt: skip
    workspace, config, script = _setup(tmp_path, [call])
    argv, env = _dsh(tmp_path, receiver, "run", "go", "--model", f"scripted:{script}",
                     "--config", str(config), "--workspace", str(workspace), "--json")  # fmt: skip
    done = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)  # fmt: skip
    assert done.returncode == 0, done.stderr
    session_id = json.loads(done.stdout)["sessionId"]
    spans = {s.name: s for s in receiver.spans}
    assert sorted(s.name for s in receiver.spans) == [
        "chat scripted", "chat scripted", "execute_tool bash", "invoke_agent dsh"]  # fmt: skip
    root = spans["invoke_agent dsh"]
    assert root.parent == "" and not root.error
    assert root.attributes["gen_ai.conversation.id"] == session_id
    assert root.attributes["dsh.turn.end"] == "completed"
    for span in receiver.spans:
        assert span.trace_id == root.trace_id
        if span is not root:
            assert span.parent == root.span_id, span
    tool = spans["execute_tool bash"]
    assert tool.attributes["gen_ai.tool.call.id"] == "call-1"
    assert tool.attributes["gen_ai.operation.name"] == "execute_tool"
    assert not tool.error
    chats = [s for s in receiver.spans if s.name == "chat scripted"]
    assert {tuple(s.attributes["gen_ai.response.finish_reasons"]) for s in chats} == {
        ("tool_calls",), ("stop",)}  # fmt: skip
    assert all(s.attributes["gen_ai.provider.name"] == "scripted" for s in chats)
    assert all(s.attributes["gen_ai.usage.output_tokens"] > 0 for s in chats)
    # content stays out unless the row asks for it
    assert not any(k.startswith(("gen_ai.tool.call.arguments", "gen_ai.output.messages"))
                   for s in receiver.spans for k in s.attributes)  # fmt: skip

    # after the fact: the stored log exports the same spans with the same ids
    shown = subprocess.run(
        [sys.executable, "-m", "dsh_host", "sessions", "show", session_id, "--view", "events",
         "--json", "--root", str(tmp_path / "sessions")],
        capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    events = [json.loads(line) for line in shown.stdout.splitlines() if line.strip()]
    memory = InMemorySpanExporter()
    counts = export_session(session_id, events, memory)
    assert counts == {"invoke_agent": 1, "chat": 2, "execute_tool": 1, "compaction": 0}
    again = {(s.name, format(s.context.span_id, "016x")) for s in memory.get_finished_spans()}
    assert again == {(s.name, s.span_id) for s in receiver.spans}


def test_a_killed_turn_is_exported_as_the_repair_closes_it(
    tmp_path: Path, receiver: Receiver
) -> None:
    call = {
        "name": "bash",
        "id": "call-slow",
        "arguments": {"command": "touch started; sleep 300", "description": "wait"},
    }
    workspace, config, script = _setup(tmp_path, [call])
    argv, env = _dsh(tmp_path, receiver, "run", "go", "--model", f"scripted:{script}",
                     "--config", str(config), "--workspace", str(workspace))  # fmt: skip
    child = subprocess.Popen(argv, env=env, cwd=tmp_path, stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 120  # a hang guard
    while not (workspace / "started").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (workspace / "started").exists()
    os.killpg(child.pid, signal.SIGKILL)
    child.wait(timeout=60)
    assert not any(s.name.startswith(("execute_tool", "invoke_agent")) for s in receiver.spans)

    [session_dir] = (tmp_path / "sessions").glob("*/*")
    argv, env = _dsh(tmp_path, receiver, "resume", session_dir.name, "--config", str(config))
    resumed = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True,
                             timeout=120, stdin=subprocess.DEVNULL)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    spans = {s.name: s for s in receiver.spans}
    tool = spans["execute_tool bash"]
    assert tool.error and tool.attributes["error.type"] == "TOOL_OUTCOME_UNKNOWN"
    assert tool.attributes["gen_ai.tool.call.id"] == "call-slow"
    root = spans["invoke_agent dsh"]
    assert root.error and root.attributes["dsh.turn.end"] == "interrupted"
    assert tool.parent == root.span_id and tool.trace_id == root.trace_id

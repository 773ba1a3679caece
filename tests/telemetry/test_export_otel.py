"""``dsh sessions export-otel ID`` (issue 40): a stored session replayed as a trace, sent to a
real OTLP/HTTP receiver on loopback (decoded with ``opentelemetry-proto``), or printed as JSON
lines with ``--stdout``; without OpenTelemetry the command is one line naming the extra."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .test_otel import REPO, Receiver, receiver  # noqa: F401  (the fixture)

pytestmark = pytest.mark.slow  # real dsh processes


def _run(
    tmp: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "DSH_SESSION_ROOT"}
    return subprocess.run(
        [sys.executable, "-m", "dsh_host", *args, "--root", str(tmp / "sessions")],
        env={**base, **(env or {})}, cwd=tmp, capture_output=True, text=True, timeout=120,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip


def _session(tmp: Path) -> str:
    """A stored session (default composition, no telemetry row): one tool call, two requests."""
    workspace = tmp / "ws"
    workspace.mkdir()
    script = tmp / "script.json"
    call = {"name": "bash", "id": "call-1",
            "arguments": {"command": "echo ran", "description": "say it"}}  # fmt: skip
    script.write_text(json.dumps({"responses": [
        {"text": "Working.", "tool_calls": [call]}, {"text": "Finished."}]}))  # fmt: skip
    done = _run(tmp, "run", "go", "--model", f"scripted:{script}", "--config",
                str(REPO / "configs" / "default.yml"), "--workspace", str(workspace), "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    session_id: str = json.loads(done.stdout)["sessionId"]
    return session_id


def test_export_otel_sends_the_stored_turn_to_an_otlp_receiver(
    tmp_path: Path,
    receiver: Receiver,  # noqa: F811
) -> None:
    session_id = _session(tmp_path)
    assert receiver.spans == []  # the composition has no telemetry row: nothing live
    env = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.endpoint}
    exported = _run(tmp_path, "sessions", "export-otel", session_id, env=env)
    assert exported.returncode == 0, exported.stderr
    assert "2 chat" in exported.stderr  # the span counts, on stderr
    names = sorted(s.name for s in receiver.spans)
    assert names == ["chat scripted", "chat scripted", "execute_tool bash", "invoke_agent dsh"]
    root = next(s for s in receiver.spans if s.parent == "")
    assert root.attributes["gen_ai.conversation.id"] == session_id
    assert all(s.trace_id == root.trace_id for s in receiver.spans)
    assert all(s.parent == root.span_id for s in receiver.spans if s is not root)


def test_export_otel_stdout_prints_one_json_span_per_line_with_the_cost(tmp_path: Path) -> None:
    session_id = _session(tmp_path)
    # The composition's token-meter row prices the scripted model: $1M per million tokens, so
    # each chat span's dsh.cost.usd is its token count in dollars (10 input + the output).
    config = tmp_path / "priced.yml"
    config.write_text(
        (REPO / "configs" / "default.yml")
        .read_text()
        .replace(
            "- id: token-meter\n  name: token-meter\n",
            "- id: token-meter\n  name: token-meter\n  config:\n    prices:\n"
            "      scripted: {input: 1000000, output: 1000000}\n",
        )
    )
    assert "scripted: {input" in config.read_text()
    printed = _run(
        tmp_path, "sessions", "export-otel", session_id, "--stdout", "--config", str(config)
    )
    assert printed.returncode == 0, printed.stderr
    spans: list[dict[str, Any]] = [json.loads(line) for line in printed.stdout.splitlines()]
    assert sorted(s["name"] for s in spans) == [
        "chat scripted", "chat scripted", "execute_tool bash", "invoke_agent dsh"]  # fmt: skip
    for span in spans:
        if span["name"] == "chat scripted":
            attributes = span["attributes"]
            tokens = (
                attributes["gen_ai.usage.input_tokens"] + attributes["gen_ai.usage.output_tokens"]
            )
            assert attributes["dsh.cost.usd"] == pytest.approx(tokens)


def test_export_otel_without_opentelemetry_names_the_extra(tmp_path: Path) -> None:
    session_id = _session(tmp_path)
    argv = ["sessions", "export-otel", session_id, "--root", str(tmp_path / "sessions")]
    code = (
        "import sys; sys.modules['opentelemetry'] = None\n"  # importing the SDK now fails
        f"from dsh_host._cli import main; sys.exit(main({argv!r}))"
    )
    env = {k: v for k, v in os.environ.items() if k != "DSH_SESSION_ROOT"}
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert "pip install 'dsh-harness[otel]'" in result.stderr

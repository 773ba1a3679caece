"""SIGKILL in the middle of a model stream, then ``dsh resume``, for every provider adapter.

The real ``dsh`` runs a turn against the loopback server, which streams part of an answer and
then holds the response open; the process is killed there (the stream is mid-way: every byte
the server sent is on the wire, no ``finish`` came). ``dsh sessions verify`` must find the log
recoverable or intact, never corrupt; ``dsh resume ID PROMPT`` must repair it and run a new turn
on the same adapter to completion; the killed stream's partial text must not appear as an
answer in the log (nothing the model did not finish is recorded as said).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from cli.cli_helpers import dsh, json_lines

from .provider_wires import WIRES, Wire
from .sse_server import SseServer

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow

#: how each adapter finds its endpoint and key in the environment (its row's defaults)
ENDPOINT_ENV = {
    "openai-compatible": ("DEEPSEEK_BASE_URL", "DEEPSEEK_API_KEY"),
    "anthropic": ("ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY"),
    "openai-responses": ("OPENAI_BASE_URL", "OPENAI_API_KEY"),
    # LiteLLM's openai/ route: the row's OpenAI client reads the same two variables
    "litellm": ("OPENAI_BASE_URL", "OPENAI_API_KEY"),
}


@pytest.mark.parametrize("wire", WIRES, ids=[w.id for w in WIRES])
def test_sigkill_mid_stream_then_resume(wire: Wire, tmp_path: Path) -> None:
    root, workspace = tmp_path / "sessions", tmp_path / "ws"  # side by side, never nested
    workspace.mkdir()
    base_env, key_env = ENDPOINT_ENV[wire.id]
    spec = ["--model", f"{wire.id}:{wire.model}", "--root", str(root),
            "--config", str(REPO / "configs" / "default.yml")]
    output = tmp_path / "child.out"
    with SseServer([wire.hang(["half an ans"]), wire.text(["Resumed."], usage=(1, 1, 0))]
                   ) as server:
        env = {**os.environ, base_env: server.url, key_env: "crash-key"}
        env.pop("DSH_SESSION_ROOT", None)
        with output.open("wb") as sink:
            child = subprocess.Popen(
                [sys.executable, "-m", "dsh_host", "run", "hi", *spec,
                 "--workspace", str(workspace)],
                cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, stdout=sink, stderr=sink,
            )
        try:
            while not server.hanging.acquire(timeout=0.5):  # no deadline but the test's own
                assert child.poll() is None, output.read_text()
            child.send_signal(signal.SIGKILL)
            assert child.wait(timeout=60) == -signal.SIGKILL
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        [listed] = json_lines(dsh("sessions", "list", "--json", "--root", str(root),
                                  cwd=tmp_path).stdout)
        session_id = listed["sessionId"]
        verify = dsh("sessions", "verify", session_id, "--root", str(root), cwd=tmp_path)
        assert verify.returncode in (0, 1), verify.stdout + verify.stderr  # never corrupt
        resumed = dsh("resume", session_id, "go on", *spec, "--json", cwd=tmp_path,
                      env={base_env: server.url, key_env: "crash-key"})
        assert len(server.requests) == 2
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "Traceback" not in resumed.stderr
    payload = json.loads(resumed.stdout)
    assert payload["turnEnd"] == {"kind": "completed"}
    assert payload["finalText"] == "Resumed."
    events = json_lines(dsh("sessions", "show", session_id, "--view", "events", "--json",
                            "--root", str(root), cwd=tmp_path).stdout)
    said = [json.dumps(e["data"]) for e in events if e["type"] == "assistant/message"]
    assert not any("half an ans" in text for text in said), said
    assert any("Resumed." in text for text in said)
    # the killed request was durable before the adapter saw it (the checkpoint policy)
    assert sum(e["type"] == "request/header" for e in events) >= 2

"""`dsh serve` continues a session under its recorded run terms (real processes: a `dsh run`
that creates the session, a `dsh serve` that runs the next turn over HTTP on loopback)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]

# slow: a server process and CLI processes
pytestmark = pytest.mark.slow

TOUCH = [
    {
        "tool_calls": [
            {
                "id": "c-touch",
                "name": "bash",
                "arguments": {"command": "touch made-here", "description": "x"},
            }
        ]
    },
    {"text": "tried"},
]


class Setup:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.workspace = tmp / "ws"
        self.workspace.mkdir()
        self.root = tmp / "sessions"
        self.config = tmp / "dsh.yml"
        self.config.write_text((REPO / "configs" / "default.yml").read_text())
        self.script = tmp / "script.json"
        self.script.write_text(json.dumps({"responses": TOUCH}))
        self.env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("DSH_SERVE_TOKEN", "DSH_SESSION_ROOT", "DSH_CONFIG")
        }
        self.env["XDG_CONFIG_HOME"] = str(tmp / "xdg-config")

    def dsh(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "dsh_host",
                *args,
                "--config",
                str(self.config),
                "--root",
                str(self.root),
            ],
            cwd=self.tmp,
            env=self.env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )


@contextlib.contextmanager
def _serve(setup: Setup, *flags: str, name: str = "serve") -> Iterator[str]:
    """A ``dsh serve`` process on the setup's store and workspace; its URL."""
    with open(setup.tmp / f"{name}.stderr", "w") as stderr:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dsh_host",
                "serve",
                "--root",
                str(setup.root),
                "--workspace",
                str(setup.workspace),
                "--port",
                "0",
                *flags,
            ],
            cwd=setup.tmp,
            env=setup.env,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("dsh serve: listening on "), (
            line + (setup.tmp / f"{name}.stderr").read_text()
        )
        yield line.split()[4].rstrip("/")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Setup, str]]:
    setup = Setup(tmp_path)
    with _serve(setup, "--config", str(setup.config), "--model", f"scripted:{setup.script}") as url:
        yield setup, url


def _wait_turn_end(client: httpx.Client, session_id: str, turn: int) -> dict[str, Any]:
    while True:  # no deadline but the test's own
        session = client.get(f"/sessions/{session_id}").json()
        end = session["lastTurnEnd"]
        if session["status"] != "running" and end is not None and end["turn"] == turn:
            return dict(session)
        time.sleep(0.05)


def test_serve_runs_a_cli_session_under_its_recorded_sandbox(
    served: tuple[Setup, str],
) -> None:
    """Before: the server's host ran every session under the composition's workspace-write, so
    a turn on a session `dsh run --sandbox read-only` created wrote the file."""
    setup, url = served
    first = setup.tmp / "first.json"
    first.write_text(json.dumps({"responses": [{"text": "made by the CLI"}]}))
    made = setup.dsh(
        "run",
        "--workspace",
        str(setup.workspace),
        "--model",
        f"scripted:{setup.script}",
        "--sandbox",
        "read-only",
        "--json",
        "hi",
    )
    assert made.returncode == 0, made.stderr
    session_id = json.loads(made.stdout.splitlines()[-1])["sessionId"]
    with httpx.Client(base_url=url, timeout=60) as client:
        assert client.get(f"/sessions/{session_id}").json()["refused"] is None
        turn = client.post(f"/sessions/{session_id}/turns", json={"prompt": "make a file"})
        assert turn.status_code == 202, turn.text
        _wait_turn_end(client, session_id, turn.json()["turn"])
        events = [
            json.loads(line)
            for line in client.get(f"/sessions/{session_id}/events").text.splitlines()
        ]
    assert not (setup.workspace / "made-here").exists()  # read-only, as recorded
    results = [e for e in events if e["type"] == "tool/result"]
    calls = [
        block
        for e in events
        if e["type"] == "assistant/message"
        for block in e["data"]["message"]["content"]
        if block.get("type") == "tool-call"
    ]
    # the script's id was used by the CLI's turn already: the harness minted a new one and kept
    # the provider's as providerId
    assert calls[-1].get("providerId", calls[-1]["id"]) == "c-touch"
    assert [r["data"]["message"]["source"]["callId"] for r in results[-1:]] == [calls[-1]["id"]]
    assert len([e for e in events if e["type"] == "run/terms"]) == 1  # nothing overridden


def test_serve_records_terms_the_cli_continues_under(served: tuple[Setup, str]) -> None:
    setup, url = served
    with httpx.Client(base_url=url, timeout=60) as client:
        created = client.post("/sessions", json={}).json()
        session_id = created["id"]
        (terms,) = [
            json.loads(line)
            for line in client.get(f"/sessions/{session_id}/events").text.splitlines()
        ]
    assert terms["type"] == "run/terms" and terms["ignorable"] is True
    data = terms["data"]
    assert data["by"] == "dsh serve" and data["workspace"] == str(setup.workspace)
    assert data["approval"] == {"policy": "ask", "unanswered": "defer"}
    assert data["model"]["spec"] == f"scripted:{setup.script}"
    # the CLI continues it with the recorded model (no --model), composition and sandbox, and
    # logs nothing: nothing changed
    proc = setup.dsh("resume", session_id, "make a file", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1])["finalText"] == "tried"
    assert (setup.workspace / "made-here").exists()  # workspace-write, as recorded
    shown = setup.dsh("sessions", "show", session_id, "--view", "events", "--json")
    kinds = [json.loads(line)["type"] for line in shown.stdout.splitlines()]
    assert kinds.count("run/terms") == 1


def test_serve_refuses_a_session_of_another_composition_and_writes_nothing(
    served: tuple[Setup, str],
) -> None:
    """Before: the server ran any stored session under its own composition."""
    setup, url = served
    other = setup.tmp / "other.yml"
    other.write_text(
        setup.config.read_text().replace(
            "- id: repeat-tool-reminder\n  name: repeat-tool-reminder\n", ""
        )
    )
    made = subprocess.run(
        [
            sys.executable,
            "-m",
            "dsh_host",
            "run",
            "--config",
            str(other),
            "--root",
            str(setup.root),
            "--workspace",
            str(setup.workspace),
            "--model",
            f"scripted:{setup.script}",
            "--sandbox",
            "read-only",
            "--json",
            "hi",
        ],
        cwd=setup.tmp,
        env=setup.env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert made.returncode == 0, made.stderr
    session_id = json.loads(made.stdout.splitlines()[-1])["sessionId"]
    logs = sorted(setup.root.rglob("session.v3.jsonl*"))
    before = [p.read_bytes() for p in logs]
    with httpx.Client(base_url=url, timeout=60) as client:
        refused = client.get(f"/sessions/{session_id}").json()["refused"]
        assert refused["code"] == "TERMS_REFUSED" and str(other) in refused["message"]
        turn = client.post(f"/sessions/{session_id}/turns", json={"prompt": "go"})
        assert turn.status_code == 409, turn.text
        assert turn.json()["error"]["code"] == "TERMS_REFUSED"
    assert [p.read_bytes() for p in logs] == before


def test_serve_without_model_takes_the_compositions_model_or_refuses(tmp_path: Path) -> None:
    """Before: `dsh serve` without --model created every new session on the built-in demo
    script (whose bash calls then ran in the served workspace). Now a new session takes the
    composition's model; a composition that names none refuses to create one (400 NO_MODEL,
    nothing stored), and the demo runs only when named."""
    setup = Setup(tmp_path)
    named = tmp_path / "named.yml"
    named.write_text(
        f"- id: model\n  name: llm-scripted\n  config:\n    path: {setup.script}\n"
        + setup.config.read_text().replace(
            "- id: agent\n  name: agent\n  config:\n",
            "- id: agent\n  name: agent\n  config:\n    provider: scripted\n"
            "    model: scripted\n",
        )
    )
    with _serve(
        setup, "--config", str(setup.config), "--composition", f"named={named}"
    ) as url, httpx.Client(base_url=url, timeout=60) as client:
        refused = client.post("/sessions", json={"id": "no-model"})
        assert refused.status_code == 400, refused.text
        error = refused.json()["error"]
        assert error["code"] == "NO_MODEL" and "--model" in error["message"], error
        assert client.get("/sessions/no-model").status_code == 404
        created = client.post("/sessions", json={"composition": "named"})
        assert created.status_code == 201, created.text
        session_id = created.json()["id"]
        (terms,) = [
            json.loads(line)
            for line in client.get(f"/sessions/{session_id}/events").text.splitlines()
        ]
        assert terms["data"]["model"]["provider"] == "scripted", terms
        turn = client.post(f"/sessions/{session_id}/turns", json={"prompt": "make a file"})
        assert turn.status_code == 202, turn.text
        ended = _wait_turn_end(client, session_id, turn.json()["turn"])
    assert ended["lastTurnEnd"]["kind"] == "completed", ended
    # the composition's script ran (its call made the file), not the demo (which writes notes)
    assert sorted(p.name for p in setup.workspace.iterdir()) == ["made-here"]
    with _serve(
        setup, "--config", str(setup.config), "--model", "demo", name="demo"
    ) as url, httpx.Client(base_url=url, timeout=60) as client:
        created = client.post("/sessions", json={})
        assert created.status_code == 201, created.text
        (terms,) = [
            json.loads(line)
            for line in client.get(f"/sessions/{created.json()['id']}/events").text.splitlines()
        ]
    assert terms["data"]["model"]["spec"] == "demo"  # named: it runs, and it is recorded

"""A session a real SIGKILL interrupted, repaired by ``dsh resume``: export, verify, effects.

Crash repair's closers are the one place a ``tool/result`` may answer a call with no durable
``tool/call`` (``TOOL_NOT_STARTED``): the verifier must accept that honest answer and still
refuse a result that claims success without a recorded call. The model asks for two ``bash``
calls; the first writes a marker and sleeps, the test kills ``dsh run`` (its whole process
group) once the marker exists, so the first call is left ``TOOL_OUTCOME_UNKNOWN`` and the second
``TOOL_NOT_STARTED``. The effects ledger of that branch says the same, with the idempotency key
the killed body was given (it wrote ``$DSH_IDEMPOTENCY_KEY`` to the marker).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from approval.deferred_env import DSH, REPO, script
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from dsh_host._session.audit import attest, verify_export
from dsh_host._session.effects import effects_after

pytestmark = pytest.mark.slow


def bash(call_id: str, command: str) -> dict[str, object]:
    return {
        "id": call_id,
        "name": "bash",
        "arguments": {"command": command, "description": call_id},
    }


def test_a_killed_and_repaired_session_verifies(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    config = tmp_path / "dsh.yml"
    config.write_text((REPO / "configs" / "default.yml").read_text())
    model = script(
        tmp_path / "model.json",
        [
            {
                "tool_calls": [
                    bash(
                        "call-slow",
                        'printf %s "$DSH_IDEMPOTENCY_KEY" > key.tmp; mv key.tmp started; sleep 600',
                    ),
                    bash("call-next", "touch second"),
                ]
            },
            {"text": "never reached"},
        ],
    )
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "config")}
    common = ["--config", str(config), "--root", str(tmp_path / "sessions")]
    run = subprocess.Popen(
        [
            *DSH,
            "run",
            "--workspace",
            str(workspace),
            "--model",
            f"scripted:{model}",
            "--approval",
            "never",
            "--json",
            "go",
            *common,
        ],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        # Wait for the first body to run (no timing asserted: the wait ends on the file).
        while not (workspace / "started").exists():
            assert run.poll() is None, run.communicate()
            subprocess.run(["sleep", "0.05"], check=True)
    finally:
        os.killpg(run.pid, signal.SIGKILL)
        run.communicate()
    assert not (workspace / "second").exists()
    listing = subprocess.run(
        [*DSH, "sessions", "list", "--json", *common],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    (session_id,) = [json.loads(line)["sessionId"] for line in listing.stdout.splitlines()]
    resume = subprocess.run(
        [*DSH, "resume", session_id, *common],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert resume.returncode == 0, resume.stdout + resume.stderr
    export = subprocess.run(
        [*DSH, "sessions", "export", session_id, "--attest", *common],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert export.returncode == 0, export.stderr
    data = export.stdout
    events = [json.loads(line)["event"] for line in data.splitlines()[1:-1]]
    codes = {
        e["data"]["message"]["source"]["callId"]: e["data"]["error"]["code"]
        for e in events
        if e["type"] == "tool/result"
    }
    assert codes == {"call-slow": "TOOL_OUTCOME_UNKNOWN", "call-next": "TOOL_NOT_STARTED"}
    assert [e["data"]["callId"] for e in events if e["type"] == "tool/call"] == ["call-slow"]
    report = verify_export(data)
    assert report.ok, [str(p) for p in report.problems]
    # The effects ledger of a fork made before the first step: the killed call may have run
    # (and its key is the one its body saw), the second never started.
    (start,) = [e["seq"] for e in events if e["type"] == "turn/start"]
    ledger = effects_after(session_id, events, start)
    assert [(e.call_id, e.status, e.tool) for e in ledger] == [
        ("call-slow", "unknown", "bash"), ("call-next", "not-started", "bash"),
    ]  # fmt: skip
    assert ledger[0].idempotency_key == (workspace / "started").read_text()
    assert ledger[1].call_seq is None and ledger[0].call_seq is not None
    assert effects_after(session_id, events, events[-1]["seq"]) == []
    # The same closer claiming success is a result without a call.
    for event in events:
        if event["type"] == "tool/result" and event["data"]["error"]["code"] == "TOOL_NOT_STARTED":
            event["data"]["message"]["content"][0]["isError"] = False
            at = event["seq"]
    header = json.loads(data.splitlines()[0])["header"]
    forged = attest(session_id, header, events, Ed25519PrivateKey.generate())
    assert [(p.seq, p.kind) for p in verify_export(forged).problems] == [
        (at, "result-without-call")
    ]

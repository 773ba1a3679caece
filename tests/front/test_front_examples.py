"""The examples in ``examples/`` run as written (scripted model, fresh directory)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run_example(name: str, cwd: Path) -> str:
    env = {key: value for key, value in os.environ.items() if key != "DSH_EXAMPLE_MODEL"}
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / name)], cwd=cwd, capture_output=True, text=True,
        timeout=120, env=env,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    return result.stdout


def test_typed_tools_example(tmp_path: Path) -> None:
    out = run_example("typed_tools.py", tmp_path)
    assert '<- {"value":7.77,"unit":"mi"}' in out
    assert '<- Error: invalid arguments: "unit.to" must be one of ["km", "mi"]' in out
    assert '<- {"value":4.83,"unit":"km"}' in out
    assert "turn ended: completed" in out
    assert "answer: 12.5 km is 7.77 mi, and 3 mi is 4.83 km." in out


def test_structured_output_example(tmp_path: Path) -> None:
    out = run_example("structured_output.py", tmp_path)
    lines = out.splitlines()
    assert lines[0] == "high: Fix the flaky upload test (2 days) ['tests', 'ci']"
    assert lines[1].startswith('model read: Error: invalid arguments: missing required property')
    assert lines[2] == "model read: Final result accepted."


def test_idempotent_charge_example_charges_once(tmp_path: Path) -> None:
    out = run_example("idempotent_charge.py", tmp_path)
    assert "approval for charge" in out and ": no" in out
    ledger = [json.loads(line) for line in (tmp_path / "ledger.jsonl").read_text().splitlines()]
    session_id = out.split("session ", 1)[1].split(":", 1)[0]
    scope = f"{len(session_id)}:{session_id}:call_1_1"  # the call's key: session + call id
    key = "dsh-" + hashlib.sha256(scope.encode()).hexdigest()[:32]
    assert ledger == [{"key": key, "customer": "cus_42", "cents": 1999}]
    assert len(list((tmp_path / ".dsh" / "sessions").rglob("session.v3.jsonl.zstd"))) == 1


def test_reconciled_payment_example_pays_once_and_reconciles(tmp_path: Path) -> None:
    """A real child process is SIGKILLed after the loopback API took the payment; the resume's
    reconciler finds it by the idempotency key, and nothing is paid twice (D26)."""
    out = run_example("reconciled_payment.py", tmp_path)
    assert out.splitlines() == [
        "the agent process died: signal 9",
        "payments taken: 1",
        "reconciled call_1_1 (pay): done",
        "The payment of $42.00 to acme went through once; nothing to retry.",
        "payments taken: 1",
    ]

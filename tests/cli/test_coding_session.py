"""A scripted coding session through the real ``dsh run`` (issue 23): in a copy of a small
Python repository with a bug and failing tests, the model lists the tree, greps for the
function, reads the file, runs the tests (they fail), fixes the bug with ``edit_file`` and runs
them again (they pass). Judged from the host: the file on disk is fixed, the tests pass when the
host runs them, and the log holds every call and its result, in order, with the model-visible
texts, and the workspace instructions (``AGENTS.md``) in the runtime context.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from .cli_helpers import REPO, dsh, json_lines

SAMPLE = REPO / "tests" / "fixtures" / "coding-sample"
BUG = "return price * (1 - percent)"
FIX = "return price * (1 - percent / 100)"
#: The sandboxed bash runs this interpreter (absolute: the sandbox's PATH may lack a python);
#: -B: no __pycache__ written into the workspace.
TESTS = f"{sys.executable} -B -m unittest"


def script(path: Path) -> Path:
    def step(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return {"tool_calls": [{"name": name, "arguments": arguments}]}

    responses = [
        step("list_dir", {}),
        step("grep", {"pattern": r"def discounted", "glob": "*.py"}),
        step("read_file", {"path": "shop/pricing.py"}),
        step("bash", {"command": TESTS, "description": "Run the test suite"}),
        step("edit_file", {"path": "shop/pricing.py", "old_string": BUG, "new_string": FIX}),
        step("bash", {"command": TESTS, "description": "Run the test suite again"}),
        {"text": "Fixed: discounted() now treats percent as a percentage; the tests pass."},
    ]
    path.write_text(json.dumps({"responses": responses}))
    return path


def test_a_scripted_session_reads_greps_edits_and_runs_the_tests(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(SAMPLE, repo)
    before = subprocess.run([*TESTS.split()], cwd=repo, capture_output=True, text=True)
    assert before.returncode == 1 and "FAILED (failures=2)" in before.stderr  # the bug is real

    run = dsh(
        "run", "fix the failing tests", "--model", f"scripted:{script(tmp_path / 's.json')}",
        "--workspace", str(repo), "--json", cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads(run.stdout)
    assert result["turnEnd"]["kind"] == "completed", result

    assert FIX in (repo / "shop" / "pricing.py").read_text()
    after = subprocess.run([*TESTS.split()], cwd=repo, capture_output=True, text=True)
    assert after.returncode == 0, after.stderr
    assert not list(repo.rglob("*.tmp")), "an atomic write left its temporary file"

    events = json_lines(
        dsh(
            "sessions", "show", result["sessionId"], "--view", "events", "--json", cwd=tmp_path
        ).stdout
    )
    calls = [e["data"] for e in events if e["type"] == "tool/call"]
    results = [e["data"] for e in events if e["type"] == "tool/result"]
    names = ["list_dir", "grep", "read_file", "bash", "edit_file", "bash"]
    assert [c["name"] for c in calls] == names
    answered = [r["message"]["content"][0] for r in results]
    assert [block["toolCallId"] for block in answered] == [c["callId"] for c in calls]
    assert not any(block.get("isError") for block in answered), answered

    model = json_lines(
        dsh(
            "sessions", "show", result["sessionId"], "--view", "model", "--json", cwd=tmp_path
        ).stdout
    )
    seen = [
        block.get("text", "")
        for message in model
        for part in message["content"]
        for block in ([part] if part["type"] != "tool-result" else part.get("content", []))
    ]
    shown = "\n".join(seen)
    assert "./\n  .gitignore\n  AGENTS.md\n  shop/\n" in shown  # list_dir
    assert "shop/pricing.py:4: def discounted(price: float, percent: float) -> float:" in shown
    assert "4: def discounted(price: float, percent: float) -> float:" in shown  # read_file
    assert "FAILED (failures=2)" in shown and "[exit code: 1]" in shown  # the first test run
    assert f"-    {BUG}\n+    {FIX}" in shown  # edit_file's diff
    assert "\nOK\n" in shown or shown.rstrip().endswith("OK")  # the second run
    assert "Instructions from: AGENTS.md" in shown  # agent-instructions, in the default rows

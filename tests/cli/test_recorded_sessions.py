"""``dsh_host.testing.recorded_sessions``: a directory of recorded sessions as pytest cases, each
checked by the harness replay (D32). Two sessions are recorded by the real CLI; the workspace
instructions of one change; a pytest run (a subprocess, as a user's suite) over the directory has
exactly one failure, naming that session and the part that differs."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from .cli_helpers import REPO, dsh

SUITE = textwrap.dedent('''
    import pytest
    from dsh_host.testing import RecordedSession, recorded_sessions

    CASES = recorded_sessions({root!r}, config={config!r})

    @pytest.mark.parametrize("case", CASES, ids=str)
    def test_the_build_still_asks_what_was_recorded(case: RecordedSession) -> None:
        case.check()

    @pytest.mark.parametrize("case", CASES, ids=str)
    def test_the_model_still_answers_as_recorded(case: RecordedSession) -> None:
        case.check_model({model!r})
''')


def test_one_planted_change_fails_exactly_its_own_case(tmp_path: Path) -> None:
    config, root = tmp_path / "dsh.yml", tmp_path / "recorded"
    config.write_text((REPO / "configs" / "default.yml").read_text())
    script = tmp_path / "s.json"
    script.write_text(json.dumps({"responses": [{"text": "ok"}]}))
    for name in ("steady", "planted"):
        workspace = tmp_path / name
        workspace.mkdir()
        (workspace / "AGENTS.md").write_text("Answer briefly.\n")
        done = dsh("run", "hi", "--session", name, "--new", "--model", f"scripted:{script}",
                   "--workspace", str(workspace), "--config", str(config), "--root", str(root),
                   cwd=tmp_path)  # fmt: skip
        assert done.returncode == 0, done.stderr
    (tmp_path / "planted" / "AGENTS.md").write_text("Answer at length.\n")
    suite = tmp_path / "test_recorded.py"
    suite.write_text(SUITE.format(root=str(root), config=str(config), model=f"scripted:{script}"))
    run = pytest_run(suite, "-k", "build_still_asks")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "1 failed, 1 passed" in run.stdout, run.stdout
    assert "FAILED test_recorded.py::test_the_build_still_asks_what_was_recorded[planted]" in (
        run.stdout
    )
    assert "recorded session planted is derived differently by this build" in run.stdout
    assert "turn 1 step 1: runtime context differs" in run.stdout


def pytest_run(suite: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """A user's pytest run over ``suite`` (a subprocess in its directory)."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(suite), *args],
        cwd=suite.parent, capture_output=True, text=True, timeout=300,  # a hang guard only
    )  # fmt: skip


def test_a_model_replay_case_fails_on_a_divergence_and_leaves_the_directory(
    tmp_path: Path,
) -> None:
    config, root = tmp_path / "dsh.yml", tmp_path / "recorded"
    config.write_text((REPO / "configs" / "default.yml").read_text())
    recorded = tmp_path / "s.json"
    recorded.write_text(json.dumps({"responses": [{"text": "ok"}]}))
    (tmp_path / "ws").mkdir()
    done = dsh("run", "hi", "--session", "one", "--new", "--model", f"scripted:{recorded}",
               "--workspace", str(tmp_path / "ws"), "--config", str(config), "--root", str(root),
               cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    stored = sorted(p.relative_to(root) for p in root.rglob("*"))
    suite = tmp_path / "test_recorded.py"
    suite.write_text(SUITE.format(root=str(root), config=str(config), model=f"scripted:{recorded}"))
    same = pytest_run(suite, "-k", "model_still_answers")
    assert same.returncode == 0, same.stdout + same.stderr
    assert "1 passed" in same.stdout
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"responses": [{"text": "not ok"}]}))
    suite.write_text(SUITE.format(root=str(root), config=str(config), model=f"scripted:{other}"))
    diverged = pytest_run(suite, "-k", "model_still_answers")
    assert diverged.returncode == 1, diverged.stdout + diverged.stderr
    assert "recorded session one diverges with scripted:" in diverged.stdout
    assert "'kind': 'different-final-text'" in diverged.stdout
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == stored  # no replay child here

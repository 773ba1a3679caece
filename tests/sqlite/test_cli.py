"""``dsh`` over configs/sqlite.yml, as a user runs it: --root puts the database there, the
stored session lists and shows, and a root inside the workspace is refused at boot (D15)."""

from __future__ import annotations

import json
from pathlib import Path

from cli.cli_helpers import dsh

REPO = Path(__file__).resolve().parents[2]
CONFIG = str(REPO / "configs" / "sqlite.yml")


def script(path: Path) -> str:
    path.write_text(json.dumps({"responses": [{"text": "stored in sqlite"}]}))
    return f"scripted:{path}"


def test_a_run_is_stored_in_the_sqlite_file_under_root_and_lists(tmp_path: Path) -> None:
    workspace, root = tmp_path / "ws", tmp_path / "store"
    workspace.mkdir()
    model = script(tmp_path / "s.json")
    run = dsh("run", "hi", "--config", CONFIG, "--root", str(root), "--workspace",
              str(workspace), "--model", model, "--session", "sq-1", "--new", cwd=tmp_path)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert (root / "sessions.sqlite3").is_file()
    listed = dsh(
        "sessions", "list", "--config", CONFIG, "--root", str(root), "--json", cwd=tmp_path
    )
    assert listed.returncode == 0, listed.stderr
    assert "sq-1" in listed.stdout
    shown = dsh("sessions", "show", "sq-1", "--config", CONFIG, "--root", str(root),
                "--view", "events", "--json", cwd=tmp_path)  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert "stored in sqlite" in shown.stdout


def test_a_database_inside_the_workspace_is_refused_at_boot(tmp_path: Path) -> None:
    run = dsh("run", "hi", "--config", CONFIG, "--root", ".dsh/sessions",
              "--model", script(tmp_path / "s.json"), cwd=tmp_path)  # fmt: skip
    assert run.returncode == 2, run.stderr
    assert f"the session root {tmp_path}/.dsh/sessions overlaps {tmp_path} " in run.stderr
    assert not (tmp_path / ".dsh" / "sessions" / "sessions.sqlite3").exists()

"""Issue 15 class 8 / D15: the session log lives outside every writable root.

With the old default (``./.dsh/sessions`` and workspace ``.``) a workspace-write ``bash`` call
could rewrite the log that records it. Now the default root is the user's data directory,
grouped by project, and a root that the running row's tools could write is refused at boot.
Everything runs the real ``dsh``, as root, and is judged from the host (the log's bytes).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from .cli_helpers import REPO, dsh, json_lines

DEFAULT = (REPO / "configs" / "default.yml").read_text()
BACKENDS = ("bubblewrap", "landlock")


def composition(tmp_path: Path, backend: str) -> Path:
    """The shipped default with the sandbox backend forced (a named file, outside the work)."""
    row = "- id: sandbox\n  name: sandbox-local\n  config:\n    network: deny\n"
    assert row in DEFAULT
    path = tmp_path / f"{backend}.yml"
    path.write_text(DEFAULT.replace(row, row + f"    backend: {backend}\n"))
    return path


def script(path: Path, command: str | None = None) -> Path:
    responses: list[dict[str, object]] = []
    if command is not None:
        responses.append({"tool_calls": [{"id": "call-1", "name": "bash", "arguments": {
            "command": command, "description": "touch the session store"}}]})
    responses.append({"text": "done"})
    path.write_text(json.dumps({"responses": responses}))
    return path


def digests(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != "session.lock"
    }


def tamper_command(root: Path) -> str:
    """Append to, and overwrite in place, every file of the store; create a fake session."""
    return (
        f"for f in $(find {root} -type f -name 'session*.jsonl*'); do "
        'printf X >> "$f"; '
        'dd if=/dev/zero of="$f" bs=1 count=8 seek=16 conv=notrunc 2>&1; done; '
        f"mkdir -p {root}/--planted--/fake && echo {{}} > {root}/--planted--/fake/session.v3.jsonl"
    )


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["workspace-write", "read-only"])
def test_a_tool_cannot_touch_the_default_session_store(
    tmp_path: Path, backend: str, mode: str
) -> None:
    """The default root ($XDG_DATA_HOME/dsh/sessions; the tests' XDG dirs are outside /tmp, as
    ~/.local/share is) is neither granted by bubblewrap nor by Landlock: a call that tries to
    rewrite every log of the store leaves every byte as it was."""
    config = composition(tmp_path, backend)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    env: dict[str, str] = {}
    root = Path(os.environ["XDG_DATA_HOME"]) / "dsh" / "sessions"
    first = dsh("run", "hello", "--config", str(config), "--workspace", str(workspace),
                "--model", f"scripted:{script(tmp_path / 'hello.json')}", "--json",
                cwd=tmp_path, env=env)
    assert first.returncode == 0, first.stderr
    before = digests(root)
    assert len(before) == 1, before
    tamper = script(tmp_path / "tamper.json", tamper_command(root))
    second = dsh("run", "tamper", "--config", str(config), "--workspace", str(workspace),
                 "--sandbox", mode, "--model", f"scripted:{tamper}", "--json",
                 cwd=tmp_path, env=env)
    assert second.returncode == 0, second.stderr
    after = digests(root)
    assert {k: v for k, v in after.items() if k in before} == before, "a stored log changed"
    assert not (root / "--planted--").exists()
    for session_id in (json.loads(first.stdout)["sessionId"],
                       json.loads(second.stdout)["sessionId"]):
        verify = dsh("sessions", "verify", session_id, "--json", cwd=tmp_path, env=env)
        assert verify.returncode == 0, verify.stdout + verify.stderr


def test_control_unconfined_the_same_call_rewrites_the_store(tmp_path: Path) -> None:
    """The same call under danger-full-access (no sandbox) does change the stored log, so the
    confined runs above prove the sandbox, not a broken command."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    env: dict[str, str] = {}
    root = Path(os.environ["XDG_DATA_HOME"]) / "dsh" / "sessions"
    first = dsh("run", "hello", "--workspace", str(workspace),
                "--model", f"scripted:{script(tmp_path / 'hello.json')}", "--json",
                cwd=tmp_path, env=env)
    assert first.returncode == 0, first.stderr
    before = digests(root)
    tamper = script(tmp_path / "tamper.json", tamper_command(root))
    dsh("run", "tamper", "--workspace", str(workspace), "--sandbox", "danger-full-access",
        "--model", f"scripted:{tamper}", "--json", cwd=tmp_path, env=env)
    after = digests(root)
    (stored,) = before
    assert after[stored] != before[stored], "control: the unconfined call must reach the log"
    assert (root / "--planted--" / "fake" / "session.v3.jsonl").exists()


@pytest.mark.parametrize("mode", ["workspace-write", "read-only", "danger-full-access"])
def test_the_old_layout_a_root_inside_the_workspace_is_refused_at_boot(
    tmp_path: Path, mode: str
) -> None:
    """``--root ./.dsh/sessions`` with workspace ``.``: refused before anything runs, naming
    both paths and the fix (a read-only row's call may be escalated; write_file writes there)."""
    marker = tmp_path / "ran"
    result = dsh("run", "hi", "--root", ".dsh/sessions", "--sandbox", mode,
                 "--model", f"scripted:{script(tmp_path / 's.json', f'touch {marker}')}",
                 cwd=tmp_path)
    assert result.returncode == 2
    line = next(line for line in result.stderr.splitlines() if line.startswith("dsh: error:"))
    assert "did not activate" in line
    detail = result.stderr
    assert f"the session root {tmp_path}/.dsh/sessions overlaps {tmp_path} " in detail
    assert "--root DIR" in detail and "--workspace DIR" in detail
    assert not marker.exists()
    assert not (tmp_path / ".dsh" / "sessions").exists(), "nothing may be written"


def test_under_landlock_a_root_in_host_tmp_is_refused_but_not_under_bubblewrap(
    tmp_path: Path
) -> None:
    """Landlock's workspace-write grants the host /tmp; bubblewrap mounts a private one. The
    refusal follows what the backend really grants."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    root = tmp_path / "sessions"  # under /tmp
    hello = script(tmp_path / "hello.json")
    landlock = dsh("run", "hi", "--config", str(composition(tmp_path, "landlock")), "--root",
                   str(root), "--workspace", str(workspace), "--model", f"scripted:{hello}",
                   cwd=tmp_path)
    assert landlock.returncode == 2
    assert f"the session root {root} overlaps /tmp (writable by bash" in landlock.stderr
    bubblewrap = dsh("run", "hi", "--config", str(composition(tmp_path, "bubblewrap")), "--root",
                     str(root), "--workspace", str(workspace), "--model", f"scripted:{hello}",
                     "--json", cwd=tmp_path)
    assert bubblewrap.returncode == 0, bubblewrap.stderr


def test_sessions_are_grouped_by_project_and_found_from_anywhere(tmp_path: Path) -> None:
    """Default layout: $XDG_DATA_HOME/dsh/sessions/--<project key>--/<id>/; list, show, verify
    and resume find a session whatever the current directory (list covers every project)."""
    hello = script(tmp_path / "hello.json")
    ids = {}
    for name in ("alpha", "beta"):
        project = tmp_path / name
        project.mkdir()
        run = dsh("run", "hi", "--model", f"scripted:{hello}", "--json", cwd=project)
        assert run.returncode == 0, run.stderr
        ids[name] = json.loads(run.stdout)["sessionId"]
    root = Path(os.environ["XDG_DATA_HOME"]) / "dsh" / "sessions"
    for name, session_id in ids.items():
        key = "--" + str(tmp_path / name).strip("/").replace("/", "-") + "--"
        assert (root / key / session_id / "session.v3.jsonl.zstd").is_file()
    assert not (tmp_path / "alpha" / ".dsh").exists()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    listed = json_lines(dsh("sessions", "list", "--json", cwd=elsewhere).stdout)
    assert {e["sessionId"]: e["cwd"] for e in listed} == {
        ids[name]: str(tmp_path / name) for name in ids
    }
    assert dsh("sessions", "verify", ids["alpha"], cwd=elsewhere).returncode == 0
    assert dsh("sessions", "show", ids["beta"], cwd=elsewhere).returncode == 0
    resumed = dsh("resume", ids["alpha"], "again", "--model", f"scripted:{hello}", "--json",
                  cwd=elsewhere)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["turnEnd"] == {"kind": "completed"}


def test_dsh_session_root_overrides_the_default(tmp_path: Path) -> None:
    root = tmp_path / "chosen"
    project = tmp_path / "project"
    project.mkdir()
    run = dsh("run", "hi", "--model", f"scripted:{script(tmp_path / 'h.json')}", "--json",
              cwd=project, env={"DSH_SESSION_ROOT": str(root)})
    assert run.returncode == 0, run.stderr
    assert len(list(root.rglob("session.v3.jsonl.zstd"))) == 1
    assert not (Path(os.environ["XDG_DATA_HOME"]) / "dsh").exists()

"""The open-shape fixtures (issue 16): what DSH writes is read losslessly, what DSH refuses is
refused, and the files are what dsh's own writer writes.

See ``tests/fixtures/dsh-open-shapes/README.md`` and :mod:`.open_shapes`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from dsh_llm_openai_compatible.serialize import serialize_messages
from dsh_session_persistence_jsonl import JsonlSessionPersistence
from dsh_session_persistence_jsonl._frames import decompress_frame, scan_frames

from dsh_host._llm import LlmError
from dsh_host._persistence import persistence as persistence_errors
from dsh_host._session.events import event_to_builtins
from dsh_host._session.session import derive_messages_from_events

from .helpers import plain
from .open_shapes import ACCEPTED, FIXTURES, PROJECT, REFUSED, write_fixtures

pytestmark = pytest.mark.anyio

ROOTS = (("root-none", "none"), ("root-zstd", "zstd"))


def _expected() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / "expected.json").read_text())
    return data


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("session.v3.jsonl*"))
    }


def _plaintext(data: bytes) -> list[bytes]:
    return [decompress_frame(data[s:e]) for s, e in scan_frames(data).frames]


async def test_open_shape_fixtures_are_what_dshs_writer_writes(tmp_path: Path) -> None:
    await write_fixtures(tmp_path)
    assert json.loads((tmp_path / "expected.json").read_text()) == _expected()
    fresh, stored = _files(tmp_path), _files(FIXTURES)
    assert sorted(fresh) == sorted(stored)
    for name, data in fresh.items():
        if name.endswith(".zstd"):  # another libzstd may compress differently: compare content
            assert _plaintext(data) == _plaintext(stored[name]), name
        else:
            assert data == stored[name], name


def _backend(tmp_path: Path, root: str, compression: str) -> JsonlSessionPersistence:
    target = tmp_path / root
    if not target.exists():
        shutil.copytree(FIXTURES / root, target)
    return JsonlSessionPersistence(str(target), compression)  # type: ignore[arg-type]


@pytest.mark.parametrize(("root", "compression"), ROOTS)
@pytest.mark.parametrize("sid", sorted(ACCEPTED))
async def test_an_open_shape_reads_back_losslessly_and_projects_as_dsh_does(
    tmp_path: Path, root: str, compression: str, sid: str
) -> None:
    expected = _expected()[sid]
    backend = _backend(tmp_path, root, compression)
    load = await (await backend.open(sid, "read")).read()
    assert [plain(event_to_builtins(e)) for e in load.events] == expected["events"]
    assert load.torn_tail is None and load.closers == ()
    messages = derive_messages_from_events(load.events)
    if sid == "content-file-block":
        # DSH's chat projection drops a file it stored elsewhere (a reference without bytes);
        # dsh refuses to send a prompt without its attachment (D29 in docs/decisions.md).
        with pytest.raises(LlmError, match="has no bytes in the log") as refused:
            serialize_messages(messages)
        assert refused.value.code == "UNSUPPORTED_CONTENT"
    else:
        assert serialize_messages(messages) == expected["model"]
    # a write handle opens it too (DSH's rules accept it), and appending keeps it readable
    handle = await backend.open(sid, "write")
    await handle.close()
    again = await (await backend.open(sid, "read")).read()
    assert [plain(event_to_builtins(e)) for e in again.events] == expected["events"]


@pytest.mark.parametrize(("root", "compression"), ROOTS)
@pytest.mark.parametrize("sid", sorted(REFUSED))
async def test_a_row_dsh_refuses_refuses_the_log_in_both_modes(
    tmp_path: Path, root: str, compression: str, sid: str
) -> None:
    refuse = _expected()[sid]["refuse"]
    error = getattr(persistence_errors, refuse["error"])
    backend = _backend(tmp_path, root, compression)
    before = _files(tmp_path / root)
    for mode in ("read", "write"):
        with pytest.raises(error, match=refuse["message"].replace("(", r"\(")):
            handle = await backend.open(sid, mode)
            await handle.read()
    assert _files(tmp_path / root) == before, "a refused log is never cut"


def _dsh(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("DSH_SESSION_ROOT", None)
    return subprocess.run(
        [sys.executable, "-m", "dsh_host", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("sid", ["usage-total-tokens", "content-file-block", "source-cron"])
def test_cli_events_view_shows_what_the_log_holds(tmp_path: Path, sid: str) -> None:
    """``dsh sessions show --view events --json`` prints every stored key (totalTokens, the
    file block, the cron source), and the transcript view does not crash on opaque values."""
    root = tmp_path / "root-zstd"  # the CLI's default composition stores zstd
    shutil.copytree(FIXTURES / "root-zstd", root)
    shown = _dsh(
        "sessions", "show", sid, "--view", "events", "--json", "--root", str(root), cwd=tmp_path
    )
    assert shown.returncode == 0, shown.stderr
    printed = [json.loads(line) for line in shown.stdout.splitlines() if line.strip()]
    assert printed == _expected()[sid]["events"]
    for view in ("transcript", "model"):
        other = _dsh("sessions", "show", sid, "--view", view, "--root", str(root), cwd=tmp_path)
        assert other.returncode == 0, other.stderr
        assert "Traceback" not in other.stderr


def test_cli_verify_refuses_a_row_dsh_refuses_without_cutting_it(tmp_path: Path) -> None:
    root = tmp_path / "root-zstd"
    shutil.copytree(FIXTURES / "root-zstd", root)
    sid = "refused-request-header-without-data"
    path = root / PROJECT / sid / "session.v3.jsonl.zstd"
    before = path.read_bytes()
    verify = _dsh("sessions", "verify", sid, "--root", str(root), cwd=tmp_path)
    assert verify.returncode == 2, verify.stdout + verify.stderr
    assert "request/header data must be an object" in verify.stderr
    resume = _dsh("resume", sid, "--root", str(root), cwd=tmp_path)
    assert resume.returncode == 2 and "Traceback" not in resume.stderr
    assert path.read_bytes() == before

"""Issue 15 class 1: files the harness itself opens must not be redirected by planted symlinks.

The harness runs as root, unconfined. Any file it creates on a path a tool (or a local user)
could have touched is a write primitive if it follows a planted symlink (D20):

* ``bash`` output past ``maxOutputBytes`` used to be spilled to the predictable
  ``$TMPDIR/dsh-bash-output/<call id>-<harness pid>.stdout`` with ``open(..., "wb")``; under
  Landlock ``workspace-write`` the host ``/tmp`` is writable, so the model could plant that name
  as a symlink and have the next long output overwrite any file. Now each row spills into a
  private ``mkdtemp`` directory outside every writable root, ``O_CREAT | O_EXCL | O_NOFOLLOW``;
* the JSONL backend's ``session.lock`` was opened ``O_CREAT`` following symlinks (a dangling
  link makes root create any file); the log itself was opened for append following symlinks.

Each attack runs for real and is judged from the host (the victim's content/mode/mtime/inode,
or the absence of a file); each has a control that replays the old open and sees the damage.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from dsh_session_persistence_jsonl import JsonlSessionPersistence
from dsh_session_persistence_jsonl._storage import open_for_append

from dsh_host import CancelToken, Row, open_host
from dsh_host._loader import PluginHost
from dsh_host._persistence.persistence import (
    SessionNotFoundError,
    SessionPersistenceCorruptionError,
)
from dsh_host._tools import TOOLS, ToolExecutionInput, ToolExecutionResult
from dsh_host.sdk import SessionLockUnsafeError

from .escape_catalog import Snapshot, changed, make_victim, q
from .sandbox_harness import BACKENDS, MODES, Scene, linux_only, provider_for, run_confined

# both backends: worker threads and subprocesses
pytestmark = [linux_only, pytest.mark.anyio, pytest.mark.both_backends]

BIG = 70_000  # past the 64 KB default of maxOutputBytes
PRINT_BIG = f"head -c {BIG} /dev/zero | tr '\\0' A"
GUARD_S = 120  # hang guard for one tool call; nothing asserts on time


def old_spill_path(call_id: str) -> Path:
    """Where the old code spilled a call's stdout (predictable: call id + harness pid)."""
    return Path(tempfile.gettempdir(), "dsh-bash-output", f"{call_id}-{os.getpid()}.stdout")


def old_spill_open(path: Path, prefix: bytes) -> None:
    """The old ``_Capture._open_spill``: makedirs, then a plain ``open(..., "wb")``."""
    os.makedirs(path.parent, mode=0o700, exist_ok=True)
    with open(path, "wb") as spill:
        spill.write(prefix)


@asynccontextmanager
async def bash_host(s: Scene, backend: str, mode: str) -> AsyncIterator[PluginHost]:
    provider_for(backend)  # fails (or skips, see sandbox_harness) when the backend is unusable
    rows = [
        Row(name="tools"),
        Row(name="sandbox-local", config={"backend": backend, "network": "deny"}),
        # No formatted-result spill: these tests predict the stream spill files' names.
        Row(
            name="builtin-tools",
            config={"workspace": str(s.ws), "sandbox": mode, "maxInlineBytes": None},
        ),
    ]
    async with open_host(rows) as host:
        yield host


async def bash(host: PluginHost, call_id: str, command: str) -> ToolExecutionResult:
    request = ToolExecutionInput(
        call_id=call_id,
        name="bash",
        arguments={"command": command, "description": "run a test command"},
        signal=CancelToken(),
    )
    with anyio.fail_after(GUARD_S):
        return await host.ctx.service(TOOLS).execute(request)


def text_of(result: ToolExecutionResult) -> str:
    return "".join(getattr(block, "text", "") for block in result.content)


def spill_facts(spill: str | None) -> tuple[bytes | None, bool]:
    """The spill file's content and whether it is a symlink (None, False: no spill)."""
    if spill is None:
        return None, False
    return Path(spill).read_bytes(), Path(spill).is_symlink()


def remove(path: Path) -> None:
    if path.is_symlink() or path.exists():
        path.unlink()


# --------------------------------------------------------------------------- bash spill


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("backend", BACKENDS)
async def test_model_planted_spill_symlinks_do_not_redirect_the_spill(
    scene: Scene, backend: str, mode: str
) -> None:
    """The model plants symlinks at the old spill name and inside the real spill area."""
    victim = scene.out / "victim.txt"
    before = make_victim(victim)
    old = old_spill_path("call-big")
    planted: list[Path] = [old]
    try:
        async with bash_host(scene, backend, mode) as host:
            first = await bash(host, "call-reveal", PRINT_BIG)
            area = Path(first.value["stdout"]["spillPath"]).parent
            planted += [area / "2-call-big.stdout", area / "3-call-big.stdout"]
            # The next stream's spill name is predictable once the area is known: plant it, and
            # the old predictable path too (the harness pid is the model's $PPID-ish knowledge).
            plant = (
                f"mkdir -p {q(old.parent)}; ln -s {q(victim)} {q(old)}; "
                f"ln -s {q(victim)} {q(area / '2-call-big.stdout')}; "
                f"ln -s {q(victim)} {q(area / '3-call-big.stdout')}; true"
            )
            await bash(host, "call-plant", plant)
            planted_in_area = (area / "2-call-big.stdout").is_symlink()
            big = await bash(host, "call-big", PRINT_BIG)
            stdout = big.value["stdout"]
            assert stdout["truncated"] is True
            spill = stdout.get("spillPath")
            spilled, spilled_via_link = spill_facts(spill)
        assert not changed(victim, before), "ESCAPE: the harness wrote through a planted symlink"
        assert not spilled_via_link
        assert spilled in (None, b"A" * BIG)
        # The area is outside every writable root: the model could not even plant in it.
        assert not planted_in_area, f"the sandbox let the model write the spill area {area}"
        assert not area.exists(), "the spill area outlived the row"
    finally:
        for path in planted:
            remove(path)


def test_control_the_old_spill_open_overwrites_a_model_planted_victim(scene: Scene) -> None:
    """Control: Landlock workspace-write lets the model plant the old name; the old open obeys it."""
    victim = scene.out / "victim.txt"
    before = make_victim(victim)
    old = old_spill_path("call-control")
    try:
        confined = provider_for("landlock").confine(
            ["bash", "-c", f"mkdir -p {q(old.parent)} && ln -s {q(victim)} {q(old)}"],
            scene.policy("workspace-write"),
        )
        planted = run_confined(confined, cwd=scene.ws)
        if planted.returncode != 0 or not old.is_symlink():
            pytest.skip(f"Landlock no longer grants host {tempfile.gettempdir()}: {planted}")
        old_spill_open(old, b"A" * BIG)
        assert changed(victim, before), "the old spill open did not write through the symlink"
        assert victim.read_bytes() == b"A" * BIG
    finally:
        remove(old)


async def test_locally_planted_symlink_in_the_spill_area_makes_the_spill_fail_closed(
    scene: Scene,
) -> None:
    """A local user (or anyone able to write the area) plants the next name: O_EXCL refuses it."""
    victim = scene.out / "victim.txt"
    before = make_victim(victim)
    dangling = scene.out / "created-by-root"
    async with bash_host(scene, "bubblewrap", "danger-full-access") as host:
        first = await bash(host, "c1", PRINT_BIG)
        area = Path(first.value["stdout"]["spillPath"]).parent
        os.symlink(victim, area / "2-c2.stdout")
        os.symlink(dangling, area / "3-c3.stdout")
        try:
            second = await bash(host, "c2", PRINT_BIG)
            third = await bash(host, "c3", PRINT_BIG)
        finally:
            remove(area / "2-c2.stdout")
            remove(area / "3-c3.stdout")
    for result in (second, third):
        assert result.value["stdout"]["truncated"] is True
        assert "spillPath" not in result.value["stdout"]
        assert text_of(result).endswith("[output truncated; full output: (unavailable)]")
    assert not changed(victim, before)
    assert not dangling.exists() and not dangling.is_symlink()


def test_control_a_plain_open_follows_a_planted_symlink(scene: Scene) -> None:
    victim = scene.out / "victim.txt"
    before = make_victim(victim)
    area = Path(tempfile.mkdtemp(dir=scene.base))
    os.symlink(victim, area / "2-c2.stdout")
    old_spill_open(area / "2-c2.stdout", b"A" * BIG)
    assert changed(victim, before)


# --------------------------------------------------------------------------- session.lock


async def _stored_session(root: Path, sid: str) -> Path:
    backend = JsonlSessionPersistence(str(root))
    handle = await backend.create({"version": 3, "id": sid, "createdAt": 1, "cwd": "/p"})
    handle.append([{"type": "turn/start", "seq": 0, "time": 2, "data": {"turn": 1}}])
    await handle.close()
    return Path(backend.locate({"version": 3, "id": sid, "createdAt": 1, "cwd": "/p"}).path)


@pytest.mark.parametrize("target", ["dangling", "victim"])
async def test_a_symlinked_session_lock_is_refused(scene: Scene, target: str) -> None:
    root = scene.ws / "sessions"
    log = await _stored_session(root, "s1")
    victim = scene.out / "victim.txt"
    before = make_victim(victim)
    pointed = scene.out / "created-by-root" if target == "dangling" else victim
    lock = log.parent / "session.lock"
    remove(lock)
    os.symlink(pointed, lock)
    backend = JsonlSessionPersistence(str(root))
    with pytest.raises(SessionLockUnsafeError) as refused:
        await backend.open("s1", "write")
    assert refused.value.code == "SESSION_LOCK_UNSAFE"
    assert "is a symbolic link; refusing to open it" in str(refused.value)
    assert not (scene.out / "created-by-root").exists()
    assert not changed(victim, before)
    os.unlink(lock)
    handle = await backend.open("s1", "write")  # a real lock file works again
    await handle.close()


async def test_a_fifo_session_lock_is_refused_not_waited_on(scene: Scene) -> None:
    root = scene.ws / "sessions"
    log = await _stored_session(root, "s2")
    lock = log.parent / "session.lock"
    remove(lock)
    os.mkfifo(lock)
    with anyio.fail_after(GUARD_S), pytest.raises(SessionLockUnsafeError, match="not a regular"):
        await JsonlSessionPersistence(str(root)).open("s2", "write")


def test_control_the_old_lock_open_creates_the_symlink_target(scene: Scene) -> None:
    lock = scene.ws / "session.lock"
    os.symlink(scene.out / "created-by-root", lock)
    os.close(os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))  # the old open
    assert (scene.out / "created-by-root").exists()


async def test_the_log_is_not_read_or_appended_through_a_symlink(scene: Scene) -> None:
    """The stored log swapped for a symlink to an identical copy outside: refused, copy intact."""
    root = scene.ws / "sessions"
    log = await _stored_session(root, "s3")
    copy = scene.out / log.name
    shutil.copy2(log, copy)
    before = Snapshot.of(copy)
    os.unlink(log)
    os.symlink(copy, log)
    backend = JsonlSessionPersistence(str(root))
    events: list[dict[str, Any]] = [
        {
            "type": "turn/end",
            "seq": 1,
            "time": 3,
            "data": {"turn": 1, "reason": {"kind": "completed"}},
        }
    ]
    with pytest.raises(SessionPersistenceCorruptionError, match="symbolic link"):
        handle = await backend.open("s3", "write")
        handle.append(events)
        await handle.close()
    with pytest.raises(SessionPersistenceCorruptionError, match="symbolic link"):
        await backend.list()
    assert not changed(copy, before), "ESCAPE: the log was appended through a symlink"
    # The append descriptor itself refuses the link too (the layer under the read check).
    with pytest.raises(OSError) as refused:
        open_for_append(str(log))
    assert refused.value.errno == errno.ELOOP


async def test_a_fifo_log_is_never_opened(scene: Scene) -> None:
    """A FIFO where the log was is not a generation: listing and opening do not wait on it."""
    root = scene.ws / "sessions"
    log = await _stored_session(root, "s4")
    os.unlink(log)
    os.mkfifo(log)
    backend = JsonlSessionPersistence(str(root))
    with anyio.fail_after(GUARD_S):
        assert await backend.list() == []
        with pytest.raises(SessionNotFoundError):
            await backend.open("s4", "read")


def test_control_the_old_append_open_follows_the_symlink(scene: Scene) -> None:
    target = scene.out / "log-copy"
    target.write_bytes(b"x")
    link = scene.ws / "session.v3.jsonl"
    os.symlink(target, link)
    fd = os.open(link, os.O_WRONLY | os.O_CLOEXEC)  # the old open_for_append
    try:
        os.write(fd, b"y")
    finally:
        os.close(fd)
    assert target.read_bytes() == b"y"

"""``bash``'s ``workdir`` resolves inside the workspace (issue 43, class 2).

``bash`` used to accept any absolute ``workdir``: a command started in ``/run/postgresql`` or
the host's ``/tmp`` kept the host directory as its working directory, outside every private
mount, and a relative path there reached host sockets (PostgreSQL ``COPY ... TO PROGRAM``, the
user's tmux). Now a ``workdir`` that does not resolve (after every symbolic link) to the
workspace or a directory beneath it is refused before anything is spawned, on both backends in
both confined modes and unconfined. Controls: the same command with a workspace directory runs
there (relative, absolute, and through a link that stays inside), and the refused directories
exist on this host (so the refusal, not a missing directory, is what stops them).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import pytest
from msgspec import UNSET

from dsh_host import Row, open_host
from dsh_host._loader import PluginHost
from dsh_host._tools import ToolExecutionResult

from .tools_helpers import call, text_of

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]

GUARD_S = 60  # hang guard only
CASES = [
    (None, "danger-full-access"),
    ("bubblewrap", "read-only"),
    ("bubblewrap", "workspace-write"),
    ("landlock", "read-only"),
    ("landlock", "workspace-write"),
]


@contextlib.contextmanager
def persistent_workspace() -> Iterator[Path]:
    """Off /tmp: Landlock grants host /tmp under workspace-write."""
    base = Path(tempfile.mkdtemp(prefix="dsh-workdir-", dir="/var/tmp")).resolve()
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


@contextlib.asynccontextmanager
async def bash_host(ws: Path, backend: str | None, mode: str) -> AsyncIterator[PluginHost]:
    rows = [Row(name="tools")]
    if backend is not None:
        rows.append(Row(name="sandbox-local", config={"backend": backend}))
    rows.append(Row(name="builtin-tools", config={"workspace": str(ws), "sandbox": mode}))
    async with open_host(rows) as host:
        yield host


async def pwd(host: PluginHost, workdir: str) -> ToolExecutionResult:
    with anyio.fail_after(GUARD_S):
        result: ToolExecutionResult = await host.ctx.tools.execute(
            call(
                name="bash",
                arguments={
                    "command": "pwd",
                    "description": "print the directory",
                    "workdir": workdir,
                },
            )
        )
    return result


def is_dir(path: str | Path) -> bool:
    return os.path.isdir(path)


def real(path: Path) -> str:
    return os.path.realpath(path)


def outside_targets(ws: Path) -> list[str]:
    targets = ["/tmp", "/", str(ws.parent), "..", "sub/../..", "out-link", "out-link/x"]
    if os.path.isdir("/run/postgresql"):
        targets.append("/run/postgresql")
    return targets


@pytest.mark.parametrize(("backend", "mode"), CASES, ids=[f"{b}-{m}" for b, m in CASES])
async def test_a_workdir_outside_the_workspace_is_refused(backend: str | None, mode: str) -> None:
    with persistent_workspace() as ws:
        (ws / "sub" / "deeper").mkdir(parents=True)
        (ws / "out-link").symlink_to("/tmp")
        (ws / "in-link").symlink_to(ws / "sub")
        (ws / "file.txt").write_text("x\n")
        async with bash_host(ws, backend, mode) as host:
            refused = {target: await pwd(host, target) for target in outside_targets(ws)}
            missing = await pwd(host, "nope")
            a_file = await pwd(host, "file.txt")
            ran = {
                target: await pwd(host, target)
                for target in ("sub", str(ws / "sub/deeper"), "in-link", ".", str(ws))
            }
        # control: the refused directories exist here
        assert all(is_dir(t if t.startswith("/") else ws / t) for t in outside_targets(ws)[:5])
    for target, result in refused.items():
        assert result.is_error, (target, text_of(result))
        assert result.error is not None and result.error.info is not None
        assert result.error.info.code == "BASH_WORKDIR"
        assert "outside the workspace" in text_of(result), text_of(result)
        assert result.value is UNSET  # refused before the spawn: no run, no value
    for result in (missing, a_file):
        assert result.is_error and "is not an existing directory" in text_of(result)
    # controls: directories of the workspace run there (a link inside stays inside)
    assert text_of(ran["sub"]).strip() == str(ws / "sub")
    assert text_of(ran[str(ws / "sub/deeper")]).strip() == str(ws / "sub/deeper")
    assert text_of(ran["in-link"]).strip() == str(ws / "sub")
    assert text_of(ran["."]).strip() == str(ws) == text_of(ran[str(ws)]).strip()


async def test_the_refusal_names_the_directory_and_the_fix(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    async with bash_host(ws, None, "danger-full-access") as host:
        result = await pwd(host, "/tmp")
    assert text_of(result) == (
        'Error: invalid workdir "/tmp": it resolves to /tmp, which is outside the workspace '
        f"{real(ws)}; commands run in the workspace or a directory beneath it (pass "
        "a path relative to the workspace, and read other places by absolute path in the "
        "command instead)"
    )

"""Two escapes the enumerations do not replay literally: a set-id copy of a shell, and a working
directory inherited from the harness.

Each attack runs confined on both backends (and the modes where it applies) and unconfined as
the control, judged from the host. The set-id bit and the inherited working directory both
escaped on the code before the fix (Landlock kept the host's ``/run/postgresql``, and wrote a
relative path into the read-only mount under the workspace bind).
"""

from __future__ import annotations

import stat
import subprocess
from pathlib import Path

import pytest

from .sandbox_harness import BACKENDS, MODES, Scene, linux_only, provider_for, run_confined

pytestmark = linux_only

CELLS = [pytest.param(b, m, id=f"{b}-{m}") for b in BACKENDS for m in MODES]
SETUID = "cp /bin/bash ./rootshell && chmod 4755 ./rootshell; chmod u+s ./rootshell; true"


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_setuid_copy_of_bash_cannot_be_made(scene: Scene, backend: str) -> None:
    confined = provider_for(backend).confine(
        ["bash", "-c", SETUID], scene.policy("workspace-write")
    )
    run_confined(confined, cwd=scene.ws)
    shell = scene.ws / "rootshell"
    assert shell.exists(), "the copy itself is a workspace write and must work"
    assert not shell.stat().st_mode & (stat.S_ISUID | stat.S_ISGID)


def test_control_unconfined_the_setuid_copy_is_made(scene: Scene) -> None:
    subprocess.run(["bash", "-c", SETUID], cwd=scene.ws, check=True)
    assert (scene.ws / "rootshell").stat().st_mode & stat.S_ISUID


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_relative_path_writes_into_the_workspace(scene: Scene, backend: str) -> None:
    """The cwd is the workspace through its writable bind, not the read-only mount beneath."""
    confined = provider_for(backend).confine(["bash", "-c", "echo a > rel && echo b > \"$PWD/abs\""],
                                             scene.policy("workspace-write"))  # fmt: skip
    result = run_confined(confined, cwd=scene.ws)
    assert result.returncode == 0, result.stderr
    assert (scene.ws / "rel").read_text() == "a\n"
    assert (scene.ws / "abs").read_text() == "b\n"


HOST_DIR = Path("/run/postgresql")


@pytest.mark.parametrize(("backend", "mode"), CELLS)
def test_an_inherited_cwd_under_a_private_mount_is_not_the_hosts(
    scene: Scene, backend: str, mode: str
) -> None:
    """Started in a host directory the sandbox hides, the call never sees the host's entries
    there: Landlock refuses to start (the directory does not exist in its view), bubblewrap
    re-resolves the path (and lands elsewhere)."""
    sockets = [p.name for p in HOST_DIR.iterdir() if p.is_socket()] if HOST_DIR.is_dir() else []
    if not sockets:
        pytest.fail(f"{HOST_DIR} has no socket: the control needs PostgreSQL running")
    control = subprocess.run(["ls", "-a"], cwd=HOST_DIR, capture_output=True, text=True)
    assert sockets[0] in control.stdout
    confined = provider_for(backend).confine(["ls", "-a"], scene.policy(mode))
    result = run_confined(confined, cwd=HOST_DIR)
    assert sockets[0] not in result.stdout
    if backend == "landlock":
        assert result.returncode == 125
        assert "cannot enter the working directory /run/postgresql" in result.stderr


def test_the_probe_does_not_degrade_when_the_harness_cwd_is_hidden(
    monkeypatch: pytest.MonkeyPatch, fresh_probes: None
) -> None:
    """The probe runs from /: a harness started in /run/... must still get isolated Landlock
    (the launcher's cwd re-entry would otherwise fail the isolation trial and drop to
    unisolated Landlock)."""
    from dsh_sandbox_local import LocalSandboxProvider, SandboxLocalConfig

    monkeypatch.chdir(HOST_DIR if HOST_DIR.is_dir() else "/run")
    provider = LocalSandboxProvider(SandboxLocalConfig(backend="landlock"))
    assert provider.probe().isolated

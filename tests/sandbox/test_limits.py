"""Per-call resource limits (issue 15, class 7): pids.max and memory limits in a cgroup.

Bounded on purpose (this machine is shared): at most 100 short sleeps, one 256 MB allocation.
Each case runs confined on both backends and both modes, with an unconfined control proving the
same attempt succeeds without the sandbox; the host checks the call's cgroups are gone after.
"""

from __future__ import annotations

import os
import subprocess

import pytest
from dsh_sandbox_local import (
    ConfinedArgv,
    LocalSandboxProvider,
    SandboxLocalConfig,
    SandboxPolicy,
)
from dsh_sandbox_local.landlock_run import _own_cgroup_dirs, cgroup_limits_supported

from .escape_catalog import py
from .sandbox_harness import BACKENDS, MODES, Scene, linux_only, provider_for, run_confined

# slow: fork storms and memory hogs under real limits
pytestmark = [linux_only, pytest.mark.slow]

FORKS = py(
    "import os, time\n"
    "fails, kids = 0, []\n"
    "for _ in range(100):\n"
    "    try:\n        pid = os.fork()\n    except OSError:\n        fails += 1\n        continue\n"
    "    if pid == 0:\n        time.sleep(2)\n        os._exit(0)\n"
    "    kids.append(pid)\n"
    "for kid in kids:\n    os.waitpid(kid, 0)\n"
    "print('failed', fails)\n"
)
MEMORY = py("b = bytearray(256 * 2**20); b[::4096] = b'x' * len(b[::4096]); print('allocated')")


def _limited(backend: str) -> LocalSandboxProvider:
    provider_for(backend)  # fail (not skip) when the backend is unusable here
    if not {"pids", "memory"} <= set(cgroup_limits_supported()):
        pytest.fail(f"no writable pids+memory cgroup here: {cgroup_limits_supported()}")
    return LocalSandboxProvider(
        SandboxLocalConfig(backend=backend, pids_max=40, memory_max_mb=64)  # type: ignore[arg-type]
    )


def _run(confined: ConfinedArgv, scene: Scene) -> subprocess.CompletedProcess[str]:
    """Run like the bash tool, then check from the host that this call's cgroups are gone
    (they are named after the launcher, which is the spawned process)."""
    proc = subprocess.Popen(
        list(confined.argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, close_fds=True, start_new_session=True, cwd=scene.ws,
    )  # fmt: skip
    stdout, stderr = proc.communicate(timeout=120)  # hang protection only
    left = [
        parent
        for parent, _version in _own_cgroup_dirs().values()
        if os.path.exists(os.path.join(parent, f"dsh-call-{proc.pid}"))
    ]
    assert left == [], f"the call's cgroup was left behind under {left}"
    return subprocess.CompletedProcess(confined.argv, proc.returncode, stdout, stderr)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_fork_storm_hits_pids_max(scene: Scene, backend: str, mode: str) -> None:
    confined = _limited(backend).confine(["bash", "-c", FORKS], scene.policy(mode))
    assert "--pids-max" in confined.argv
    result = _run(confined, scene)
    assert result.returncode == 0, result
    failed = int(result.stdout.split()[-1])
    assert failed >= 50, result.stdout  # about 35 of 100 forks fit under pids.max = 40


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_memory_hog_is_killed_at_the_limit(scene: Scene, backend: str, mode: str) -> None:
    confined = _limited(backend).confine(["bash", "-c", MEMORY], scene.policy(mode))
    result = _run(confined, scene)
    assert "allocated" not in result.stdout, result
    assert result.returncode != 0, result


def test_control_the_same_attempts_succeed_unconfined(scene: Scene) -> None:
    policy = SandboxPolicy(mode="danger-full-access", workspace_root=str(scene.ws))
    provider = _limited("bubblewrap")
    forks = run_confined(provider.confine(["bash", "-c", FORKS], policy), cwd=scene.ws)
    assert forks.stdout == "failed 0\n", forks
    memory = run_confined(provider.confine(["bash", "-c", MEMORY], policy), cwd=scene.ws)
    assert memory.stdout == "allocated\n", memory


def test_a_call_removes_cgroups_left_by_a_killed_harness(scene: Scene) -> None:
    """A harness SIGKILLed mid-call leaves its call's (empty) cgroup; the next call removes it."""
    provider = _limited("bubblewrap")
    stale = [os.path.join(parent, "dsh-call-4194999") for parent, _v in _own_cgroup_dirs().values()]
    for path in stale:
        os.mkdir(path)
    try:
        result = run_confined(provider.confine(["true"], scene.policy("read-only")), cwd=scene.ws)
        assert result.returncode == 0, result
        assert [path for path in stale if os.path.exists(path)] == []
    finally:
        for path in stale:
            if os.path.exists(path):
                os.rmdir(path)

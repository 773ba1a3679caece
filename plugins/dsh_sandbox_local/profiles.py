"""Backend profiles: the exact argv pieces, denial dialects and coverage per backend.

Pure functions and constants, shared by the provider and by the probes (a probe runs the *same*
profile as a real wrap, so a host that cannot build it falls through instead of failing later).
"""

from __future__ import annotations

import os
import sys
from typing import Literal

from dsh_host.sdk import RunnerFailureRule, SandboxPolicy

from . import landlock_run

NetworkPolicy = Literal["deny", "allow"]

# What a backend cannot govern. Stable texts: consumers may show them, tests match them.
NOT_A_SANDBOX = "everything: danger-full-access is not a sandbox (nothing is confined)"
NC_METADATA = (
    "file metadata outside the writable grants (chmod, utimes/touch, xattr on files the caller "
    "owns): Landlock does not govern metadata, and without privileges there is no read-only "
    "mount namespace to stop it"
)
NC_TRUNCATE = "truncating existing files outside the writable grants (Landlock ABI < 3)"
NC_IOCTL = "device ioctls (Landlock ABI < 5)"
NC_SIGNALS = "signals to host processes of the same user (Landlock ABI < 6)"
NC_ABSTRACT_UNIX = "abstract UNIX sockets of the host (Landlock ABI < 6)"
NC_UDP = "network: UDP and every other non-TCP protocol (Landlock governs only TCP bind/connect)"
NC_NETWORK_ALL = "network: all traffic (Landlock ABI < 4 cannot restrict TCP)"
NC_LIMITS = (
    "per-call process and memory limits (pids.max, memory.max): no writable cgroup for {what}"
)
# Without the launcher's namespaces (it needs CAP_SYS_ADMIN: a root harness).
NC_PROCESSES = (
    "processes that leave the call's process group (setsid, daemons) outlive the call: no PID "
    "namespace without privileges"
)
NC_TERMINALS = "host terminals under /dev/pts can be read: no mount namespace without privileges"
NC_HOST_IPC = (
    "System V IPC and POSIX message queues are the host's: no IPC namespace without privileges"
)
NC_PROTECTED = (
    "read-only paths inside the workspace (.git, virtualenvs, ...) stay writable: no mount "
    "namespace without privileges"
)

BWRAP_DENIAL = ("read-only file system",)
LANDLOCK_DENIAL = ("permission denied",)
LANDLOCK_RULES = (
    RunnerFailureRule(
        allowed_exit_codes=(landlock_run.LAUNCHER_FAILURE_EXIT,),
        fatal_signatures=(landlock_run.PREFIX,),
        informational_lines=(landlock_run.PARTIAL_NOTICE,),
    ),
)
#: bubblewrap's own lines, and the seccomp stage's (the launcher's dialect at exit 125).
BWRAP_RULES = (RunnerFailureRule(fatal_signatures=("bwrap: ",)), *LANDLOCK_RULES)


#: Where the seccomp stage of the launcher is bound inside bubblewrap (under the private /run).
BWRAP_STAGE2_PATH = "/run/dsh/landlock_run.py"


def launcher_files() -> tuple[str, str]:
    """(interpreter, launcher script): both real paths, so no venv symlink can be swapped."""
    return os.path.realpath(sys.executable), os.path.realpath(landlock_run.__file__)


def default_landlock_launcher() -> tuple[str, ...]:
    """``<real python> -I -S <this package>/landlock_run.py``.

    The launcher is named by absolute real path and run isolated (``-I``: no ``PYTHONPATH``, no
    user site, no script directory on ``sys.path``) and without ``site`` (``-S``: no ``.pth``
    file of any environment runs before the launcher confines itself), so nothing in the
    environment, a virtualenv or the working directory can choose or shadow it, and it works
    whether or not the package is installed. The interpreter is the real binary behind
    ``sys.executable``, not a virtualenv's symlink a tool could replace.
    (``python -m dsh_sandbox_local.landlock_run`` runs the same code.)
    """
    interpreter, script = launcher_files()
    return (interpreter, "-I", "-S", script)


HIDDEN_ROOTS = landlock_run.HIDDEN_PATHS
"""Host directories both backends cover with an empty private tmpfs (when they can)."""


def _hidden_run_dirs() -> tuple[str, ...]:
    # /var/run is normally a symlink to /run (covered by hiding /run); hide it too if it is not.
    return ("/run",) if os.path.islink("/var/run") else ("/run", "/var/run")


def bwrap_profile_args(
    policy: SandboxPolicy, network: NetworkPolicy, *, stage2: str | None = None
) -> tuple[str, ...]:
    """The bubblewrap arguments between ``bwrap`` and ``--`` (DSH's profile, hardened per D9/D20).

    Order matters where mounts stack: ``/proc/sys`` is re-bound read-only after ``/proc`` is
    mounted (bwrap skips its own cover for root); every mode gets an empty private ``/tmp`` and
    ``/run`` (host services' sockets live there: tmux, PostgreSQL, D-Bus, docker), read-only in
    ``read-only``; the workspace is bound after them so a workspace under ``/tmp`` still works,
    and the read-only paths inside it are bound over it last. ``stage2`` is the host path of the
    launcher script, bound at :data:`BWRAP_STAGE2_PATH` for the seccomp stage.
    """
    args = [
        "--ro-bind", "/", "/",
        "--dev", "/dev",
        "--unshare-pid",
        "--unshare-ipc",
        "--proc", "/proc",
        "--ro-bind", "/proc/sys", "/proc/sys",
        "--remount-ro", "/proc",
        "--tmpfs", "/tmp",
    ]  # fmt: skip
    for path in _hidden_run_dirs():
        args += ["--tmpfs", path]
    if stage2 is not None:
        args += ["--ro-bind", stage2, BWRAP_STAGE2_PATH]
    for path in _hidden_run_dirs():
        args += ["--remount-ro", path]
    for path in interpreter_paths():
        args += ["--ro-bind", path, path]
    args += ["--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    if stage2 is not None:
        # The seccomp stage is PID 1 (bwrap's own init would be the one unfiltered process of
        # the call). It keeps CAP_SYS_ADMIN just long enough to seal the host device nodes bwrap
        # binds into its /dev, and CAP_SETPCAP to empty the bounding set; it drops every
        # capability before anything else runs.
        args += ["--as-pid-1", "--cap-add", "CAP_SYS_ADMIN", "--cap-add", "CAP_SETPCAP"]
    if network == "deny":
        args.append("--unshare-net")
    if policy.mode == "workspace-write":
        args += ["--bind", policy.workspace_root, policy.workspace_root]
        for path in policy.read_only_paths:
            args += ["--ro-bind-try", path, path]
    else:
        if _under_any(policy.workspace_root, HIDDEN_ROOTS):
            # A read-only workspace under a hidden directory stays visible (read-only).
            args += ["--ro-bind", policy.workspace_root, policy.workspace_root]
        args += ["--remount-ro", "/tmp"]
    for path in hidden_targets(policy):
        if os.path.isdir(path):
            args += ["--tmpfs", path, "--remount-ro", path]
        else:
            args += ["--ro-bind", "/dev/null", path]
    return tuple(args)


def hidden_targets(policy: SandboxPolicy) -> tuple[str, ...]:
    """The policy's hidden paths that exist, by real path (a mount lands on the real object),
    each once. Covered last, so no later bind can show them again."""
    seen: list[str] = []
    for path in policy.hidden_paths:
        real = os.path.realpath(path)
        if os.path.lexists(real) and real not in seen:
            seen.append(real)
    return tuple(seen)


def interpreter_paths() -> tuple[str, ...]:
    """The harness's own Python installation (its prefixes) where it lies under a directory the
    sandbox hides (``/tmp``...): kept visible read-only, so a confined call can still run the
    interpreter and packages dsh itself runs from (a virtualenv in a checkout under ``/tmp``).
    Nothing becomes writable, and nothing else of the hidden directory is shown."""
    seen: list[str] = []
    for prefix in (sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix):
        path = os.path.realpath(prefix)
        if _under_any(path, HIDDEN_ROOTS) and os.path.isdir(path) and path not in seen:
            seen.append(path)
    return tuple(seen)


def _under_any(path: str, roots: tuple[str, ...]) -> bool:
    normalized = os.path.normpath(path)
    return any(normalized == root or normalized.startswith(root + "/") for root in roots)


def limit_args(pids_max: int, memory_max: int) -> tuple[str, ...]:
    """The launcher's per-call cgroup limits (0 = that limit is not applied)."""
    args: list[str] = []
    if pids_max:
        args += ["--pids-max", str(pids_max)]
    if memory_max:
        args += ["--memory-max", str(memory_max)]
    return tuple(args)


def bwrap_limits_relay(interpreter: str, script: str, limits: tuple[str, ...]) -> tuple[str, ...]:
    """The launcher in front of bubblewrap, only to put the call into its own cgroups."""
    return (interpreter, "-I", "-S", script, "--relay", *limits, "--")


def bwrap_stage2_argv(interpreter: str, *, deny_unix: bool) -> tuple[str, ...]:
    """The seccomp stage run inside bubblewrap: PID 1 of the call (``--init``), it seals the
    host device nodes, drops every capability, loads the filter, then runs the command as its
    child and reaps orphans."""
    args = [interpreter, "-I", "-S", BWRAP_STAGE2_PATH, "--no-landlock", "--init"]
    if deny_unix:
        args.append("--deny-unix")
    return (*args, "--")


def landlock_grant_args(
    policy: SandboxPolicy, *, deny_tcp: bool, isolate: bool = False, deny_unix: bool = False
) -> tuple[str, ...]:
    """Launcher grants: read everything, write ``/dev/null`` (the file, never
    ``/dev``: that would expose the host's ``/dev/shm``), plus ``/tmp`` and the workspace under
    ``workspace-write``. With ``isolate`` the launcher runs the call in private mount, PID and
    IPC namespaces, where ``/tmp`` is a private tmpfs and the policy's read-only paths are
    bound read-only."""
    args = ["--isolate"] if isolate else []
    args += ["--ro", "/", "--rw", "/dev/null"]
    if policy.mode == "workspace-write":
        args += ["--rw", "/tmp", "--rw", policy.workspace_root]
        if isolate:
            # private there (an empty tmpfs, as bubblewrap's): POSIX semaphores and shared
            # memory (Python's multiprocessing) need it writable
            args += ["--rw", "/dev/shm"]
            for path in policy.read_only_paths:
                args += ["--protect", path]
    elif isolate and _under_any(policy.workspace_root, HIDDEN_ROOTS):
        args += ["--show", policy.workspace_root]  # keep a read-only workspace visible
    if isolate:
        for path in interpreter_paths():
            args += ["--show", path]
        for path in hidden_targets(policy):
            args += ["--hide", path]
    if deny_tcp:
        args.append("--deny-tcp")
    if deny_unix:
        args.append("--deny-unix")
    return tuple(args)


def writable_host_paths(backend: str, policy: SandboxPolicy) -> tuple[str, ...]:
    """Host paths a process confined by ``backend`` under ``policy`` can write.

    Read off the profile arguments themselves (bubblewrap ``--bind``/``--dev-bind`` sources,
    Landlock ``--rw`` grants), so it cannot drift from what is granted; private mounts (the
    bubblewrap ``/tmp`` tmpfs, ``--dev``) are not host paths and are not listed.
    """
    flags: tuple[str, ...]
    if backend == "bubblewrap":
        args, flags = bwrap_profile_args(policy, "deny"), ("--bind", "--bind-try", "--dev-bind")
    elif backend == "landlock":
        args, flags = landlock_grant_args(policy, deny_tcp=False), ("--rw",)
    else:
        return ()
    return tuple(args[i + 1] for i, arg in enumerate(args[:-1]) if arg in flags)


def landlock_not_covered(
    abi: int, network: NetworkPolicy, *, isolated: bool = True, protected: bool = False
) -> tuple[str, ...]:
    """What Landlock at this ABI cannot govern of what the policy promises.

    ``isolated``: the launcher runs the call in its own namespaces (a privileged harness);
    ``protected``: the policy asks for read-only paths inside a writable root.
    """
    items = [] if isolated else [NC_METADATA]
    if abi < 3:
        items.append(NC_TRUNCATE)
    if abi < 5:
        items.append(NC_IOCTL)
    if abi < 6:
        items += [NC_SIGNALS, NC_ABSTRACT_UNIX]
    if network == "deny":
        items.append(NC_UDP if abi >= 4 else NC_NETWORK_ALL)
    if not isolated:
        items += [NC_PROCESSES, NC_TERMINALS, NC_HOST_IPC]
        if protected:
            items.append(NC_PROTECTED)
    return tuple(items)

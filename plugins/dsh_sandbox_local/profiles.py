"""Backend profiles: the exact argv pieces, denial dialects and coverage per backend.

Pure functions and constants, shared by the provider and by the probes (a probe runs the *same*
profile as a real wrap, so a host that cannot build it falls through instead of failing later).
"""

from __future__ import annotations

import os
import sys
from typing import Literal

from dsh_host.sandbox import RunnerFailureRule, SandboxPolicy

from . import landlock_run

NetworkPolicy = Literal["deny", "allow"]

# What a backend cannot govern. Stable texts: consumers may show them, tests match them.
NOT_A_SANDBOX = "everything: danger-full-access is not a sandbox (nothing is confined)"
NC_METADATA = (
    "file metadata outside the writable grants (chmod, utimes/touch, xattr on files the caller "
    "owns): Landlock does not govern metadata"
)
NC_TRUNCATE = "truncating existing files outside the writable grants (Landlock ABI < 3)"
NC_IOCTL = "device ioctls (Landlock ABI < 5)"
NC_SIGNALS = "signals to host processes of the same user (Landlock ABI < 6)"
NC_ABSTRACT_UNIX = "abstract UNIX sockets of the host (Landlock ABI < 6)"
NC_UDP = "network: UDP and every other non-TCP protocol (Landlock governs only TCP bind/connect)"
NC_NETWORK_ALL = "network: all traffic (Landlock ABI < 4 cannot restrict TCP)"

BWRAP_DENIAL = ("read-only file system",)
LANDLOCK_DENIAL = ("permission denied",)
BWRAP_RULES = (RunnerFailureRule(fatal_signatures=("bwrap: ",)),)
LANDLOCK_RULES = (
    RunnerFailureRule(
        allowed_exit_codes=(landlock_run.LAUNCHER_FAILURE_EXIT,),
        fatal_signatures=(landlock_run.PREFIX,),
        informational_lines=(landlock_run.PARTIAL_NOTICE,),
    ),
)


def default_landlock_launcher() -> tuple[str, ...]:
    """``python -I <this package>/landlock_run.py``.

    The launcher is named by absolute file path and run isolated (``-I``: no ``PYTHONPATH``, no
    user site, no script directory on ``sys.path``), so nothing in the environment or the
    working directory can choose or shadow it, and it works whether or not the package is
    installed. (``python -m dsh_sandbox_local.landlock_run`` runs the same code.)
    """
    return (sys.executable, "-I", os.path.abspath(landlock_run.__file__))


def bwrap_profile_args(policy: SandboxPolicy, network: NetworkPolicy) -> tuple[str, ...]:
    """The bubblewrap arguments between ``bwrap`` and ``--`` (spec §2.4, hardened per D9).

    Order matters where mounts stack: ``/proc/sys`` is re-bound read-only after ``/proc`` is
    mounted (bwrap skips its own cover when the caller is root), and the workspace is bound
    after the private ``/tmp`` so a workspace under ``/tmp`` still works.
    """
    args = [
        "--ro-bind", "/", "/",
        "--dev", "/dev",
        "--unshare-pid",
        "--proc", "/proc",
        "--ro-bind", "/proc/sys", "/proc/sys",
        "--die-with-parent",
        "--new-session",
        "--cap-drop", "ALL",
    ]  # fmt: skip
    if network == "deny":
        args.append("--unshare-net")
    if policy.mode == "workspace-write":
        args += ["--tmpfs", "/tmp", "--bind", policy.workspace_root, policy.workspace_root]
    return tuple(args)


def landlock_grant_args(policy: SandboxPolicy, *, deny_tcp: bool) -> tuple[str, ...]:
    """Launcher grants (spec §2.5): read everything, write ``/dev/null`` (the file, never
    ``/dev``: that would expose the host's ``/dev/shm``), plus host ``/tmp`` and the workspace
    under ``workspace-write``."""
    args = ["--ro", "/", "--rw", "/dev/null"]
    if policy.mode == "workspace-write":
        args += ["--rw", "/tmp", "--rw", policy.workspace_root]
    if deny_tcp:
        args.append("--deny-tcp")
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


def landlock_not_covered(abi: int, network: NetworkPolicy) -> tuple[str, ...]:
    """What Landlock at this ABI cannot govern of what the policy promises."""
    items = [NC_METADATA]
    if abi < 3:
        items.append(NC_TRUNCATE)
    if abi < 5:
        items.append(NC_IOCTL)
    if abi < 6:
        items += [NC_SIGNALS, NC_ABSTRACT_UNIX]
    if network == "deny":
        items.append(NC_UDP if abi >= 4 else NC_NETWORK_ALL)
    return tuple(items)

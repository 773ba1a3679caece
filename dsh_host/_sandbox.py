"""The sandbox contract (``ctx.sandbox``): what a consumer sends, what a provider returns.

It lives in the host layer so consumers (the ``bash`` tool) and providers (``sandbox-local``,
or a third-party container provider) share one vocabulary without importing each other.

Two boundaries are kept apart (``user-approval``'s README says why): approval answers "did a
person agree to this occurrence?", the sandbox answers "what may the process touch while it
runs?". Nothing here asks anybody anything; the policy rides each call and a provider keeps no
mode of its own.

Vocabulary:

* ``read-only`` — no writes anywhere except ``/dev/null``;
* ``workspace-write`` — additionally the workspace root and a backend-defined temporary area;
* ``danger-full-access`` — **not a sandbox**: the consumer spawns its original argv and does not
  call the provider. It is the absence of confinement, not a wide one.
"""

from __future__ import annotations

import os
import stat
import tempfile
import unicodedata
from collections.abc import Sequence
from typing import ClassVar, Final, Literal, Protocol, runtime_checkable

import msgspec

from dsh_host._context import ServiceKey
from dsh_host._sandbox_modes import (  # re-exported: spelled once there
    CONFINED_SANDBOX_MODES as CONFINED_SANDBOX_MODES,
)
from dsh_host._sandbox_modes import SANDBOX_MODES as SANDBOX_MODES
from dsh_host._sandbox_modes import ConfinedSandboxMode as ConfinedSandboxMode
from dsh_host._sandbox_modes import SandboxMode as SandboxMode
from dsh_host._userdirs import config_home, user_config_file
from dsh_host.errors import DshError

SandboxEnforcement = Literal["full", "partial"]
SandboxBackend = Literal["bubblewrap", "landlock", "none"]


UNAVAILABLE_MESSAGE = (
    'sandbox mode "{mode}" is requested but no sandbox backend is usable on this host; refusing '
    "to run the command unconfined. Install bubblewrap or run a Landlock-enforcing kernel "
    "(Linux), ensure sandbox-exec is usable (macOS), or ensure the ACL restricted-token runner "
    "can start (Windows) — otherwise switch the consumer to danger-full-access."
)
"""Exact text of :class:`SandboxUnavailableError` (DSH's); ``{mode}`` is the confined mode."""


def capped_mode(mode: SandboxMode, agent: object) -> SandboxMode:
    """``mode``, narrowed to the calling agent's ``sandbox_cap`` when it has a narrower one.

    A sub-agent runs under at most its parent's confinement (D24): its core agent carries the
    ceiling, and every consumer that derives a call's standing mode from its row's mode passes
    it through here, so a child never runs wider than declared, whatever the row says.
    """
    cap = getattr(agent, "sandbox_cap", None)
    if cap in SANDBOX_MODES and SANDBOX_MODES.index(cap) < SANDBOX_MODES.index(mode):
        narrowed: SandboxMode = cap
        return narrowed
    return mode


class SandboxUnavailableError(DshError):
    """No sandbox backend can confine this call, so the command must not run at all.

    Raised by ``confine()`` (no usable backend: the verdict of the one-time probe), and by a
    consumer when the runner itself failed at execution time (``runner_failure`` is then the
    matched runner line or the spawn error's text and is appended as `` Runner failure: ...``).
    ``probe_failures`` says, per backend, why the probe found it unusable; it is appended to the
    exact contract sentence, never substituted for it.
    """

    code: ClassVar[str] = "SANDBOX_UNAVAILABLE"

    def __init__(
        self,
        mode: str,
        runner_failure: str | None = None,
        *,
        probe_failures: Sequence[str] = (),
    ) -> None:
        message = UNAVAILABLE_MESSAGE.format(mode=mode)
        if runner_failure is not None:
            message += f" Runner failure: {runner_failure}"
        if probe_failures:
            message += " Probe results: " + "; ".join(probe_failures) + "."
        super().__init__(message)
        self.mode = mode
        self.runner_failure = runner_failure
        self.probe_failures = tuple(probe_failures)


class InvalidSandboxRequestError(DshError, ValueError):
    """A policy or argv that cannot be confined as given (a caller bug, not a host problem).

    Derives from ``ValueError`` too, so msgspec reports it as a validation error when a policy is
    decoded from JSON/YAML.
    """

    code: ClassVar[str] = "INVALID_SANDBOX_REQUEST"


class SandboxPolicy(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """The complete per-call policy (DSH's ``SandboxExecutionPolicy``).

    ``workspace_root`` is an absolute host directory, canonical as the policy service resolved
    it; it is carried even when the mode does not use it. A provider only ever confines the two
    confined modes; ``danger-full-access`` is accepted here because consumers carry one policy
    type, and a provider answers it with an explicit ``backend="none"`` passthrough.

    ``read_only_paths`` are absolute host paths inside the writable roots that the confined
    process must not modify (``.git``, virtualenvs, the harness's own config and state: code that
    runs later *outside* the sandbox). A provider that cannot hold them read-only says so in
    ``ConfinedArgv.not_covered``. Paths that do not exist are ignored.

    ``hidden_paths`` are absolute host paths the confined process must not even read (the
    harness's secrets: ``dsh serve``'s token file). A provider that cannot hide them refuses to
    confine (``SandboxUnavailableError``) rather than run the call with the secret in view.
    """

    mode: SandboxMode
    workspace_root: str
    session_id: str | None = None
    read_only_paths: tuple[str, ...] = ()
    hidden_paths: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.mode not in SANDBOX_MODES:
            raise InvalidSandboxRequestError(
                f"sandbox policy: unknown mode {self.mode!r}; expected one of "
                + ", ".join(SANDBOX_MODES)
            )
        if not isinstance(self.workspace_root, str) or not os.path.isabs(self.workspace_root):
            raise InvalidSandboxRequestError(
                f"sandbox policy: workspace_root must be an absolute path, got "
                f"{self.workspace_root!r}"
            )
        if "\0" in self.workspace_root:
            raise InvalidSandboxRequestError("sandbox policy: workspace_root contains a NUL byte")
        for path in self.read_only_paths:
            if not isinstance(path, str) or not os.path.isabs(path) or "\0" in path:
                raise InvalidSandboxRequestError(
                    f"sandbox policy: read_only_paths entries must be absolute paths, got {path!r}"
                )
        for path in self.hidden_paths:
            if not isinstance(path, str) or not os.path.isabs(path) or "\0" in path:
                raise InvalidSandboxRequestError(
                    f"sandbox policy: hidden_paths entries must be absolute paths, got {path!r}"
                )


_harness_secrets: list[str] = []


def hide_from_sandboxes(path: str) -> None:
    """Register a host file of the harness that no confined call of this process may read (the
    ``dsh serve`` token file). Every provider adds these to each policy's ``hidden_paths`` at
    ``confine()``, the one place every confined spawn passes, so no consumer has to remember."""
    real = os.path.realpath(path)
    if real not in _harness_secrets:
        _harness_secrets.append(real)


#: File name of the default audit signing key, in ``$XDG_CONFIG_HOME/dsh/``
#: (:func:`dsh_host._session.audit.default_key_file`).
AUDIT_KEY_NAME: Final = "audit-ed25519.pem"


def harness_secret_paths() -> tuple[str, ...]:
    """The paths registered with :func:`hide_from_sandboxes`, and the default audit signing key
    when it exists: an export signed with it proves what the log holds only while no tool could
    read it, and tools run in processes that never load the audit code, so it is named here,
    where every confined spawn asks, rather than registered by whoever signs."""
    key = os.path.realpath(config_home() / "dsh" / AUDIT_KEY_NAME)
    if os.path.lexists(key) and key not in _harness_secrets:
        return (*_harness_secrets, key)
    return tuple(_harness_secrets)


def writable_roots(policy: SandboxPolicy) -> tuple[str, ...]:
    """Writable roots of the path-fence consumers (fs tools, Seatbelt).

    Empty for ``read-only``; ``workspace-write`` gets the workspace, ``/tmp`` and the OS temp
    dir, canonical and de-duplicated. The bubblewrap and Landlock profiles spell their own temp
    grants and do not use this.
    """
    if policy.mode != "workspace-write":
        return ()
    roots: list[str] = []
    for root in (policy.workspace_root, "/tmp", tempfile.gettempdir()):
        canonical = os.path.abspath(os.path.realpath(root))
        if canonical not in roots:
            roots.append(canonical)
    return tuple(roots)


DEFAULT_PROTECTED_NAMES: tuple[str, ...] = (".git", ".dsh", "dsh.yml")
"""Workspace entries held read-only under ``workspace-write`` by default: code and config that
runs later *outside* the sandbox (git hooks and ``core.fsmonitor``, the harness's own state and
composition)."""

#: How many directory levels below the workspace the virtualenv search looks (1: the
#: workspace's own children, ``.venv``; 2: ``backend/.venv``; ...).
VIRTUALENV_SEARCH_DEPTH: Final = 6
#: The most directories the virtualenv search opens for one policy (breadth-first, so the
#: shallow ones, where virtualenvs live, are always looked at first).
VIRTUALENV_SEARCH_DIRS: Final = 20_000
#: Directories the virtualenv search never enters: a repository's object store and a package
#: manager's tree hold no virtualenv of the project and can hold hundreds of thousands of entries.
VIRTUALENV_SEARCH_SKIP: Final = frozenset({".git", "node_modules"})


def find_virtualenvs(
    workspace_root: str,
    *,
    max_depth: int = VIRTUALENV_SEARCH_DEPTH,
    max_dirs: int = VIRTUALENV_SEARCH_DIRS,
) -> tuple[str, ...]:
    """Every virtualenv beneath the workspace: a directory holding a ``pyvenv.cfg`` file.

    A virtualenv's ``bin/`` scripts and ``site-packages/*.pth`` files run later, unconfined,
    whenever anybody uses it, wherever it sits (``.venv``, ``backend/.venv``). The search is
    breadth-first, follows no symbolic link, does not enter a virtualenv it found (nor
    :data:`VIRTUALENV_SEARCH_SKIP`), and stops at ``max_depth`` levels or after ``max_dirs``
    directories, so a huge tree costs a bounded walk per call; a virtualenv past either bound is
    not found (the README of ``builtin-tools`` says so).
    """
    found: list[str] = []
    level = [workspace_root]
    opened = 0
    for _depth in range(max_depth):
        following: list[str] = []
        for directory in level:
            if opened >= max_dirs:
                return tuple(found)
            opened += 1
            try:
                with os.scandir(directory) as scan:
                    children = [
                        entry.path
                        for entry in scan
                        if entry.name not in VIRTUALENV_SEARCH_SKIP
                        and entry.is_dir(follow_symlinks=False)
                    ]
            except OSError:
                continue
            for child in sorted(children):
                try:
                    marker = os.lstat(os.path.join(child, "pyvenv.cfg"))
                except OSError:
                    following.append(child)
                    continue
                if stat.S_ISREG(marker.st_mode):
                    found.append(child)
                else:
                    following.append(child)
        level = following
    return tuple(found)


def workspace_read_only_paths(
    workspace_root: str, names: Sequence[str] = DEFAULT_PROTECTED_NAMES, *, virtualenvs: bool = True
) -> tuple[str, ...]:
    """The protected paths of a workspace: each of ``names`` under it, plus its virtualenvs.

    ``names`` are relative to the workspace (``.git``, ``tools/hooks``) and are listed whether
    they exist or not: a provider skips what does not exist (a bind needs a source), while the
    in-process file tools refuse to create it. Virtualenvs are found at any depth
    (:func:`find_virtualenvs`). The result feeds :attr:`SandboxPolicy.read_only_paths`; build a
    call's policy with :func:`call_policy` so every consumer sees the same list.
    """
    found: list[str] = []
    for name in names:
        path = os.path.normpath(os.path.join(workspace_root, name))
        if path not in found:
            found.append(path)
    if virtualenvs:
        for path in find_virtualenvs(workspace_root):
            if path not in found:
                found.append(path)
    return tuple(found)


def call_policy(
    mode: SandboxMode,
    workspace_root: str,
    *,
    protected_names: Sequence[str] = DEFAULT_PROTECTED_NAMES,
    virtualenvs: bool = True,
    session_id: str | None = None,
) -> SandboxPolicy:
    """The one policy of one call: every effect of the call takes its view from it.

    ``bash`` hands it to the provider, the in-process file tools refuse writes under its
    :attr:`~SandboxPolicy.read_only_paths` (:func:`read_only_cover`) and outside its
    :func:`writable_roots`, and the helpers the harness spawns (ripgrep, MCP servers) are
    confined by it. The protected paths matter only where something may be written
    (``workspace-write``); ``read-only`` writes nothing and ``danger-full-access`` is no
    sandbox, so both carry none.
    """
    protected = (
        workspace_read_only_paths(workspace_root, protected_names, virtualenvs=virtualenvs)
        if mode == "workspace-write"
        else ()
    )
    return SandboxPolicy(
        mode=mode, workspace_root=workspace_root, session_id=session_id, read_only_paths=protected
    )


def _fold(path: str) -> tuple[str, ...]:
    """``path``'s components as a case- and compatibility-insensitive key: on a case-folding
    filesystem (``ext4 -O casefold``, vfat, a macOS volume) ``.GIT`` and ``.git`` are one
    entry, so the comparison must not tell them apart either."""
    normal = unicodedata.normalize("NFKC", path)
    return tuple(part.casefold() for part in normal.split(os.sep) if part not in ("", "."))


def read_only_cover(policy: SandboxPolicy, path: str) -> str | None:
    """The entry of ``policy.read_only_paths`` that ``path`` is or lies beneath, or None.

    ``path`` is absolute and lexical (its components name directory entries, no ``..``, no
    symbolic link followed, as the file tools open it). Components are compared case- and
    compatibility-insensitively (see :func:`_fold`): refusing ``.GIT`` on a case-sensitive
    disk costs nothing, writing ``.git/config`` through it on a case-folding one would not.
    """
    target = _fold(path)
    for protected in policy.read_only_paths:
        key = _fold(protected)
        if target[: len(key)] == key:
            return protected
    return None


#: Inherited variables a confined tool process gets by default (class 4 of issue 15: an
#: allow-list, so ``DATABASE_URL``, ``TMUX``, ``SSH_AUTH_SOCK``, proxy credentials ... never reach
#: the tool). A trailing ``*`` is a prefix pattern; a consumer's row adds names or patterns
#: (``bash``'s ``envAllow``, an ``mcp-client`` row's ``envAllow``).
DEFAULT_ENV_ALLOW: tuple[str, ...] = (
    "PATH",
    "HOME",
    "LANG",
    "LANGUAGE",
    "LC_*",
    "TERM",
    "TZ",
    "USER",
    "LOGNAME",
    "SHELL",
    "TMPDIR",
)


def env_allowed(name: str, patterns: Sequence[str]) -> bool:
    """Whether ``name`` matches an allow-list entry (exact, or a ``PREFIX*`` pattern)."""
    for pattern in patterns:
        if pattern.endswith("*") and name.startswith(pattern[:-1]):
            return True
        if name == pattern:
            return True
    return False


def allowed_environment(patterns: Sequence[str] = DEFAULT_ENV_ALLOW) -> dict[str, str]:
    """The inherited environment a tool process may see: allow-listed names only.

    Inherited ``DSH_*`` never pass, whatever the allow-list says (the harness's own settings
    are not the tool's business; a consumer adds the managed ``DSH_*`` values it means to give).
    """
    return {
        name: value
        for name, value in os.environ.items()
        if env_allowed(name, patterns) and not name.startswith("DSH_")
    }


def _overlap(a: str, b: str) -> bool:
    return os.path.commonpath([a, b]) in (a, b)


def _canonical(path: str) -> str:
    return os.path.abspath(os.path.realpath(os.path.expanduser(path)))


def harness_state_conflict(
    session_root: str | None,
    writable: Sequence[tuple[str, str]],
    *,
    who: str,
    actor: str,
    elsewhere: str,
) -> str | None:
    """Why ``writable`` (``(path, why)`` pairs a consumer's processes may write) would reach the
    harness's own state, or None.

    The session log (under ``session_root``) and the user's dsh configuration directory (a
    composition, the trust store) must stay out of reach of whatever the harness runs: a tool
    that could rewrite them could forge its own record or plant a composition for the next run.
    ``who`` prefixes the message, ``actor`` names what could write, ``elsewhere`` says how to
    choose another directory (``--workspace DIR``).
    """
    root = _canonical(session_root) if session_root is not None else None
    config_dir = _canonical(str(user_config_file().parent))
    for path, what in writable:
        if root is not None and _overlap(root, path):
            return (
                f"{who}: the session root {root} overlaps {path} ({what}), so {actor} could "
                "rewrite the log that records them; store sessions outside it (--root DIR, "
                f"DSH_SESSION_ROOT or the persistence row's `root`) or {elsewhere}"
            )
        if _overlap(config_dir, path):
            return (
                f"{who}: your dsh configuration directory {config_dir} overlaps {path} ({what}), "
                f"so {actor} could plant a composition or a trust record for your next run; "
                f"{elsewhere} or move it (XDG_CONFIG_HOME)"
            )
    return None


class RunnerFailureRule(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """Recognises that the runner failed before the command ran.

    ``allowed_exit_codes`` gates the rule (``None`` = any non-zero status); lines equal
    (case-insensitively, whole line) to an informational line are skipped; the first remaining
    line containing a fatal signature (case-insensitively) is the failure detail.
    """

    fatal_signatures: tuple[str, ...]
    allowed_exit_codes: tuple[int, ...] | None = None
    informational_lines: tuple[str, ...] = ()

    def match(self, exit_code: int | None, stderr: str) -> str | None:
        if exit_code is None or exit_code == 0:
            return None
        if self.allowed_exit_codes is not None and exit_code not in self.allowed_exit_codes:
            return None
        informational = {line.lower() for line in self.informational_lines}
        signatures = [s.lower() for s in self.fatal_signatures if s.strip()]
        for line in stderr.replace("\r\n", "\n").split("\n"):
            if line.lower() in informational:
                continue
            lowered = line.lower()
            if any(sig in lowered for sig in signatures):
                return line
        return None


class ConfinedArgv(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """What ``confine()`` returns: spawn ``argv`` *instead of* the caller's argv.

    ``argv`` = runner, profile arguments, ``--``, then the caller's argv unchanged (or, for
    ``backend="none"``, the caller's argv alone). ``enforcement`` is ``partial`` exactly when
    ``not_covered`` names something the policy promises but this backend cannot govern;
    callers needing an absolute boundary must not treat ``partial`` as ``full``.
    ``denial_signatures`` are case-insensitive stderr substrings a blocked file effect produces
    under *this* backend.
    """

    argv: tuple[str, ...]
    mode: SandboxMode
    backend: SandboxBackend
    enforcement: SandboxEnforcement
    not_covered: tuple[str, ...] = ()
    denial_signatures: tuple[str, ...] = ()
    runner_failure_rules: tuple[RunnerFailureRule, ...] = ()

    def runner_failure(self, exit_code: int | None, stderr: str) -> str | None:
        """The runner line proving the runner failed before the command ran, if any."""
        for rule in self.runner_failure_rules:
            detail = rule.match(exit_code, stderr)
            if detail is not None:
                return detail
        return None

    def is_denial(self, exit_code: int | None, stderr: str) -> bool:
        """A non-zero exit whose stderr carries this backend's denial dialect.

        Runner failure outranks denial; a clean exit or a signal kill (``None``) never denies.
        """
        if exit_code is None or exit_code == 0:
            return False
        if self.runner_failure(exit_code, stderr) is not None:
            return False
        lowered = stderr.lower()
        return any(sig.lower() in lowered for sig in self.denial_signatures if sig.strip())


@runtime_checkable
class SandboxProvider(Protocol):
    """The ``sandbox`` service: wrap an exact argv so the OS confines its file effects.

    ``confine`` takes an argv (never a shell string: a shell consumer passes
    ``["bash", "-c", command]``) and either returns enforcing argv or raises
    :class:`SandboxUnavailableError`. Silent unconfined passthrough is forbidden.
    """

    def confine(self, argv: Sequence[str], policy: SandboxPolicy) -> ConfinedArgv: ...


#: The ``sandbox`` service (``sandbox-local`` provides it); absent, confined tools fail closed.
SANDBOX: ServiceKey[SandboxProvider] = ServiceKey("sandbox")


def confined_writable_roots(provider: object, policy: SandboxPolicy) -> tuple[str, ...]:
    """Host paths a call confined by ``provider`` under ``policy`` can write.

    A provider may answer exactly with an optional ``writable_roots(policy)`` method
    (``sandbox-local`` does: it depends on the backend it chose); for one that does not, the
    answer is the conservative path-fence set of :func:`writable_roots` (the workspace, ``/tmp``
    and the OS temp dir in ``workspace-write``).
    """
    method = getattr(provider, "writable_roots", None)
    if callable(method):
        return tuple(str(path) for path in method(policy))
    return writable_roots(policy)

"""The contract: exact argv per backend and mode, config errors, rules, errors, policy checks."""

from __future__ import annotations

import math
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import dsh_sandbox_local
import msgspec
import pytest
from dsh_sandbox_local import (
    ConfinedArgv,
    InvalidSandboxRequestError,
    LocalSandboxProvider,
    RunnerFailureRule,
    SandboxConfigError,
    SandboxLocalConfig,
    SandboxPolicy,
    SandboxProvider,
    SandboxUnavailableError,
    writable_roots,
)
from dsh_sandbox_local.landlock_run import cgroup_limits_supported
from dsh_sandbox_local.profiles import (
    NC_ABSTRACT_UNIX,
    NC_HOST_IPC,
    NC_IOCTL,
    NC_LIMITS,
    NC_METADATA,
    NC_NETWORK_ALL,
    NC_PROCESSES,
    NC_PROTECTED,
    NC_SIGNALS,
    NC_TERMINALS,
    NC_TRUNCATE,
    NC_UDP,
    NOT_A_SANDBOX,
    bwrap_profile_args,
    landlock_not_covered,
)

from dsh_host.errors import ConfigError, DshError

from .sandbox_harness import linux_only, provider_for, run_confined


@pytest.fixture(autouse=True)
def _interpreter_not_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    """The exact-argv tests expect no interpreter binds (they appear only when the running
    Python lies under /tmp, as in a fresh CI clone; tested on their own below)."""
    monkeypatch.setattr(dsh_sandbox_local.profiles, "interpreter_paths", lambda: ())


WS = "/var/tmp/some-workspace"
RO = SandboxPolicy(mode="read-only", workspace_root=WS)
WW = SandboxPolicy(mode="workspace-write", workspace_root=WS)


@pytest.fixture(scope="module")
def unprivileged_launcher() -> Iterator[tuple[str, ...]]:
    """The Landlock launcher copied outside the host /tmp (into /var/tmp).

    Unisolated Landlock grants the host ``/tmp`` to workspace-write calls, so the provider
    rightly refuses a launcher installed under ``/tmp`` (a call could rewrite it); a checkout
    under ``/tmp`` (a CI clone) would otherwise make these report tests unrunnable. The
    script is standalone (stdlib only, run with ``-I -S``).
    """
    import tempfile

    from dsh_sandbox_local.profiles import launcher_files

    interpreter, script = launcher_files()
    directory = Path(tempfile.mkdtemp(prefix="dsh-test-launcher-", dir="/var/tmp"))
    copy = directory / "landlock_run.py"
    shutil.copyfile(script, copy)
    yield (interpreter, "-I", "-S", str(copy))
    shutil.rmtree(directory)
DFA = SandboxPolicy(mode="danger-full-access", workspace_root=WS)

BWRAP_HEAD = (
    "--ro-bind", "/", "/", "--dev", "/dev", "--unshare-pid", "--unshare-ipc", "--proc", "/proc",
    "--ro-bind", "/proc/sys", "/proc/sys", "--remount-ro", "/proc", "--tmpfs", "/tmp",
)  # fmt: skip
BWRAP_BASE_TAIL = ("--die-with-parent", "--new-session", "--cap-drop", "ALL")
#: With the seccomp stage: it is PID 1 and keeps two capabilities until it drops them all.
BWRAP_TAIL = (*BWRAP_BASE_TAIL, "--as-pid-1", "--cap-add", "CAP_SYS_ADMIN", "--cap-add",
              "CAP_SETPCAP")  # fmt: skip
INTERPRETER, SCRIPT = (
    os.path.realpath(sys.executable),
    str(Path(dsh_sandbox_local.__file__).with_name("landlock_run.py").resolve()),
)
STAGE2_BIND = ("--ro-bind", SCRIPT, "/run/dsh/landlock_run.py")
STAGE2 = (INTERPRETER, "-I", "-S", "/run/dsh/landlock_run.py", "--no-landlock", "--init", "--deny-unix",
          "--")  # fmt: skip
LAUNCHER = (INTERPRETER, "-I", "-S", SCRIPT)


def limits() -> tuple[str, ...]:
    """The per-call cgroup limits this host supports, as the launcher takes them."""
    supported = cgroup_limits_supported()
    memory = (os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2**20 // 2) * 2**20
    return (
        *(("--pids-max", "4096") if "pids" in supported else ()),
        *(("--memory-max", str(memory)) if "memory" in supported else ()),
    )


def relay() -> tuple[str, ...]:
    return (*LAUNCHER, "--relay", *limits(), "--") if limits() else ()


UNAVAILABLE = (
    'sandbox mode "read-only" is requested but no sandbox backend is usable on this host; '
    "refusing to run the command unconfined. Install bubblewrap or run a Landlock-enforcing "
    "kernel (Linux), ensure sandbox-exec is usable (macOS), or ensure the ACL restricted-token "
    "runner can start (Windows) — otherwise switch the consumer to danger-full-access."
)


# -- exact argv --------------------------------------------------------------------------------


@linux_only
@pytest.mark.parametrize("network", ["deny", "allow"])
def test_bwrap_argv_exact(network: str) -> None:
    provider = provider_for("bubblewrap", network)
    net = ("--unshare-net",) if network == "deny" else ()
    ro = provider.confine(["bash", "-c", "echo hi"], RO)
    assert ro.argv == (
        *relay(), provider.probe().runner[0], *BWRAP_HEAD, "--tmpfs", "/run", *STAGE2_BIND, "--remount-ro",
        "/run", *BWRAP_TAIL, *net, "--remount-ro", "/tmp", "--", *STAGE2, "bash", "-c", "echo hi",
    )  # fmt: skip
    ww = provider.confine(["ls", "-l"], WW)
    assert ww.argv == (
        *relay(), provider.probe().runner[0], *BWRAP_HEAD, "--tmpfs", "/run", *STAGE2_BIND, "--remount-ro",
        "/run", *BWRAP_TAIL, *net, "--bind", WS, WS, "--", *STAGE2, "ls", "-l",
    )  # fmt: skip
    protected = SandboxPolicy(
        mode="workspace-write", workspace_root=WS, read_only_paths=(f"{WS}/.git", f"{WS}/.venv")
    )
    argv = provider.confine(["ls"], protected).argv
    tail = argv[argv.index("--bind") :]
    assert tail[: tail.index("--")] == (
        "--bind", WS, WS, "--ro-bind-try", f"{WS}/.git", f"{WS}/.git",
        "--ro-bind-try", f"{WS}/.venv", f"{WS}/.venv",
    )  # fmt: skip
    for result in (ro, ww):
        assert result.backend == "bubblewrap"
        assert result.enforcement == "full"
        assert result.not_covered == ()
        assert result.denial_signatures == ("read-only file system",)
        assert result.runner_failure_rules == (
            RunnerFailureRule(fatal_signatures=("bwrap: ",)),
            RunnerFailureRule(
                allowed_exit_codes=(125,),
                fatal_signatures=("landlock-run: ",),
                informational_lines=("landlock-run: partial enforcement (older Landlock ABI)",),
            ),
        )


def test_bwrap_read_only_workspace_under_tmp_stays_visible() -> None:
    policy = SandboxPolicy(mode="read-only", workspace_root="/tmp/ws")
    args = bwrap_profile_args(policy, "deny")
    assert args[-5:] == ("--ro-bind", "/tmp/ws", "/tmp/ws", "--remount-ro", "/tmp")
    assert "--bind" not in bwrap_profile_args(RO, "deny")


@linux_only
@pytest.mark.parametrize("network", ["deny", "allow"])
def test_landlock_argv_exact(network: str) -> None:
    provider = provider_for("landlock", network)
    deny = ("--deny-tcp",) if network == "deny" else ()
    ro = provider.confine(["bash", "-c", "echo hi"], RO)
    assert ro.argv == (*LAUNCHER, "--isolate", "--ro", "/", "--rw", "/dev/null", *deny,
                       "--deny-unix", *limits(), "--", "bash", "-c", "echo hi")  # fmt: skip
    ww = provider.confine(["ls"], WW)
    assert ww.argv == (*LAUNCHER, "--isolate", "--ro", "/", "--rw", "/dev/null", "--rw", "/tmp",
                       "--rw", WS, "--rw", "/dev/shm", *deny, "--deny-unix", *limits(), "--",
                       "ls")  # fmt: skip
    protected = SandboxPolicy(mode="workspace-write", workspace_root=WS,
                              read_only_paths=(f"{WS}/.git",))  # fmt: skip
    assert provider.confine(["ls"], protected).argv == (
        *LAUNCHER, "--isolate", "--ro", "/", "--rw", "/dev/null", "--rw", "/tmp", "--rw", WS,
        "--rw", "/dev/shm", "--protect", f"{WS}/.git", *deny, "--deny-unix", *limits(), "--", "ls",
    )  # fmt: skip
    for result in (ro, ww):
        assert result.backend == "landlock"
        # root: the read-only mount namespace stops metadata changes; only UDP stays open
        assert result.enforcement == ("partial" if network == "deny" else "full")
        assert NC_METADATA not in result.not_covered
        assert (NC_UDP in result.not_covered) == (network == "deny")
        assert NC_PROCESSES not in result.not_covered  # root: the launcher's namespaces
        assert result.denial_signatures == ("permission denied", "read-only file system")
        assert result.runner_failure_rules == (
            RunnerFailureRule(
                allowed_exit_codes=(125,),
                fatal_signatures=("landlock-run: ",),
                informational_lines=("landlock-run: partial enforcement (older Landlock ABI)",),
            ),
        )


@linux_only
def test_landlock_without_privileges_names_what_it_cannot_isolate(
    unprivileged_launcher: tuple[str, ...],
) -> None:
    provider = LocalSandboxProvider(
        SandboxLocalConfig(backend="landlock"),
        landlock_isolation=False,
        landlock_launcher=unprivileged_launcher,
    )
    protected = SandboxPolicy(mode="workspace-write", workspace_root=WS,
                              read_only_paths=(f"{WS}/.git",))  # fmt: skip
    result = provider.confine(["ls"], protected)
    assert "--isolate" not in result.argv and "--protect" not in result.argv
    for item in (NC_METADATA, NC_PROCESSES, NC_TERMINALS, NC_HOST_IPC, NC_PROTECTED):
        assert item in result.not_covered
    assert NC_PROTECTED not in provider.confine(["ls"], WW).not_covered


@linux_only
def test_unix_sockets_allow_drops_the_seccomp_socket_rule() -> None:
    for backend in ("bubblewrap", "landlock"):
        provider = LocalSandboxProvider(
            SandboxLocalConfig(backend=backend, unix_sockets="allow")
        )
        assert "--deny-unix" not in provider.confine(["ls"], RO).argv


def test_caller_argv_is_passed_verbatim_after_the_separator() -> None:
    provider = LocalSandboxProvider(SandboxLocalConfig(runner_command=("my-runner",),
                                                       runner_failure_signatures=("x",)))  # fmt: skip
    tricky = ["--", "--ro", "/", "$(rm -rf ~)", "with space", "ünïcode", ""]
    result = provider.confine(tricky, RO)
    sep = result.argv.index("--")
    assert result.argv[sep + 1 :] == tuple(tricky)


@pytest.mark.parametrize(
    ("abi", "network", "expected"),
    [
        (1, "deny", (NC_TRUNCATE, NC_IOCTL, NC_SIGNALS, NC_ABSTRACT_UNIX, NC_NETWORK_ALL)),
        (2, "allow", (NC_TRUNCATE, NC_IOCTL, NC_SIGNALS, NC_ABSTRACT_UNIX)),
        (3, "deny", (NC_IOCTL, NC_SIGNALS, NC_ABSTRACT_UNIX, NC_NETWORK_ALL)),
        (4, "deny", (NC_IOCTL, NC_SIGNALS, NC_ABSTRACT_UNIX, NC_UDP)),
        (5, "deny", (NC_SIGNALS, NC_ABSTRACT_UNIX, NC_UDP)),
        (6, "deny", (NC_UDP,)),
        (7, "deny", (NC_UDP,)),
        (7, "allow", ()),
    ],
)  # fmt: skip
def test_landlock_coverage_per_abi(abi: int, network: str, expected: tuple[str, ...]) -> None:
    assert landlock_not_covered(abi, network) == expected  # type: ignore[arg-type]
    unprivileged = landlock_not_covered(abi, network, isolated=False)  # type: ignore[arg-type]
    assert unprivileged == (NC_METADATA, *expected, NC_PROCESSES, NC_TERMINALS, NC_HOST_IPC)


# -- danger-full-access ------------------------------------------------------------------------


def test_danger_full_access_is_not_a_sandbox_and_never_probes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fresh_probes: None
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap; Landlock launcher broken below
    provider = LocalSandboxProvider(landlock_launcher=["/nonexistent/python"])
    result = provider.confine(["bash", "-c", "echo hi"], DFA)
    assert result.argv == ("bash", "-c", "echo hi")
    assert result.backend == "none"
    assert result.enforcement == "partial"
    assert result.not_covered == (NOT_A_SANDBOX,)
    assert provider._verdict is None  # no probe happened
    with pytest.raises(SandboxUnavailableError):
        provider.confine(["true"], RO)


# -- request validation ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        ("echo hi", "never a shell string"),
        (b"echo hi", "never a shell string"),
        ([], "non-empty argv"),
        (["echo", 3], r"argv\[1\] must be a str"),
        (["echo", "a\0b"], r"argv\[1\] contains a NUL byte"),
    ],
)
def test_confine_rejects_malformed_argv(argv: object, match: str) -> None:
    provider = LocalSandboxProvider(SandboxLocalConfig(runner_command=("r",),
                                                       runner_failure_signatures=("x",)))  # fmt: skip
    with pytest.raises(InvalidSandboxRequestError, match=match) as info:
        provider.confine(argv, RO)  # type: ignore[arg-type]
    assert info.value.code == "INVALID_SANDBOX_REQUEST"
    assert isinstance(info.value, DshError)


@pytest.mark.parametrize("root", ["/", "/proc", "/proc/sys", "/sys/kernel", "/dev", "/dev/shm/"])
def test_workspace_write_refuses_disguised_full_access(root: str) -> None:
    provider = LocalSandboxProvider(SandboxLocalConfig(runner_command=("r",),
                                                       runner_failure_signatures=("x",)))  # fmt: skip
    with pytest.raises(InvalidSandboxRequestError, match="workspace_root"):
        provider.confine(["true"], SandboxPolicy(mode="workspace-write", workspace_root=root))
    # read-only does not use the root, so any absolute root is fine there
    provider.confine(["true"], SandboxPolicy(mode="read-only", workspace_root=root))


def test_policy_validation() -> None:
    with pytest.raises(InvalidSandboxRequestError, match="absolute path"):
        SandboxPolicy(mode="read-only", workspace_root="relative/dir")
    with pytest.raises(InvalidSandboxRequestError, match="unknown mode"):
        SandboxPolicy(mode="yolo", workspace_root="/x")  # type: ignore[arg-type]
    with pytest.raises(msgspec.ValidationError, match="absolute path"):
        msgspec.convert({"mode": "read-only", "workspaceRoot": "rel"}, SandboxPolicy)
    policy = msgspec.json.decode(
        b'{"mode":"workspace-write","workspaceRoot":"/w","sessionId":"s1"}', type=SandboxPolicy
    )
    assert policy == SandboxPolicy(mode="workspace-write", workspace_root="/w", session_id="s1")
    with pytest.raises(InvalidSandboxRequestError, match="SandboxPolicy"):
        LocalSandboxProvider().confine(["true"], {"mode": "read-only"})  # type: ignore[arg-type]


def test_writable_roots(tmp_path: Path) -> None:
    import tempfile

    ws = str(tmp_path)
    assert writable_roots(SandboxPolicy(mode="read-only", workspace_root=ws)) == ()
    roots = writable_roots(SandboxPolicy(mode="workspace-write", workspace_root=ws))
    assert roots[0] == os.path.realpath(ws)
    assert "/tmp" in roots or os.path.realpath("/tmp") in roots
    assert os.path.realpath(tempfile.gettempdir()) in roots
    assert len(set(roots)) == len(roots)


# -- config ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"runner_failure_signatures": ["x"]},
         "sandbox-local: runner_failure_signatures requires runner_command"),
        ({"runner_command": ["r"]},
         "sandbox-local: runner_command requires at least one runner_failure_signatures entry"),
        ({"runner_command": ["r"], "runner_failure_signatures": ["  "]},
         "sandbox-local: runner_failure_signatures entries must be non-empty single-line strings"),
        ({"runner_command": ["r"], "runner_failure_signatures": ["a\nb"]},
         "sandbox-local: runner_failure_signatures entries must be non-empty single-line strings"),
        ({"probe_timeout_ms": 0}, "sandbox-local: probe_timeout_ms must be a positive finite number"),
        ({"probe_timeout_ms": -5}, "sandbox-local: probe_timeout_ms must be a positive finite number"),
        ({"runner_command": ["r"], "runner_failure_signatures": ["x"], "backend": "landlock"},
         "cannot be combined with backend: landlock"),
    ],
)  # fmt: skip
def test_config_errors(config: dict[str, object], message: str) -> None:
    with pytest.raises(msgspec.ValidationError, match=message.replace(" ", r"\s")):
        msgspec.convert(config, SandboxLocalConfig)


def test_config_errors_direct_construction_and_types() -> None:
    with pytest.raises(SandboxConfigError, match="probe_timeout_ms") as info:
        SandboxLocalConfig(probe_timeout_ms=math.inf)
    assert isinstance(info.value, ConfigError)
    with pytest.raises(SandboxConfigError, match="probe_timeout_ms"):
        SandboxLocalConfig(probe_timeout_ms=math.nan)
    with pytest.raises(msgspec.ValidationError, match="network"):
        msgspec.convert({"network": "sometimes"}, SandboxLocalConfig)
    with pytest.raises(msgspec.ValidationError, match="backend"):
        msgspec.convert({"backend": "docker"}, SandboxLocalConfig)
    with pytest.raises(msgspec.ValidationError, match="unknown field"):
        msgspec.convert({"netwrok": "deny"}, SandboxLocalConfig)
    default = msgspec.convert({}, SandboxLocalConfig)
    assert (default.network, default.backend, default.runner_command) == ("deny", "auto", ())
    assert default.probe_timeout_ms == 5000


def test_runner_command_shape_without_probes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fresh_probes: None
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on PATH: proves no probe ran
    config = msgspec.convert(
        {"runner_command": ["/opt/my-bwrap", "--extra"], "runner_failure_signatures": ["my-bwrap: "]},
        SandboxLocalConfig,
    )
    provider = LocalSandboxProvider(config, landlock_launcher=["/nonexistent"])
    result = provider.confine(["true"], WW)
    assert result.argv == (
        "/opt/my-bwrap", "--extra", *BWRAP_HEAD, "--tmpfs", "/run", "--remount-ro", "/run",
        *BWRAP_BASE_TAIL, "--unshare-net", "--bind", WS, WS, "--", "true",
    )  # fmt: skip
    assert result.enforcement == "full"
    assert result.denial_signatures == ("read-only file system", "permission denied")
    assert result.runner_failure_rules == (RunnerFailureRule(fatal_signatures=("my-bwrap: ",)),)
    empty = LocalSandboxProvider(msgspec.convert({"runner_command": []}, SandboxLocalConfig),
                                 landlock_launcher=["/nonexistent"])  # fmt: skip
    with pytest.raises(SandboxUnavailableError):  # an empty runner_command = not configured
        empty.confine(["true"], RO)


# -- errors ------------------------------------------------------------------------------------


def test_unavailable_error_text_and_code() -> None:
    err = SandboxUnavailableError("read-only")
    assert str(err) == UNAVAILABLE
    assert err.code == "SANDBOX_UNAVAILABLE"
    assert type(err).__name__ == "SandboxUnavailableError"
    assert isinstance(err, DshError)
    runner = SandboxUnavailableError("read-only", "bwrap: Can't find source path /x")
    assert str(runner) == UNAVAILABLE + " Runner failure: bwrap: Can't find source path /x"
    probes = SandboxUnavailableError("workspace-write", probe_failures=["a: x", "b: y"])
    assert str(probes).startswith(UNAVAILABLE.replace('"read-only"', '"workspace-write"'))
    assert str(probes).endswith(" Probe results: a: x; b: y.")


def test_provider_satisfies_the_protocol() -> None:
    assert isinstance(LocalSandboxProvider(), SandboxProvider)


# -- runner-failure rules and denial classification ---------------------------------------

BWRAP = ConfinedArgv(
    argv=("bwrap", "--", "x"), mode="read-only", backend="bubblewrap", enforcement="full",
    denial_signatures=("read-only file system",),
    runner_failure_rules=(RunnerFailureRule(fatal_signatures=("bwrap: ",)),),
)  # fmt: skip
NOTICE = "landlock-run: partial enforcement (older Landlock ABI)"
LANDLOCK = ConfinedArgv(
    argv=("python", "--", "x"), mode="read-only", backend="landlock", enforcement="full",
    denial_signatures=("permission denied",),
    runner_failure_rules=(RunnerFailureRule(
        allowed_exit_codes=(125,), fatal_signatures=("landlock-run: ",),
        informational_lines=(NOTICE,)),),
)  # fmt: skip


def test_rules_clean_exit_and_signal_never_match() -> None:
    for confined in (BWRAP, LANDLOCK):
        for code in (0, None):
            assert confined.runner_failure(code, "bwrap: x\nlandlock-run: y") is None
            assert not confined.is_denial(code, "Permission denied\nRead-only file system")


def test_landlock_notice_with_child_exits_is_ordinary() -> None:
    for code in (0, 1, 2, 125):
        assert LANDLOCK.runner_failure(code, NOTICE + "\n") is None
        assert LANDLOCK.runner_failure(code, NOTICE.upper() + "\r\n") is None
    # a fatal line at an exit other than 125 is not enough
    assert LANDLOCK.runner_failure(1, "landlock-run: cannot open rule path: /w: x") is None
    # after the notice, at 125, a fatal line is the detail (original spelling)
    detail = "Landlock-Run: cannot open rule path: /w: No such file or directory"
    assert LANDLOCK.runner_failure(125, f"{NOTICE}\n{detail}\n") == detail
    # future fatal lines fail closed too
    assert LANDLOCK.runner_failure(125, "landlock-run: something new\n") is not None
    # notice + a child's "Permission denied" is a denial, not a runner failure
    assert LANDLOCK.is_denial(1, f"{NOTICE}\nbash: /x: Permission denied\n")
    # the dialect is the active backend's only
    assert not LANDLOCK.is_denial(1, "bash: /x: Read-only file system")
    assert not BWRAP.is_denial(1, "bash: /x: Permission denied")
    assert not BWRAP.is_denial(1, "Operation not permitted")


def test_bwrap_rule_has_no_exit_gate_and_outranks_denial() -> None:
    assert BWRAP.runner_failure(1, "bwrap: Can't find source path /w: x") is not None
    assert BWRAP.runner_failure(127, "oops\nbwrap: execvp nope: No such file") == (
        "bwrap: execvp nope: No such file"
    )
    assert not BWRAP.is_denial(1, "bwrap: x: Read-only file system")


def test_blank_signatures_are_ignored() -> None:
    rule = RunnerFailureRule(fatal_signatures=("", "  ", "boom"))
    assert rule.match(1, "anything at all") is None
    assert rule.match(1, "x\nBOOM here") == "BOOM here"


# -- real runner failures and their classification -------------------------------------------


@linux_only
@pytest.mark.parametrize("backend", ["bubblewrap", "landlock"])
def test_missing_workspace_is_a_runner_failure_only_where_used(backend: str) -> None:
    provider = provider_for(backend)
    missing = "/var/tmp/dsh-sandbox-no-such-workspace-for-sure"
    assert not os.path.exists(missing)
    ww = provider.confine(["true"], SandboxPolicy(mode="workspace-write", workspace_root=missing))
    result = run_confined(ww)
    detail = ww.runner_failure(result.returncode, result.stderr)
    assert detail is not None, result
    prefix = "bwrap: Can't find source path" if backend == "bubblewrap" else (
        "landlock-run: cannot open rule path: " + missing)  # fmt: skip
    assert detail.startswith(prefix)
    if backend == "landlock":
        assert result.returncode == 125
    err = SandboxUnavailableError("workspace-write", detail)
    assert err.code == "SANDBOX_UNAVAILABLE" and detail in str(err)
    ro = provider.confine(["true"], SandboxPolicy(mode="read-only", workspace_root=missing))
    result = run_confined(ro)
    assert result.returncode == 0, result  # root unused under read-only


@linux_only
def test_fake_runner_lines_documented_misattribution() -> None:
    """A child printing a runner-looking line: bwrap misreads any non-zero exit (accepted,
    availability-only); Landlock only at exit 125."""
    bw = provider_for("bubblewrap").confine(
        ["bash", "-c", "echo 'bwrap: fake' >&2; exit 1"], RO)  # fmt: skip
    result = run_confined(bw)
    assert bw.runner_failure(result.returncode, result.stderr) == "bwrap: fake"
    ll = provider_for("landlock")
    for code, misread in ((1, False), (125, True)):
        confined = ll.confine(["bash", "-c", f"echo 'landlock-run: fake' >&2; exit {code}"], RO)
        result = run_confined(confined)
        assert result.returncode == code
        assert (confined.runner_failure(result.returncode, result.stderr) is not None) is misread


@linux_only
def test_limits_are_reported_where_no_cgroup_is_writable(
    unprivileged_launcher: tuple[str, ...],
) -> None:
    """Without a writable cgroup the report names the missing limits (here forced by taking
    the Landlock path without namespaces, which has no relay to own a cgroup)."""
    provider = LocalSandboxProvider(
        SandboxLocalConfig(backend="landlock"),
        landlock_isolation=False,
        landlock_launcher=unprivileged_launcher,
    )
    result = provider.confine(["ls"], WW)
    assert "--pids-max" not in result.argv
    assert NC_LIMITS.format(what="pids and memory") in result.not_covered


@pytest.mark.parametrize("config", [{"pids_max": 0}, {"memory_max_mb": 0}])
def test_limit_config_errors(config: dict[str, object]) -> None:
    with pytest.raises(msgspec.ValidationError, match="pids_max and memory_max_mb must be positive"):
        msgspec.convert(config, SandboxLocalConfig)


@linux_only
@pytest.mark.parametrize("backend", ["bubblewrap", "landlock"])
@pytest.mark.parametrize("mode", ["read-only", "workspace-write"])
def test_an_interpreter_under_tmp_stays_runnable_and_read_only(
    backend: str, mode: str, monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A harness whose Python lives under /tmp (a virtualenv in a checkout there) can still run
    it confined: its prefix is shown read-only inside the private /tmp, and nothing else of the
    host's /tmp is. Control: without the bind the same command is not found."""
    import tempfile

    prefix = Path(tempfile.mkdtemp(prefix="dsh-fake-venv-", dir="/tmp"))
    neighbour = Path(tempfile.mkdtemp(prefix="dsh-neighbour-", dir="/tmp"))
    try:
        tool = prefix / "bin" / "tool"
        tool.parent.mkdir()
        tool.write_text("#!/bin/sh\necho visible\n")
        tool.chmod(0o755)
        (neighbour / "secret").write_text("host /tmp content")
        workspace = tmp_path_factory.mktemp("ws")
        policy = SandboxPolicy(mode=mode, workspace_root=str(workspace))  # type: ignore[arg-type]
        script = f"{tool}; cat {neighbour}/secret; touch {prefix}/written"
        provider = provider_for(backend)

        monkeypatch.setattr(dsh_sandbox_local.profiles, "interpreter_paths", lambda: ())
        hidden = run_confined(provider.confine(["bash", "-c", script], policy))
        assert "visible" not in hidden.stdout  # the control: /tmp is private, the tool is gone

        monkeypatch.undo()
        monkeypatch.setattr(sys, "prefix", str(prefix))
        # (the real venv's exec prefix is listed too when this checkout's venv is under /tmp)
        assert os.path.realpath(prefix) in dsh_sandbox_local.profiles.interpreter_paths()
        shown = run_confined(provider.confine(["bash", "-c", script], policy))
        assert shown.stdout.splitlines()[0] == "visible", shown.stdout + shown.stderr
        assert "host /tmp content" not in shown.stdout  # only the prefix is shown
        assert not (prefix / "written").exists()  # and it is read-only, judged from the host
    finally:
        import shutil as _shutil

        _shutil.rmtree(prefix, ignore_errors=True)
        _shutil.rmtree(neighbour, ignore_errors=True)

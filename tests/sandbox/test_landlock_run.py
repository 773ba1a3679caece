"""The Landlock launcher's CLI contract, run as a real process (D9)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from dsh_sandbox_local.landlock_run import landlock_abi
from dsh_sandbox_local.profiles import default_landlock_launcher

from .sandbox_harness import Scene, linux_only

pytestmark = linux_only

LAUNCHER = list(default_landlock_launcher())


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    # From "/", as the provider starts it: the launcher re-enters its cwd by path after its
    # mounts, and a checkout under /tmp (a fresh CI clone) is not there inside a private /tmp.
    return subprocess.run(
        [*LAUNCHER, *args], capture_output=True, text=True, check=False, timeout=60, env=env,
        stdin=subprocess.DEVNULL, cwd="/",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("args", "line"),
    [
        ((), "landlock-run: usage error: missing `-- <argv>...` command"),
        (("--ro", "/"), "landlock-run: usage error: missing `-- <argv>...` command"),
        (("--ro", "/", "--"), "landlock-run: usage error: missing `-- <argv>...` command"),
        (("--bogus", "--", "true"), "landlock-run: usage error: unknown argument: --bogus"),
        (("--ro",), "landlock-run: usage error: --ro requires a path"),
        (("--rw", "--", "true"), "landlock-run: usage error: --rw requires a path"),
        (("--probe", "--ro", "/"), "landlock-run: usage error: unknown argument: --probe"),
        (("--ro", "/nonexistent-dsh", "--", "true"),
         "landlock-run: cannot open rule path: /nonexistent-dsh: No such file or directory"),
        (("--ro", "/", "--", "/nonexistent-dsh-cmd"),
         "landlock-run: exec failed: No such file or directory"),
        (("--isolate", "--ro", "/", "--", "/nonexistent-dsh-cmd"),
         "landlock-run: exec failed: No such file or directory"),
        (("--ro", "/", "--protect", "/var", "--", "true"),
         "landlock-run: usage error: --protect, --show and --hide need --isolate (a private mount "
         "namespace)"),
        (("--no-landlock", "--ro", "/", "--", "true"),
         "landlock-run: usage error: --no-landlock takes no grants and no --isolate"),
        (("--pids-max", "0", "--isolate", "--ro", "/", "--", "true"),
         "landlock-run: usage error: --pids-max requires a positive integer"),
        (("--pids-max", "5", "--ro", "/", "--", "true"),
         "landlock-run: usage error: --pids-max and --memory-max need --isolate or --relay"),
        (("--relay", "--ro", "/", "--", "true"),
         "landlock-run: usage error: --relay takes no grants and no --isolate"),
    ],
)  # fmt: skip
def test_launcher_failures_exit_125_with_one_line(args: tuple[str, ...], line: str) -> None:
    done = run(*args)
    assert done.returncode == 125
    assert done.stderr == line + "\n"
    assert done.stdout == ""


def test_child_status_passes_through_including_125() -> None:
    for code in (0, 1, 2, 125):
        done = run("--ro", "/", "--", "bash", "-c", f"exit {code}")
        assert done.returncode == code
        assert "landlock-run:" not in done.stderr  # on this ABI >= 5 kernel: no notice


def test_no_capabilities_and_no_new_privs_inside() -> None:
    done = run("--ro", "/", "--", "cat", "/proc/self/status")
    assert done.returncode == 0, done.stderr
    fields = dict(line.split(":", 1) for line in done.stdout.splitlines() if ":" in line)
    assert fields["NoNewPrivs"].strip() == "1"
    for name in ("CapInh", "CapPrm", "CapEff", "CapAmb"):
        assert int(fields[name], 16) == 0, name
    if os.geteuid() == 0:  # root: the bounding set is emptied too
        assert int(fields["CapBnd"], 16) == 0


def test_module_form_runs_the_same_launcher() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "dsh_sandbox_local.landlock_run", "--probe"],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("landlock: ")


def test_environment_cannot_swap_the_launcher_code(tmp_path: Path) -> None:
    """``-I``: a PYTHONPATH with a poisoned ``ctypes`` does not reach the launcher."""
    poison = tmp_path / "ctypes"
    poison.mkdir()
    (poison / "__init__.py").write_text("raise SystemExit('poisoned ctypes imported')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "PYTHONSTARTUP": str(poison / "x.py")}
    done = run("--probe", env=env)
    assert done.returncode == 0, done.stderr
    assert "poisoned" not in done.stderr


def test_grants_on_files_keep_only_file_rights(scene: Scene) -> None:
    """``--rw /dev/null`` (a file) works; a read-only file grant allows reading it only."""
    f = scene.out / "f.txt"
    f.write_text("x")
    done = run("--ro", "/usr", "--ro", "/lib", "--ro", "/lib64", "--ro", "/bin", "--ro", "/etc",
               "--ro", str(f), "--rw", "/dev/null",
               "--", "bash", "-c", f"cat {f} > /dev/null && echo ok")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == "ok\n"


def test_deny_tcp_requires_abi_4() -> None:
    done = run("--ro", "/", "--deny-tcp", "--", "true")
    if landlock_abi() >= 4:
        assert done.returncode == 0, done.stderr
    else:
        assert done.returncode == 125
        assert done.stderr.startswith("landlock-run: landlock ruleset error: TCP denial")


@pytest.mark.parametrize("isolate", [(), ("--isolate",)])
def test_exit_codes_and_signal_deaths_pass_through_the_namespace_init(
    isolate: tuple[str, ...],
) -> None:
    """The command's status crosses the PID-namespace init and the relay unchanged."""
    assert run(*isolate, "--ro", "/", "--", "bash", "-c", "exit 7").returncode == 7
    assert run(*isolate, "--ro", "/", "--", "bash", "-c", "kill -TERM $$").returncode == -15


def test_seccomp_stage_refuses_unix_sockets_and_keyrings_only() -> None:
    code = (
        "import ctypes, socket\n"
        "try:\n    socket.socket(socket.AF_UNIX)\nexcept PermissionError: print('unix refused')\n"
        "a, b = socket.socketpair(); print('stream pair ok')\n"
        "try:\n    socket.socketpair(type=socket.SOCK_DGRAM)\n"
        "except PermissionError: print('dgram pair refused')\n"
        "socket.socket(socket.AF_INET).close(); print('inet ok')\n"
    )
    done = run("--no-landlock", "--deny-unix", "--", sys.executable, "-I", "-c", code)
    assert done.returncode == 0, done
    assert done.stdout.split("\n")[:4] == [
        "unix refused", "stream pair ok", "dgram pair refused", "inet ok",
    ]  # fmt: skip

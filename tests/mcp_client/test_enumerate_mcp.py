"""An MCP server launched through the sandbox holds the same properties as a bash call (issue 43).

The bridge spawns a stdio server through ``confine()``, so the server and every process it starts
run under the same default-deny seccomp filter: the fixture server's ``run`` tool starts the
syscall prober (``tests/sandbox/syscall_prober.c``, built here), lists every process it can see
with its ``Seccomp:`` status, and tries an AF_UNIX socket and io_uring. The control is the same
server under ``danger-full-access``. Judged by the prober's kernel-side listener (a probe is
never executed) and by the host.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from dsh_sandbox_local import landlock_run

from dsh_host import Row

from .mcp_helpers import call, fixture_stdio, mcp_host, text_of

pytestmark = [
    pytest.mark.both_backends,
    pytest.mark.slow,
    pytest.mark.skipif(os.uname().machine != "x86_64", reason="x86_64 syscall table"),
]

PROBER_SOURCE = Path(__file__).parents[1] / "sandbox" / "syscall_prober.c"
PROBED = [n for n in range(512) if n not in (335, 336)]  # the kernel runs those two unfiltered
PYTHON = os.path.realpath(sys.executable)
INSPECT = textwrap.dedent(
    """
    import ctypes, errno, json, os, socket
    seccomp = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/status") as f:
                    seccomp[pid] = next(l.split()[1] for l in f if l.startswith("Seccomp:"))
            except (OSError, StopIteration):
                pass
    try:
        socket.socket(socket.AF_UNIX).close(); unix = "created"
    except OSError as exc:
        unix = errno.errorcode[exc.errno]
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.syscall(425, 8, (ctypes.c_char * 120)())
    uring = "fd" if fd >= 0 else errno.errorcode[ctypes.get_errno()]
    print(json.dumps({"seccomp": seccomp, "unix": unix, "io_uring": uring}))
    """
)


@pytest.fixture(scope="module")
def prober() -> Iterator[str]:
    if shutil.which("gcc") is None:
        pytest.fail("gcc is needed to build the syscall prober")
    directory = Path(tempfile.mkdtemp(prefix="dsh-mcp-prober-", dir="/var/tmp"))
    os.chmod(directory, 0o755)
    binary = directory / "syscall_prober"
    subprocess.run(["gcc", "-O1", "-o", str(binary), str(PROBER_SOURCE), "-lpthread"],
                   check=True, capture_output=True)  # fmt: skip
    yield str(binary)
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def workspace() -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix="dsh-mcp-enum-", dir="/var/tmp"))
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


async def _inspect(prober: str, workspace: Path, backend: str, mode: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    config = fixture_stdio(sandbox=mode, workspace=str(workspace))
    rows = (Row(name="sandbox-local", config={"network": "deny", "backend": backend}),)
    async with mcp_host(config, sandbox=False, extra_rows=rows) as host:
        probes = text_of(await call(host, "mcp__fixture__run",
                                    {"argv": [prober, *map(str, PROBED)]}))  # fmt: skip
        report = text_of(await call(host, "mcp__fixture__run", {"argv": [PYTHON, "-c", INSPECT]},
                                    call_id="call-2"))  # fmt: skip
    lines = probes.splitlines()
    assert len(lines) == len(PROBED), probes[-500:]
    reached = {int(line.split()[0]) for line in lines if line.split()[3] == "1"}
    return len(reached), {"reached": sorted(reached), **json.loads(report.splitlines()[-1])}


@pytest.mark.parametrize("mode", ["read-only", "workspace-write"])
@pytest.mark.parametrize("backend", ["bubblewrap", "landlock"])
async def test_a_confined_mcp_server_runs_under_the_allow_list(
    anyio_backend: str, prober: str, workspace: Path, backend: str, mode: str
) -> None:
    count, report = await _inspect(prober, workspace, backend, mode)
    verdicts, checked = landlock_run.syscall_verdicts("x86_64")
    allowed = {nr for nr, v in verdicts.items() if v == landlock_run.RET_ALLOW}
    # zero arguments: every argument-checked call passes its rule except socket(family 0)
    expected = (allowed | set(checked.values())) - {checked["socket"]}
    assert set(report["reached"]) == expected & set(PROBED)
    assert count < 300
    assert set(report["seccomp"].values()) == {"2"}, report["seccomp"]
    assert report["unix"] == "EACCES"
    assert report["io_uring"] == "EPERM"


async def test_control_an_unconfined_mcp_server_reaches_everything(
    anyio_backend: str, prober: str, workspace: Path
) -> None:
    count, report = await _inspect(prober, workspace, "bubblewrap", "danger-full-access")
    assert count == len(PROBED)
    assert "0" in report["seccomp"].values()
    assert report["unix"] == "created"
    assert report["io_uring"] == "fd"

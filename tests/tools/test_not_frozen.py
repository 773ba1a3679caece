"""The harness cannot be frozen by its input (issue 43, class 6).

* A model-chosen regex (``grep``), glob (``glob``, ``grep``'s ``glob``) or a planted
  ``.gitignore`` line used to run in Python's backtracking ``re``: ``(a+)+$`` on ``aaaa…b`` held
  the GIL for ever, and Ctrl-C / SIGTERM were never handled. Each now completes (or is refused
  with a message the model reads); the control runs the same pattern through ``re`` in a child
  process and shows it does not finish within the same hang guard.
* ripgrep used to run unconfined without a deadline: a FIFO ``.gitignore`` hung it for ever
  (outliving dsh), a ``.gitignore`` link to ``/dev/zero`` ate the host's memory. Now it is
  confined, memory-limited and killed at its deadline, and the walk lists instead; the controls
  run the same rg argv unconfined and watch it hang / grow.
* ``read_file`` scanned a 15 TiB sparse file to its end; now it reads a bounded number of bytes.
* A real ``dsh run`` that is grepping a catastrophic pattern answers SIGTERM (exit 143 or a
  normal end), judged from outside.

No test asserts a duration: the deadlines are hang guards only.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from dsh_builtin_tools import search
from dsh_builtin_tools.files import WorkspaceRoot
from dsh_builtin_tools.search import RG_LIST_ARGS, Ripgrep, list_files, ripgrep_binary
from dsh_sandbox_local import LocalSandboxProvider, SandboxLocalConfig

from dsh_host import CancelToken
from dsh_host._loader import PluginHost
from dsh_host._sandbox import SandboxPolicy
from dsh_host._tools import ToolExecutionResult

from .tools_helpers import Boot, call, text_of

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]

GUARD_S = 60  # hang guard only
CONTROL_GUARD_S = 5  # how long a control is given to show it does not finish
EVIL_REGEX = "(a+)+$"
EVIL_LINE = "a" * 5000 + "b"
#: Exponential for a backtracking engine on a long name of "a"s.
EVIL_GLOB = "*a" * 12 + "*b"
EVIL_NAME = "a" * 40


async def run(host: PluginHost, name: str, arguments: Any) -> ToolExecutionResult:
    with anyio.fail_after(GUARD_S):
        result: ToolExecutionResult = await host.ctx.tools.execute(
            call(name=name, arguments=arguments)
        )
    return result


def backtracks_forever(code: str) -> bool:
    """Control: ``code`` run by Python's ``re`` in a child process does not finish within
    :data:`CONTROL_GUARD_S` (the child is killed then)."""
    try:
        subprocess.run([sys.executable, "-c", code], timeout=CONTROL_GUARD_S, check=True)
    except subprocess.TimeoutExpired:
        return True
    return False


async def test_a_catastrophic_grep_pattern_completes(boot: Boot, ws: Path) -> None:
    (ws / "evil.txt").write_text(EVIL_LINE + "\n" + "aaa\n")
    async with boot() as host:
        result = await run(host, "grep", {"pattern": EVIL_REGEX})
    assert text_of(result) == "evil.txt:2: aaa"
    assert backtracks_forever(f"import re; re.search({EVIL_REGEX!r}, {EVIL_LINE!r})")


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        (r"(a)\1", "invalid escape sequence: \\1"),
        ("(?=a)b", "invalid perl operator: (?="),
        ("(?<!x)a", "invalid perl operator: (?<"),
        ("a{1001}", "invalid repetition size"),
    ],
)
async def test_what_re2_cannot_run_in_linear_time_is_refused_with_a_reason(
    boot: Boot, ws: Path, pattern: str, why: str
) -> None:
    (ws / "a.txt").write_text("aa\n")
    async with boot() as host:
        result = await run(host, "grep", {"pattern": pattern})
    assert result.is_error
    assert result.error is not None and result.error.info is not None
    assert result.error.info.code == "PATTERN_UNSUPPORTED"
    text = text_of(result)
    assert text.startswith(f"Error: invalid pattern: {why}"), text
    assert "RE2 syntax" in text and "backreferences" in text and "lookaround" in text


async def test_a_catastrophic_glob_completes(boot: Boot, ws: Path) -> None:
    (ws / EVIL_NAME).write_text("x\n")
    (ws / "ab").write_text("x\n")
    async with boot() as host:
        globbed = await run(host, "glob", {"pattern": EVIL_GLOB})
        grep_glob = await run(host, "grep", {"pattern": "x", "glob": EVIL_GLOB})
    assert text_of(globbed) == f'No files match "{EVIL_GLOB}".'
    assert text_of(grep_glob) == 'No lines match "x".'
    assert backtracks_forever(
        "import pathspec; "
        f"pathspec.GitIgnoreSpec.from_lines([{EVIL_GLOB!r}], backend='simple')"
        f".match_file({EVIL_NAME!r})"
    )


async def test_a_planted_gitignore_line_cannot_freeze_a_listing(boot: Boot, ws: Path) -> None:
    (ws / ".gitignore").write_text(f"{EVIL_GLOB}\n{'*x' * 3000}\nignored.txt\n")
    (ws / EVIL_NAME).write_text("x\n")
    (ws / "ignored.txt").write_text("x\n")
    async with boot(ripgrep=False) as host:
        listed = await run(host, "glob", {"pattern": "*"})
        tree = await run(host, "list_dir", {})
    assert text_of(listed).splitlines() == [".gitignore", EVIL_NAME]  # the other rules apply
    assert "ignored.txt" not in text_of(tree) and EVIL_NAME in text_of(tree)


# --------------------------------------------------------------------------- ripgrep


def confined(ws: Path, backend: str, deadline_s: float = 20.0) -> Ripgrep:
    binary = ripgrep_binary()
    assert binary is not None, "the test extra installs the ripgrep wheel"
    provider = LocalSandboxProvider(SandboxLocalConfig(backend=backend))  # type: ignore[arg-type]
    policy = SandboxPolicy(mode="read-only", workspace_root=str(ws))
    return Ripgrep(binary, lambda argv: list(provider.confine(argv, policy).argv), deadline_s)


def rg_group_alive(marker: Path, settle_s: float = 10.0) -> list[int]:
    """PIDs of ripgrep processes whose working directory is ``marker``, once those SIGKILLed
    have had up to ``settle_s`` to finish dying (a killed process keeps its cwd while it exits;
    on a loaded machine that took long enough to be seen). A group that was not killed is
    still there after the wait."""
    deadline = time.monotonic() + settle_s
    alive = _rg_processes(marker)
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = _rg_processes(marker)
    return alive


def _rg_processes(marker: Path) -> list[int]:
    alive = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if (
                os.readlink(f"/proc/{entry}/cwd") == str(marker)
                and "rg" in Path(f"/proc/{entry}/comm").read_text()
            ):
                alive.append(int(entry))
        except OSError:
            continue
    return alive


@pytest.mark.parametrize("backend", ["bubblewrap", "landlock"])
def test_a_fifo_gitignore_cannot_hang_the_listing(tmp_path: Path, backend: str) -> None:
    ws = tmp_path / "ws"
    (ws / "d").mkdir(parents=True)
    (ws / "d" / "kept.py").write_text("x\n")
    (ws / "top.py").write_text("x\n")
    os.mkfifo(ws / "d" / ".gitignore")
    root = WorkspaceRoot(str(ws))
    try:
        with pytest.raises(search.HelperFailed, match="deadline"):
            search._ripgrep(confined(ws, backend, deadline_s=2.0), str(ws), ())
        assert rg_group_alive(ws) == []  # the whole group was killed at the deadline
        listed = list_files(root, (), confined(ws, backend, deadline_s=2.0))
    finally:
        root.close()
    assert listed == [("d", "kept.py"), ("top.py",)]  # the walk listed instead
    # control: the same rg argv, unconfined, hangs on the FIFO (and would outlive dsh)
    binary = ripgrep_binary()
    assert binary is not None
    child = subprocess.Popen(
        [binary, *RG_LIST_ARGS, "--", "."], cwd=ws, env={}, stdout=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            child.wait(timeout=CONTROL_GUARD_S)
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()


@pytest.mark.parametrize("backend", ["bubblewrap", "landlock"])
def test_a_cancelled_call_kills_its_hanging_ripgrep(tmp_path: Path, backend: str) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    os.mkfifo(ws / ".gitignore")
    token = CancelToken()
    helper = dataclasses.replace(confined(ws, backend, deadline_s=GUARD_S), token=token)
    timer = threading.Timer(0.5, token.abort)
    timer.start()
    try:
        with pytest.raises(search.HelperFailed, match="cancelled"):
            search._ripgrep(helper, str(ws), ())
    finally:
        timer.cancel()
    assert rg_group_alive(ws) == []


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


@pytest.mark.parametrize("backend", ["bubblewrap", "landlock"])
def test_a_dev_zero_gitignore_cannot_eat_memory(tmp_path: Path, backend: str) -> None:
    ws = tmp_path / "ws"
    (ws / "d").mkdir(parents=True)
    (ws / "d" / "kept.py").write_text("x\n")
    (ws / "d" / ".gitignore").symlink_to("/dev/zero")
    root = WorkspaceRoot(str(ws))
    try:
        with pytest.raises(search.HelperFailed):
            search._ripgrep(confined(ws, backend), str(ws), ())
        listed = list_files(root, (), confined(ws, backend))
    finally:
        root.close()
    assert listed == [("d", "kept.py")]
    # control: unconfined and unlimited, the same argv grows past the helper's limit
    binary = ripgrep_binary()
    assert binary is not None
    child = subprocess.Popen(
        [binary, *RG_LIST_ARGS, "--", "."], cwd=ws, env={}, stdout=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    try:
        grew = False
        for _ in range(300):  # hang guard: 30 s
            if child.poll() is not None:
                break
            if rss_kib(child.pid) * 1024 > search.RG_MEMORY_BYTES:
                grew = True
                break
            time.sleep(0.1)
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    assert grew


# --------------------------------------------------------------------------- read_file


async def test_read_file_of_a_huge_sparse_file_ends(boot: Boot, ws: Path) -> None:
    big = ws / "sparse.log"
    with big.open("wb") as handle:
        handle.write(b"".join(b"line %d\n" % n for n in range(1, 10_001)))
        handle.truncate(15 * 2**40)  # 15 TiB, all but the first ~90 KB a hole
    async with boot(maxScanBytes=8_000_000) as host:
        head = await run(host, "read_file", {"path": "sparse.log", "limit": 3})
        far = await run(host, "read_file", {"path": "sparse.log", "offset": 10**9})
    assert text_of(head) == (
        "<path>sparse.log</path>\n<type>file</type>\n<content>\n"
        "1: line 1\n2: line 2\n3: line 3\n\n"
        "(Showing lines 1-3; the file goes on past the 8000000 bytes read_file reads (10001 "
        "lines so far). Use offset=4 to continue, or bash for the far end of a file this "
        "large.)\n</content>"
    )
    assert far.is_error and "as far as read_file reads; use bash" in text_of(far)


async def test_read_file_of_a_small_file_still_counts_every_line(boot: Boot, ws: Path) -> None:
    (ws / "f.txt").write_text("".join(f"{n}\n" for n in range(1, 101)) + "tail")
    async with boot(maxScanBytes=1000) as host:
        head = await run(host, "read_file", {"path": "f.txt", "limit": 2})
    assert text_of(head).endswith(
        "(Showing lines 1-2 of 101, 99 more lines. Use offset=3 to continue.)\n</content>"
    )


async def test_read_file_refuses_special_files(boot: Boot, ws: Path) -> None:
    os.mkfifo(ws / "pipe")
    async with boot() as host:
        pipe = await run(host, "read_file", {"path": "pipe"})
    assert text_of(pipe) == (
        'Error: "pipe" is not a regular file (a FIFO, socket or device); read_file only reads '
        "regular files"
    )


# --------------------------------------------------------------------------- a real dsh run


REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_sigterm_reaches_a_dsh_run_that_is_grepping_a_catastrophic_pattern(
    tmp_path: Path,
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    for n in range(200):
        (ws / f"f{n}.txt").write_text((EVIL_LINE + "\n") * 200)
    started = tmp_path / "started"
    responses = [
        {"tool_calls": [{"name": "bash", "id": "c1", "arguments": {
            "command": f"touch {started}", "description": "mark the start"}}]},
        {"tool_calls": [{"name": "grep", "id": "c2", "arguments": {"pattern": EVIL_REGEX}}]},
        {"text": "done"},
    ]  # fmt: skip
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": responses}))
    config = tmp_path / "composition.yml"
    config.write_text(
        (REPO / "configs" / "default.yml")
        .read_text()
        .replace("    sandbox: workspace-write\n", "    sandbox: danger-full-access\n")
    )
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    env = {**os.environ, "DSH_INTERRUPT_GRACE_S": "30"}
    env.pop("DSH_SESSION_ROOT", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "dsh_host", "run", "go", "--model", f"scripted:{script}",
         "--session", "frozen-1", "--new", "--workspace", str(ws), "--root", str(tmp_path / "sessions"),
         "--config", str(config)],
        cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        for _ in range(600):  # hang guard: 60 s
            if started.exists() or proc.poll() is not None:
                break
            time.sleep(0.1)
        assert started.exists(), proc.communicate(timeout=GUARD_S)
        time.sleep(0.2)  # the grep step follows at once
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=GUARD_S)  # the hang guard: frozen means timeout
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode in (0, 143), (proc.returncode, out, err)
    assert "Traceback" not in err

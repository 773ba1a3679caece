"""Injected I/O failures: write and fsync errors roll back, fsync errors poison the handle.

The failures are injected by wrapping ``os.fsync`` / ``os.write`` /
``os.ftruncate`` / ``os.link`` (the backend looks them up at call time); the
files, locks and reads are real. Assertions are on what is on disk.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from dsh_session_persistence_jsonl import JsonlSessionPersistence

from dsh_host._persistence import write_behind
from dsh_host._persistence.persistence import (
    SessionHandlePoisonedError,
    SessionPersistenceCorruptionError,
    SessionRollbackError,
    SessionWriteError,
)
from dsh_host._session.events import event_to_builtins

from .helpers import header, log, plain

pytestmark = pytest.mark.anyio


def wire(events: Any) -> list[Any]:
    return [plain(event_to_builtins(e)) for e in events]


class Fault:
    """Makes ``os.<name>`` fail with ``errno`` while armed (for ``times`` calls, or forever)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, name: str, code: int) -> None:
        self.real: Callable[..., Any] = getattr(os, name)
        self.armed = False
        self.times: int | None = None
        self.calls = 0
        self.code = code

        def wrapper(*args: Any) -> Any:
            if self.armed and (self.times is None or self.times > 0):
                self.calls += 1
                if self.times is not None:
                    self.times -= 1
                raise OSError(self.code, f"injected {name} failure")
            return self.real(*args)

        monkeypatch.setattr(os, name, wrapper)

    def arm(self, times: int | None = None) -> None:
        self.armed, self.times = True, times

    def disarm(self) -> None:
        self.armed = False


@pytest.fixture
def events() -> list[dict[str, Any]]:
    return log(3, tools=1)


def _path(backend: JsonlSessionPersistence, sid: str) -> Path:
    return Path(backend.locate(header(sid)).path)


async def _first_batch_durable(
    backend: JsonlSessionPersistence, sid: str, events: list[dict[str, Any]]
) -> tuple[Any, Path, bytes]:
    """A new session's write handle with its first eight events durable; its log and bytes."""
    handle = await backend.create(header(sid))
    handle.append(events[:8])
    await handle.flush()
    path = _path(backend, sid)
    return handle, path, path.read_bytes()


@pytest.mark.parametrize("compression", ["zstd", "none"])
async def test_fsync_failure_rolls_back_and_poisons(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, events: list[dict[str, Any]], compression: str
) -> None:
    fsync = Fault(monkeypatch, "fsync", errno.EIO)
    backend = JsonlSessionPersistence(str(tmp_path), compression)  # type: ignore[arg-type]
    handle, path, durable = await _first_batch_durable(backend, "fs", events)
    handle.append(events[8:16])
    fsync.arm(times=1)  # the batch's fsync fails; the rollback's own fsync succeeds
    with pytest.raises(SessionWriteError, match="injected fsync failure") as failed:
        await handle.flush()
    fsync.disarm()
    # Exactly the rolled-back write error (a SessionRollbackError would say the cut failed),
    # caused by the injected fsync failure itself.
    assert type(failed.value) is SessionWriteError
    assert failed.value.code == "SESSION_WRITE_FAILED"
    assert fsync.calls == 1
    assert_caused_by_injected(failed.value, errno.EIO, "injected fsync failure")
    assert path.read_bytes() == durable, "the failed batch is cut back off the file"
    # PostgreSQL's lesson: after a failed fsync nothing about the page cache can be trusted.
    with pytest.raises(SessionHandlePoisonedError, match="reopen the session"):
        handle.append(events[16:17])
    with pytest.raises(SessionHandlePoisonedError):
        await handle.flush()
    await handle.close()  # releases the lock even though the final drain cannot run
    reopened = JsonlSessionPersistence(str(tmp_path), compression)  # type: ignore[arg-type]
    writer = await reopened.open("fs", "write")
    assert wire((await writer.read()).events) == plain(events[:8])
    writer.append(events[8:])
    await writer.close()
    final = await (await reopened.open("fs", "read")).read()
    assert wire(final.events) == plain(events)


@pytest.mark.parametrize("compression", ["zstd", "none"])
async def test_write_failure_rolls_back_and_the_retry_has_no_gap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, events: list[dict[str, Any]], compression: str
) -> None:
    write = Fault(monkeypatch, "write", errno.ENOSPC)
    backend = JsonlSessionPersistence(str(tmp_path), compression)  # type: ignore[arg-type]
    handle, path, durable = await _first_batch_durable(backend, "ws", events)
    handle.append(events[8:])
    write.arm(times=1)
    with pytest.raises(SessionWriteError, match="injected write failure"):
        await handle.flush()
    assert path.read_bytes() == durable  # byte-identical prefix, nothing half-written
    assert handle.durable_seq == 8
    await handle.flush()  # not poisoned: a write error is retried with the same batch
    assert handle.durable_seq == len(events)
    await handle.close()
    load = await (await backend.open("ws", "read")).read()
    assert wire(load.events) == plain(events)
    assert path.read_bytes()[: len(durable)] == durable


@pytest.mark.parametrize("compression", ["zstd", "none"])
@pytest.mark.parametrize("change", ["appended", "truncated"])
async def test_a_log_changed_under_the_handle_is_refused_and_left_as_found(
    tmp_path: Path, events: list[dict[str, Any]], compression: str, change: str
) -> None:
    """Another writer's bytes (or a cut) between two barriers: the next barrier sees a length
    other than the one it wrote, refuses, and writes nothing over or after what it found."""
    backend = JsonlSessionPersistence(str(tmp_path), compression)  # type: ignore[arg-type]
    handle, path, durable = await _first_batch_durable(backend, "fw", events)
    with path.open("r+b") as log_file:
        if change == "appended":
            log_file.seek(0, os.SEEK_END)
            log_file.write(b'{"another":"writer"}\n')
        else:
            log_file.truncate(len(durable) - 1)
    found = path.read_bytes()
    handle.append(events[8:])
    with pytest.raises(
        SessionPersistenceCorruptionError,
        match=f"is {len(found)} bytes but this handle wrote {len(durable)}; another writer",
    ) as refused:
        await handle.flush()
    assert refused.value.offset == len(durable)
    assert path.read_bytes() == found
    with pytest.raises(SessionPersistenceCorruptionError):
        await handle.close()  # the final drain refuses too; the lock is released all the same
    assert path.read_bytes() == found
    assert await backend.held_by("fw") is None


@pytest.mark.parametrize("compression", ["zstd", "none"])
async def test_fsync_failing_in_the_rollback_too_is_a_rollback_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, events: list[dict[str, Any]], compression: str
) -> None:
    """When the cut-back cannot be synced either, the error must not claim it rolled back."""
    fsync = Fault(monkeypatch, "fsync", errno.EIO)
    backend = JsonlSessionPersistence(str(tmp_path), compression)  # type: ignore[arg-type]
    handle = await backend.create(header("fr"))
    handle.append(events[:8])
    await handle.flush()
    handle.append(events[8:16])
    fsync.arm()
    with pytest.raises(SessionRollbackError, match="injected fsync failure") as failed:
        await handle.flush()
    fsync.disarm()
    assert failed.value.code == "SESSION_ROLLBACK_FAILED"
    append_error, rollback_error = failed.value.errors
    for error in (append_error, rollback_error):
        assert isinstance(error, OSError) and error.errno == errno.EIO
    with pytest.raises(SessionHandlePoisonedError):
        handle.append(events[16:17])
    await handle.close()


def assert_caused_by_injected(error: BaseException, code: int, text: str) -> None:
    """``error``'s cause is an OSError carrying the injected errno and text (not another one)."""
    cause = error.__cause__
    assert isinstance(cause, OSError), repr(cause)
    assert cause.errno == code and text in str(cause), repr(cause)


async def test_rollback_failure_keeps_both_errors_and_poisons(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, events: list[dict[str, Any]]
) -> None:
    write = Fault(monkeypatch, "write", errno.EIO)
    truncate = Fault(monkeypatch, "ftruncate", errno.EROFS)
    backend = JsonlSessionPersistence(str(tmp_path))
    handle = await backend.create(header("rb"))
    handle.append(events[:4])
    await handle.flush()
    handle.append(events[4:])
    write.arm(times=1)
    truncate.arm()
    with pytest.raises(SessionRollbackError, match="failed to roll back append to") as failed:
        await handle.flush()
    append_error, rollback_error = failed.value.errors
    assert "write" in str(append_error) and "ftruncate" in str(rollback_error)
    truncate.disarm()
    with pytest.raises(SessionHandlePoisonedError):
        await handle.flush()
    await handle.close()


async def test_failed_publication_leaves_nothing_and_can_be_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, events: list[dict[str, Any]]
) -> None:
    link = Fault(monkeypatch, "link", errno.EIO)
    backend = JsonlSessionPersistence(str(tmp_path))
    handle = await backend.create(header("pub"))
    handle.append(events)
    link.arm(times=1)
    with pytest.raises(SessionWriteError, match="failed to publish"):
        await handle.flush()
    session_dir = _path(backend, "pub").parent
    assert sorted(os.listdir(session_dir)) == ["session.lock"], "no log, no temp file"
    await handle.flush()
    await handle.close()
    assert wire((await (await backend.open("pub", "read")).read()).events) == plain(events)


async def test_fsync_failure_while_cutting_a_torn_tail_poisons(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, events: list[dict[str, Any]]
) -> None:
    backend = JsonlSessionPersistence(str(tmp_path))
    handle = await backend.create(header("tt"))
    handle.append(events)
    await handle.close()
    path = _path(backend, "tt")
    path.write_bytes(path.read_bytes()[:-3])  # a torn checksum
    fsync = Fault(monkeypatch, "fsync", errno.EIO)
    writer = await backend.open("tt", "write")
    fsync.arm()
    with pytest.raises(SessionWriteError, match="torn tail"):
        await writer.flush()
    fsync.disarm()
    with pytest.raises(SessionHandlePoisonedError):
        await writer.flush()
    await writer.close()


# --------------------------------------------------------------------------- the 200 ms window


class Window:
    """Replaces the window's sleep: counts the sleeps; the test decides when windows expire.

    ``release`` expires every window armed until now (a deadline is at most one window
    from now), as if that much time had passed: a sleeper that wakes to find a later
    window armed meanwhile (the controller reuses one sleeper) sleeps on it and finds it
    expired too.
    """

    def __init__(self) -> None:
        self.armed = 0
        self.passed = float("-inf")
        self.expire = anyio.Event()

    async def sleep(self, deadline: float) -> None:
        self.armed += 1
        while deadline > self.passed:
            await self.expire.wait()

    def release(self) -> None:
        self.passed = anyio.current_time() + write_behind.WINDOW_SECONDS
        self.expire.set()
        self.expire = anyio.Event()


@pytest.fixture
def window(monkeypatch: pytest.MonkeyPatch) -> Iterator[Window]:
    fake = Window()
    monkeypatch.setattr(write_behind, "window_sleep_until", fake.sleep)
    yield fake


async def _until(condition: Callable[[], bool]) -> None:
    """Wait for background work to reach an observable state (bounded; not a timing assert)."""
    with anyio.fail_after(10):
        while not condition():  # noqa: ASYNC110 - polls state owned by other tasks
            await anyio.sleep(0.001)


async def test_first_buffered_event_arms_one_window_and_later_ones_join_it(
    tmp_path: Path, window: Window, events: list[dict[str, Any]]
) -> None:
    from dsh_session_persistence_jsonl._frames import scan_frames

    async with anyio.create_task_group() as tg:
        backend = JsonlSessionPersistence(str(tmp_path), spawn=tg.start_soon)
        handle = await backend.create(header("win"))
        handle.append(events[:1])
        await _until(lambda: window.armed == 1)
        for event in events[1:10]:
            handle.append([event])  # joins the armed window; does not extend it
        await anyio.lowlevel.checkpoint()
        assert window.armed == 1
        window.release()
        await _until(lambda: handle.durable_seq == 10)
        path = _path(backend, "win")
        assert len(scan_frames(path.read_bytes()).frames) == 2  # header + ONE batch frame
        handle.append(events[10:12])  # an idle handle: a fresh window
        await _until(lambda: window.armed == 2)
        await handle.flush()  # the barrier drains at once and cancels the window
        assert handle.durable_seq == 12
        assert len(scan_frames(path.read_bytes()).frames) == 3
        window.release()
        await anyio.lowlevel.checkpoint()
        assert handle.durable_seq == 12
        await handle.close()
        tg.cancel_scope.cancel()


async def test_background_failure_is_reported_once_and_retained(
    tmp_path: Path,
    window: Window,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    events: list[dict[str, Any]],
) -> None:
    write = Fault(monkeypatch, "write", errno.ENOSPC)
    async with anyio.create_task_group() as tg:
        backend = JsonlSessionPersistence(str(tmp_path), spawn=tg.start_soon)
        handle = await backend.create(header("bg"))
        handle.append(events[:2])
        await handle.flush()
        batcher = handle.write_behind
        with caplog.at_level(logging.WARNING):
            write.arm()
            handle.append(events[2:4])
            assert batcher.window_armed
            window.release()
            await _until(lambda: "background write" in caplog.text)
            handle.append(events[4:5])  # the next event restarts the window...
            assert batcher.window_armed
            window.release()
            # The second failure pauses the window again; by then it has decided not to log.
            await _until(lambda: write.calls >= 2 and handle.write_behind.paused)
            assert caplog.text.count("background write") == 1  # ...but reports only once
        assert 'session "bg" failed (buffered events retained)' in caplog.text
        assert handle.durable_seq == 2
        write.disarm()
        await handle.flush()  # the retained batch and the new event go out together
        assert handle.durable_seq == 5
        await handle.close()
        tg.cancel_scope.cancel()
    load = await (await backend.open("bg", "read")).read()
    assert wire(load.events) == plain(events[:5])


# --------------------------------------------------------------------------- concurrent closes


async def test_a_second_close_waits_for_the_first_instead_of_releasing_under_its_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, events: list[dict[str, Any]]
) -> None:
    """Regression: ``close`` from a session's release and from ``aclose`` ran concurrently;
    the second found nothing buffered (the first had taken the batch), closed the log and
    released the lock while the first was writing, and that batch was lost. Here the first
    close is held inside ``os.write`` on its worker thread while the second one runs (an
    inline barrier holds the event loop itself, so only the worker-thread path can interleave:
    ``inline_barrier=0``)."""
    real_write = os.write
    entered, gate = threading.Event(), threading.Event()

    def held_write(fd: int, data: Any) -> int:
        if not gate.is_set():
            entered.set()
            gate.wait(10)
        return real_write(fd, data)

    backend = JsonlSessionPersistence(str(tmp_path), inline_barrier=0)
    handle = await backend.create(header("closes"))
    handle.append(events[:3])
    await handle.flush()
    handle.append(events[3:])
    monkeypatch.setattr(os, "write", held_write)
    outcomes: list[str] = []

    async def close(name: str) -> None:
        await handle.close()
        outcomes.append(name)

    async with anyio.create_task_group() as tg:
        tg.start_soon(close, "first")
        await anyio.to_thread.run_sync(entered.wait, 10)  # the first close is mid-write
        tg.start_soon(close, "second")
        await anyio.wait_all_tasks_blocked()
        assert outcomes == []  # the second close waits; it did not release under the write
        gate.set()
    assert outcomes == ["first", "second"]
    monkeypatch.setattr(os, "write", real_write)
    load = await (await backend.open("closes", "read")).read()
    assert wire(load.events) == plain(events)


async def test_a_small_batch_is_framed_on_the_event_loop_a_large_one_on_the_lane(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every barrier hops here (inline budget 0): a batch of up to FRAME_ON_LOOP_MAX bytes is
    compressed on the event loop and only written and synced on the writer thread; a larger
    one is compressed on the writer too, so its zstd time does not hold the loop."""
    from dsh_session_persistence_jsonl import _backend
    from dsh_session_persistence_jsonl._frames import compress_frame as real

    framed_on: list[tuple[int, int]] = []  # (bytes of lines, thread ident)

    def compress(plaintext: bytes) -> bytes:
        framed_on.append((len(plaintext), threading.get_ident()))
        return real(plaintext)

    monkeypatch.setattr(_backend, "compress_frame", compress)
    backend = JsonlSessionPersistence(str(tmp_path), inline_barrier=0)
    events = log(400, tools=1)
    handle = await backend.create(header("big"))
    for part in (events[:8], events[8:16], events[16:]):  # publish, then two appends
        handle.append(part)
        await handle.flush()
    await handle.close()
    loop = threading.get_ident()
    *_, (small, small_thread), (large, large_thread) = framed_on
    assert small <= _backend.FRAME_ON_LOOP_MAX < large
    assert small_thread == loop and large_thread != loop
    stored = await (await backend.open("big", "read")).read()
    assert wire(stored.events) == plain(events)

"""Power-cut holes (issue 14 item 5): zero-filled tails, directory fsyncs, fsync errors.

* D17: zero bytes from a frame boundary (or from inside a partly written last
  frame) to the end of the file are a torn tail — recovered, cut by the next
  write — while damage followed by an intact frame is still refused;
* opening a stored session for writing fsyncs its directory chain;
* creating a session fsyncs the parent of every directory of its chain, even
  of directories that already exist;
* a failing directory fsync is the typed ``SessionWriteError``, not a raw OSError.

Directory fsyncs are observed by wrapping ``os.fsync`` in-process and naming
each descriptor through ``/proc/self/fd``; the files and fsyncs are real.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dsh_session_persistence_jsonl import JsonlSessionPersistence
from dsh_session_persistence_jsonl._frames import scan_frames

from dsh_host._persistence.persistence import (
    SessionPersistenceCorruptionError,
    SessionWriteError,
)
from dsh_host._session.events import event_to_builtins

from .helpers import ev, header, log, plain

pytestmark = pytest.mark.anyio

SID = "power-cut"


def wire(events: Any) -> list[Any]:
    return [plain(event_to_builtins(e)) for e in events]


def _backend(root: Path, compression: str) -> JsonlSessionPersistence:
    return JsonlSessionPersistence(str(root), compression)  # type: ignore[arg-type]


async def _write(root: Path, compression: str, batches: list[list[dict[str, Any]]]) -> Path:
    backend = _backend(root, compression)
    handle = await backend.create(header(SID))
    for batch in batches:
        handle.append(batch)
        await handle.flush()
    await handle.close()
    return Path(backend.locate(header(SID)).path)


async def _read(root: Path, compression: str) -> tuple[list[Any], Any]:
    load = await (await _backend(root, compression).open(SID, "read")).read()
    return wire(load.events), load.torn_tail


EVENTS = log(2, tools=1)
BATCHES = [EVENTS[:6], EVENTS[6:9], EVENTS[9:]]


def _put(path: str, data: bytes) -> None:
    with open(path, "wb") as handle:
        handle.write(data)


def _next_event() -> dict[str, Any]:
    return ev("turn/start", len(EVENTS), {"turn": 3})


async def _append_one_and_reread(root: Path, compression: str) -> tuple[list[Any], Any]:
    handle = await _backend(root, compression).open(SID, "write")
    handle.append([_next_event()])
    await handle.flush()
    await handle.close()
    return await _read(root, compression)


# --------------------------------------------------------------------------- D17 zero tails


@pytest.mark.parametrize("compression", ["zstd", "none"])
@pytest.mark.parametrize("zeros", [1, 2, 3, 4, 5, 17, 512, 4096 + 7])
async def test_zeros_after_the_last_frame_are_a_torn_tail(
    tmp_path: Path, compression: str, zeros: int
) -> None:
    path = await _write(tmp_path, compression, BATCHES)
    good = path.read_bytes()
    path.write_bytes(good + b"\x00" * zeros)
    events, torn = await _read(tmp_path, compression)
    assert events == plain(EVENTS)
    assert torn is not None and torn.truncate_to == len(good) and torn.recovered == 0
    after, torn_after = await _append_one_and_reread(tmp_path, compression)
    assert after == plain([*EVENTS, _next_event()])
    assert torn_after is None
    data = path.read_bytes()
    assert data.startswith(good) and b"\x00\x00\x00\x00" not in data[len(good) :]


async def test_a_partly_written_last_frame_then_zeros_is_torn_at_every_cut(
    tmp_path: Path,
) -> None:
    """The last frame keeps its first ``k`` bytes, the rest of the file is zeros (the file
    length reached disk, some of its pages did not): torn at the frame's start, never refused,
    for every ``k`` and whether the zeros stop at the frame's end or run past it."""
    source = tmp_path / "source"
    path = await _write(source, "zstd", BATCHES)
    good = path.read_bytes()
    start, end = scan_frames(good).frames[-1]
    frame = good[start:end]
    prefix_events = plain(EVENTS[:9])
    for extra in (0, 9):
        for k in range(len(frame)):
            zeros = len(frame) - k + extra
            root = tmp_path / f"cut-{extra}-{k}"
            shutil.copytree(source, root)
            _put(
                _backend(root, "zstd").locate(header(SID)).path,
                good[:start] + frame[:k] + zeros * b"\0",
            )
            events, torn = await _read(root, "zstd")
            assert torn is not None and torn.truncate_to == start, (extra, k)
            assert events[: len(prefix_events)] == prefix_events, (extra, k)
            assert events == plain(EVENTS[: len(events)]), (extra, k)


async def test_a_last_frame_whose_final_bytes_are_zero_is_torn(tmp_path: Path) -> None:
    """1–3 zero bytes ending a complete frame that fails its checksum: the end of the append
    never reached the disk. Nothing follows, so it is a torn tail (issue 42), where DSH
    refuses; a flipped byte in that frame reads the same way (docs/format.md §5.1)."""
    path = await _write(tmp_path, "zstd", BATCHES)
    good = path.read_bytes()
    start, _end = scan_frames(good).frames[-1]
    for tail in (b"\x00", b"\x00\x00", b"\x00\x00\x00"):
        if good.endswith(tail):
            continue
        path.write_bytes(good[: -len(tail)] + tail)
        events, torn = await _read(tmp_path, "zstd")
        assert events == plain(EVENTS[:9])
        assert torn is not None and torn.truncate_to == start


async def test_raw_partial_line_then_zeros_is_torn(tmp_path: Path) -> None:
    path = await _write(tmp_path, "none", BATCHES)
    good = path.read_bytes()
    last_line_start = good.rstrip(b"\n").rfind(b"\n") + 1
    line = good[last_line_start:]
    for k in range(len(line)):
        path.write_bytes(good[:last_line_start] + line[:k] + b"\x00" * (len(line) - k + 3))
        events, torn = await _read(tmp_path, "none")
        assert events == plain(EVENTS[:-1]), k
        assert torn is not None and torn.truncate_to == last_line_start, k


@pytest.mark.parametrize("zeros", [4, 100])
async def test_zeros_followed_by_an_intact_frame_are_refused(tmp_path: Path, zeros: int) -> None:
    path = await _write(tmp_path, "zstd", BATCHES)
    good = path.read_bytes()
    start, end = scan_frames(good).frames[-1]
    path.write_bytes(good[:start] + b"\x00" * zeros + good[start:end])
    with pytest.raises(SessionPersistenceCorruptionError, match="invalid frame magic"):
        await _read(tmp_path, "zstd")


async def test_raw_damage_followed_by_a_turn_end_is_refused_unless_it_holds_a_nul(
    tmp_path: Path,
) -> None:
    """DSH's raw rule: a bad line followed by a ``turn/end`` is committed damage. A NUL byte
    in the bad line is a hole no writer writes (JSON escapes it), so everything from it on
    was written after the last fsync: a torn tail, whatever follows (issue 42)."""
    path = await _write(tmp_path, "none", BATCHES)
    good = path.read_bytes()
    last_line_start = good.rstrip(b"\n").rfind(b"\n") + 1
    assert b'"turn/end"' in good[last_line_start:]
    path.write_bytes(good[:last_line_start] + b"\xff" * 8 + b"\n" + good[last_line_start:])
    with pytest.raises(SessionPersistenceCorruptionError, match="unparsable"):
        await _read(tmp_path, "none")
    path.write_bytes(good[:last_line_start] + b"\x00" * 8 + b"\n" + good[last_line_start:])
    events, torn = await _read(tmp_path, "none")
    assert events == plain(EVENTS[:-1])
    assert torn is not None and torn.truncate_to == last_line_start


# --------------------------------------------------------------------------- directory fsyncs


class FsyncLog:
    """Records the path of every descriptor ``os.fsync`` is called on (in this process)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.paths: list[str] = []
        self.fail_dirs = False
        real = os.fsync

        def fsync(fd: int) -> None:
            path = os.readlink(f"/proc/self/fd/{fd}")
            self.paths.append(path)
            if self.fail_dirs and os.path.isdir(path):
                raise OSError(errno.EIO, "injected directory fsync failure")
            real(fd)

        monkeypatch.setattr(os, "fsync", fsync)

    def dirs(self) -> list[str]:
        return [p for p in self.paths if os.path.isdir(p)]


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> Iterator[FsyncLog]:
    yield FsyncLog(monkeypatch)


def _chain(root: Path) -> tuple[str, str, str]:
    session_dir = Path(_backend(root, "zstd").storage.session_dir("/home/dev/project", SID))
    return str(session_dir), str(session_dir.parent), str(root)


async def test_opening_a_stored_session_for_writing_fsyncs_its_directory_chain(
    tmp_path: Path, fsyncs: FsyncLog
) -> None:
    root = tmp_path / "deep" / "root"
    await _write(root, "zstd", BATCHES[:1])
    fsyncs.paths.clear()
    handle = await _backend(root, "zstd").open(SID, "write")
    try:
        session_dir, project, root_dir = _chain(root)
        synced = fsyncs.dirs()
        for directory in (session_dir, project, root_dir, str(root.parent), str(tmp_path), "/"):
            assert directory in synced, (directory, synced)
    finally:
        await handle.close()


async def test_creating_under_existing_directories_still_fsyncs_their_parents(
    tmp_path: Path, fsyncs: FsyncLog
) -> None:
    """A crashed creator may have made the directories and never synced them."""
    root = tmp_path / "root"
    session_dir, project, root_dir = _chain(root)
    os.makedirs(session_dir)
    fsyncs.paths.clear()
    await _write(root, "zstd", BATCHES[:1])
    synced = fsyncs.dirs()
    for directory in (str(tmp_path), root_dir, project, session_dir):
        assert directory in synced, (directory, synced)


@pytest.mark.parametrize("existing", [False, True])
async def test_a_failing_directory_fsync_at_first_save_is_a_typed_write_error(
    tmp_path: Path, fsyncs: FsyncLog, existing: bool
) -> None:
    root = tmp_path / "root"
    if existing:
        os.makedirs(_chain(root)[0])
    handle = await _backend(root, "zstd").create(header(SID))
    handle.append(BATCHES[0])
    fsyncs.fail_dirs = True
    with pytest.raises(SessionWriteError, match="injected directory fsync failure") as failed:
        await handle.flush()
    # Exactly the write error (nothing was appended, so nothing to roll back), caused by the
    # injected directory fsync failure itself.
    assert type(failed.value) is SessionWriteError
    assert failed.value.code == "SESSION_WRITE_FAILED"
    cause = failed.value.__cause__
    assert isinstance(cause, OSError) and cause.errno == errno.EIO, repr(cause)
    assert "injected directory fsync failure" in str(cause)
    fsyncs.fail_dirs = False
    await handle.flush()  # nothing was published: the retry publishes the batch
    await handle.close()
    events, torn = await _read(root, "zstd")
    assert events == plain(BATCHES[0]) and torn is None


async def test_a_failing_directory_fsync_at_write_open_is_a_typed_error_and_frees_the_lock(
    tmp_path: Path, fsyncs: FsyncLog
) -> None:
    await _write(tmp_path, "zstd", BATCHES[:1])
    fsyncs.fail_dirs = True
    with pytest.raises(SessionWriteError, match="injected directory fsync failure"):
        await _backend(tmp_path, "zstd").open(SID, "write")
    fsyncs.fail_dirs = False
    handle = await _backend(tmp_path, "zstd").open(SID, "write")  # the lock was released
    await handle.close()

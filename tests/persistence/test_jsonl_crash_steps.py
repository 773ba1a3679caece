"""SIGKILL at every numbered step of the write protocol (docs/format.md §4).

A child process writes through the JSONL backend and kills itself (SIGKILL,
no cleanup, no atexit) at the named step; the test ids are the step numbers.
The parent then checks what is on disk, what a read returns, that a read
changed nothing, and that a write handle's repair leaves a log that rescans
clean with the same events. Only process crashes are simulated here (the page
cache survives); torn bytes are produced by the child writing half a frame.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from dsh_session_persistence_jsonl import JsonlSessionPersistence
from dsh_session_persistence_jsonl._frames import scan_frames

from dsh_host._persistence.persistence import SessionNotFoundError
from dsh_host._session.events import event_to_builtins

from .helpers import header, log, plain
from .test_jsonl_migration import expected_v3, v0_events, write_v0

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.slow,
    pytest.mark.parametrize("anyio_backend", ["trio"]),  # the child is the subject, not the loop
]

CHILD = Path(__file__).with_name("child.py")
EVENTS = plain(log(2))
FIRST, SECOND = EVENTS[:6], EVENTS[6:]


def wire(events: Any) -> list[Any]:
    return [plain(event_to_builtins(e)) for e in events]


def run_child(root: Path, compression: str, step: str, sid: str, version: int = 3) -> str:
    """Run the child to its death at ``step``; a new session it creates is a ``version`` log."""
    source = (
        "from dsh_session_persistence_jsonl import JsonlSessionPersistence\n"
        "def make_backend(spawn):\n"
        f"    return JsonlSessionPersistence({str(root)!r}, {compression!r}, spawn=spawn,\n"
        f"        write_version={version})\n"
    )
    proc = subprocess.run(
        [sys.executable, str(CHILD), "step", sid, step],
        env=dict(os.environ, DSH_TEST_BACKEND=source),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -9, f"the child did not die at {step}: {proc.stdout} {proc.stderr}"
    return proc.stdout


def tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


async def read(root: Path, compression: str, sid: str) -> tuple[list[Any] | None, Any]:
    backend = JsonlSessionPersistence(str(root), compression)  # type: ignore[arg-type]
    try:
        load = await (await backend.open(sid, "read")).read()
    except SessionNotFoundError:
        return None, None
    return wire(load.events), load.torn_tail


async def repair(root: Path, compression: str, sid: str) -> list[Any]:
    backend = JsonlSessionPersistence(str(root), compression)  # type: ignore[arg-type]
    handle = await backend.open(sid, "write")
    await handle.flush()
    await handle.close()
    events, torn = await read(root, compression, sid)
    assert torn is None and events is not None
    if compression == "zstd":
        data = await anyio.Path(backend.locate(header(sid)).path).read_bytes()
        assert scan_frames(data).torn_start is None
    return events


#: step -> (events a read returns after the crash, whether the read sees a torn tail)
PUBLICATION = {
    "P4": (None, False),  # dies writing the temp: nothing published
    "P5": (None, False),  # dies before the temp's fsync: nothing published
    "P6-before": (None, False),  # dies before link: nothing published
    "P6-after": (FIRST, False),  # link is the commit point of publication
    "P8": (FIRST, False),  # the temp is left behind; readers ignore *.tmp
}
LATER = {
    "W3": ("prefix", True),  # half a frame (raw: half the lines): a torn tail
    "W4-before": (EVENTS, False),  # whole frame written, fsync never ran (process crash)
    "W4-after": (EVENTS, False),  # fsync returned: the commit point of the batch
}


@pytest.mark.parametrize("version", [3, 4])
@pytest.mark.parametrize("compression", ["zstd", "none"])
@pytest.mark.parametrize("step", [*PUBLICATION, *LATER])
async def test_crash_while_writing(
    tmp_path: Path, step: str, compression: str, version: int
) -> None:
    """Every step, on a v3 and on a DSH 0.2 v4 log (the same protocol, v4 rows)."""
    expected, expected_torn = {**PUBLICATION, **LATER}[step]
    run_child(tmp_path, compression, step, "s", version)
    logs = [name for name in tree(tmp_path) if ".tmp" not in name and ".jsonl" in name]
    assert all(f"/session.v{version}." in name for name in logs), logs
    before = tree(tmp_path)
    events, torn = await read(tmp_path, compression, "s")
    assert tree(tmp_path) == before, "a read never changes a byte"
    if expected == "prefix":
        # zstd: the half frame's one block is incomplete, nothing decodes; raw: the lines
        # that are complete survive. Either way a prefix, never less than the last flush.
        assert events is not None and len(FIRST) <= len(events) < len(EVENTS)
        assert events == EVENTS[: len(events)]
        assert compression == "none" or events == FIRST
        expected = events
    assert events == expected
    assert (torn is not None) == expected_torn
    if expected is None:
        # Nothing was published: the id is free again, whatever temp the crash left.
        backend = JsonlSessionPersistence(
            str(tmp_path),
            compression,  # type: ignore[arg-type]
            write_version=version,
        )
        handle = await backend.create(header("s"))
        handle.append(FIRST)
        await handle.close()
        assert (await read(tmp_path, compression, "s"))[0] == FIRST
    else:
        assert await repair(tmp_path, compression, "s") == expected


@pytest.mark.parametrize("version", [3, 4])
@pytest.mark.parametrize("step", ["R1", "R2"])
async def test_crash_while_repairing_a_torn_tail(tmp_path: Path, step: str, version: int) -> None:
    backend = JsonlSessionPersistence(str(tmp_path), write_version=version)
    handle = await backend.create(header("s"))
    handle.append(FIRST)
    await handle.flush()
    handle.append(SECOND)
    await handle.close()
    path = anyio.Path(backend.locate(header("s")).path)
    await path.write_bytes((await path.read_bytes())[:-3])  # cut inside the last checksum
    events, torn = await read(tmp_path, "zstd", "s")
    assert events == EVENTS and torn is not None and torn.recovered == len(SECOND)
    run_child(tmp_path, "zstd", step, "s")
    events, torn = await read(tmp_path, "zstd", "s")
    if step == "R1":
        # The torn frame is cut and its records not yet re-written: they were never
        # acknowledged by a flush, so the committed prefix is all that is promised.
        assert events == FIRST and torn is None
    else:
        assert events == FIRST and torn is not None  # a torn re-append: torn again
    assert await repair(tmp_path, "zstd", "s") == FIRST


@pytest.mark.parametrize("step", ["G2", "G5-before", "G5-after"])
async def test_crash_while_publishing_a_migrated_generation(tmp_path: Path, step: str) -> None:
    source = write_v0(tmp_path, "old", "zstd", v0_events())
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    run_child(tmp_path, "zstd", step, "old")
    assert hashlib.sha256(source.read_bytes()).hexdigest() == digest, "the source is untouched"
    published = (source.parent / "session.v3.jsonl.zstd").exists()
    assert published == (step == "G5-after")
    events, torn = await read(tmp_path, "zstd", "old")
    assert events == expected_v3() and torn is None
    backend = JsonlSessionPersistence(str(tmp_path))
    handle = await backend.open("old", "write")  # migrates again, or uses the published v3
    await handle.close()
    assert (source.parent / "session.v3.jsonl.zstd").exists()
    assert (await read(tmp_path, "zstd", "old"))[0] == expected_v3()

"""Power cuts, replayed from the recorded writes of a real run (issue 42).

A fault-injecting FUSE file system (LazyFS) is not packaged for this machine's
distribution, so the cut is simulated instead, from the outside of the writer: the
crash child runs the same two real agent turns as the rest of the suite (bash calls
that print a few KiB each, so a batch spans disk pages) with a recorder innermost
around ``os.write``, ``os.fsync``, ``os.ftruncate`` and ``os.link`` (``child.py``,
``Recorder``), which logs every operation on the store's files in order, and each
``flushed`` report between them.

The replay keeps, per file, what the last fsync made durable and the pages written
since. After every recorded operation (once the log's name is durable), the disk
could hold: the durable bytes, plus any subset of the 4 KiB pages written since the
last fsync (a page that did not reach the disk reads as zeros), at the new length, at
the end of the last page that did reach it, or at the old length. Every such image
is read through a fresh backend; each must read without a refusal, hold every event
the child reported flushed before that point, exactly as stored at the end of the
run, and nothing that was not written.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from dsh_session_persistence_jsonl import JsonlSessionPersistence

from dsh_host._persistence.persistence import SessionPersistenceError
from dsh_host._session.events import event_to_builtins

from .harness import SESSION_ID, JsonlStore, new_spec, run_child

pytestmark = pytest.mark.slow

PAGE = 4096
#: Subsets of the pending pages tried per cut: all of them up to this many pages, else a
#: seeded sample of this many subsets.
ALL_SUBSETS_UP_TO = 6
SAMPLED_SUBSETS = 64


@dataclass
class FileState:
    """One inode: its bytes now (the page cache) and as of its last fsync (the disk)."""

    current: bytearray = field(default_factory=bytearray)
    durable: bytes = b""
    pending: set[int] = field(default_factory=set)


@dataclass
class Cut:
    after: int  # index of the last recorded operation before the cut
    flushed: int  # events every flush so far reported durable
    image: bytes


def _images(state: FileState, rng: random.Random) -> list[bytes]:
    """What the disk can hold of ``state`` after a power cut (see the module docstring)."""
    current, durable = bytes(state.current), state.durable
    pages = sorted(p for p in state.pending if p * PAGE < len(current))
    if not pages and current[: len(durable)] == durable and len(current) == len(durable):
        return [current]
    base = durable[: len(current)].ljust(len(current), b"\0")
    if len(pages) <= ALL_SUBSETS_UP_TO:
        subsets = [c for k in range(len(pages) + 1) for c in itertools.combinations(pages, k)]
    else:
        subsets = [(), tuple(pages)]
        subsets += [tuple(p for p in pages if rng.random() < 0.5) for _ in range(SAMPLED_SUBSETS)]
    out = {durable}
    for subset in subsets:
        image = bytearray(base)
        for page in subset:
            image[page * PAGE : (page + 1) * PAGE] = current[page * PAGE : (page + 1) * PAGE]
        out.add(bytes(image))
        if subset:
            out.add(bytes(image[: max(len(durable), min(len(current), (max(subset) + 1) * PAGE))]))
    return sorted(out, key=len)


def replay(trace: Path) -> tuple[str, list[Cut]]:
    """The log's path and every image a power cut could leave of it, in order."""
    ops = [json.loads(line) for line in trace.read_text().splitlines()]
    files: dict[str, FileState] = {}
    log: str | None = None
    named = False  # the log's directory entry is durable
    flushed = 0
    rng = random.Random(42)
    cuts: list[Cut] = []
    for index, op in enumerate(ops):
        kind = op["op"]
        if kind == "write":
            state = files.setdefault(op["path"], FileState())
            data = bytes.fromhex(op["data"])
            start, end = op["offset"], op["offset"] + len(data)
            if len(state.current) < end:
                state.current.extend(bytes(end - len(state.current)))
            state.current[start:end] = data
            state.pending.update(range(start // PAGE, (end - 1) // PAGE + 1))
        elif kind == "fsync":
            if op["path"] in files:
                state = files[op["path"]]
                state.durable, state.pending = bytes(state.current), set()
            elif log is not None and op["path"] == os.path.dirname(log):
                named = True
        elif kind == "truncate":
            state = files[op["path"]]
            del state.current[op["size"] :]
            state.pending.add(op["size"] // PAGE)
        elif kind == "link":
            files[op["dst"]] = files[op["src"]]
            if op["dst"].endswith((".jsonl", ".jsonl.zstd")):
                log = op["dst"]
        elif kind == "flushed":
            flushed = max(flushed, op["seq"] + 1)
        if log is not None and named:
            cuts += [Cut(index, flushed, image) for image in _images(files[log], rng)]
    assert log is not None, "the run never published its log"
    return log, cuts


async def _read(root: Path, compression: str) -> list[Any]:
    backend = JsonlSessionPersistence(str(root), compression)  # type: ignore[arg-type]
    load = await (await backend.open(SESSION_ID, "read")).read()
    return [event_to_builtins(event) for event in load.events]


@pytest.mark.parametrize("log_format", ["v3", "v4"])
@pytest.mark.parametrize("compression", ["zstd", "none"])
def test_every_power_cut_of_a_real_run_keeps_every_flushed_event(
    tmp_path: Path, sandbox: str, compression: str, log_format: str
) -> None:
    """On a v3 root and on a v4 one (``format: v4``: DSH 0.2's rows, the same protocol)."""
    factory = JsonlStore(tmp_path)
    spec = new_spec(tmp_path / "run", factory, sandbox=sandbox)
    spec["persistence"]["config"]["compression"] = compression
    spec["persistence"]["config"]["format"] = log_format
    spec["record"] = str(tmp_path / "trace.jsonl")
    spec["noise"] = 6000
    run = run_child(f"power cut, {compression}", spec, factory)
    assert run.finished, run.describe()
    root = Path(factory.root(factory.store_for(tmp_path / "run")))
    reference = anyio.run(_read, root, compression)
    log, cuts = replay(Path(spec["record"]))
    assert run.flushed and cuts, run.describe()
    assert os.path.basename(log).startswith(f"session.{log_format}.jsonl"), log
    copy = tmp_path / "cut"
    shutil.copytree(root, copy)
    target = copy / Path(log).relative_to(root.resolve())
    violations: list[str] = []
    for cut in cuts:
        target.write_bytes(cut.image)
        try:
            events = anyio.run(_read, copy, compression)
        except SessionPersistenceError as refused:
            violations.append(f"after op {cut.after}: refused ({refused})")
            continue
        if len(events) < cut.flushed or events[: cut.flushed] != reference[: cut.flushed]:
            violations.append(
                f"after op {cut.after}: {len(events)} events read, {cut.flushed} were flushed"
            )
        elif events != reference[: len(events)]:
            violations.append(f"after op {cut.after}: read events that were never written")
    print(f"{log_format} {compression}: {len(cuts)} power-cut images, {len(violations)} violations")
    assert len({cut.after for cut in cuts}) > 10 and max(len(c.image) for c in cuts) > 2 * PAGE
    assert not violations, f"{len(violations)} of {len(cuts)} images:\n" + "\n".join(
        violations[:20]
    )

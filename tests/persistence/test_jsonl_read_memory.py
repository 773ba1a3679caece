"""A read holds one frame's plaintext at a time, not the whole log's (issue 42).

The reader decompresses, parses and drops each frame before the next, so beyond the
events it returns and the file's (compressed) bytes, its peak holds about one frame of
plaintext. Measured with ``tracemalloc`` on a log whose plaintext is many times its
compressed size: the transient part of the peak stays under half of the plaintext
(measured: 31 %; holding every frame's plaintext until the parse, as before: 105 %).
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import anyio
import pytest
from dsh_session_persistence_jsonl import JsonlSessionPersistence
from dsh_session_persistence_jsonl._frames import decompress_frame, scan_frames
from dsh_session_persistence_jsonl._reader import read_artifact

from .helpers import header, log

pytestmark = pytest.mark.anyio


async def test_a_read_holds_one_frame_of_plaintext_at_a_time(tmp_path: Path) -> None:
    backend = JsonlSessionPersistence(str(tmp_path))
    handle = await backend.create(header("frames"))
    events = log(250, tools=1)
    for start in range(0, len(events), 20):
        handle.append(events[start : start + 20])
        await handle.flush()
    await handle.close()
    path = backend.locate(header("frames")).path
    data = await anyio.Path(path).read_bytes()
    plaintext = sum(len(decompress_frame(data[s:e])) for s, e in scan_frames(data).frames)
    assert plaintext > 3 * len(data) and len(scan_frames(data).frames) > 90
    tracemalloc.start()
    try:
        read = read_artifact(path, "zstd", typed=True)
        retained, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(read.events) == len(events)
    transient = peak - retained - len(data)  # the file's bytes are read whole
    assert transient < plaintext / 2, (transient, plaintext, len(data))

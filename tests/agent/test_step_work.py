"""Work a durable step of the shipped composition no longer repeats (docs/decisions.md D49).

Each test counts what one cut removed (a library loaded, a price computed, ...) over several
calls or steps; none times anything.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any

import pytest

from dsh_host._tools import beneath


def test_libc_is_loaded_once_for_every_open_beneath(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``openat2`` goes through libc's ``syscall``; loading libc (``ctypes.CDLL``) at every open
    cost more than the open (it ran at every ``read_file`` of a step)."""
    if not beneath.openat2_available():
        pytest.skip("this kernel has no openat2: the walk opens without libc")
    (tmp_path / "notes.txt").write_text("a line\n")
    loads: list[Any] = []
    real = ctypes.CDLL

    class CountingCDLL(real):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            loads.append(args)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(ctypes, "CDLL", CountingCDLL)
    root = os.open(tmp_path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for _ in range(5):
            fd = beneath.open_beneath(root, ("notes.txt",), os.O_RDONLY)
            assert os.read(fd, 7) == b"a line\n"
            os.close(fd)
    finally:
        os.close(root)
    assert len(loads) <= 1  # at most the first open of the process loads it

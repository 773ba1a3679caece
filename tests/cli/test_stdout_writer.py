"""The one printer of standard output, on a real pipe: while a turn runs a write only queues
(a reader that reads nothing holds nobody up), past the bound the streamed text is dropped with a
marker, a kept line (how the turn ended) never is, and once the turn is over everything queued is
written, in order, before the final report."""

from __future__ import annotations

import io
import os
import sys
import threading

import pytest

from dsh_host._cli.output import _Stdout


def test_a_reader_that_reads_nothing_holds_no_write_up(monkeypatch: pytest.MonkeyPatch) -> None:
    read_fd, write_fd = os.pipe()  # 64 KiB of pipe buffer; the text below is ~1 MB
    stream = io.TextIOWrapper(os.fdopen(write_fd, "wb"), encoding="utf-8", write_through=True)
    monkeypatch.setattr(sys, "stdout", stream)
    out = _Stdout()
    line = "x" * 999 + "\n"
    printed = threading.Event()

    def turn() -> None:
        out.decouple()
        for _ in range(1000):
            out.write(line)
            out.flush()
        with out.kept():
            out.write("turn 1 ended: completed\n")
        printed.set()

    printer = threading.Thread(target=turn, daemon=True)
    printer.start()
    # Nobody reads the pipe yet. Before, the first write past 64 KiB blocked here for ever;
    # the join's bound only keeps a regression from hanging the suite.
    printer.join(120)
    assert printed.is_set(), "a write waited for the reader while the turn ran"

    received: list[bytes] = []

    def read_all() -> None:
        with os.fdopen(read_fd, "rb") as pipe:
            received.append(pipe.read())

    reader = threading.Thread(target=read_all, daemon=True)
    reader.start()  # now the reader reads: the turn is over, everything queued follows
    out.settle()
    out.write("session s1 · 12 events\n")  # the final report, written directly
    stream.close()
    reader.join(120)
    text = received[0].decode()
    assert text.endswith("turn 1 ended: completed\nsession s1 · 12 events\n"), text[-300:]
    assert "characters of output dropped here" in text
    assert text.count("[dsh: ") == 1
    assert len(text) < len(line) * 1000  # bounded: not everything was held
    kept = text.split("\n[dsh: ")[0]
    assert kept and set(kept.replace("\n", "")) == {"x"}  # whole lines, in order, before it

"""Terminal output helpers shared by the commands."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from rich.console import Console

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


@functools.cache
def console(stderr: bool = False) -> Console:
    from rich.console import Console  # on first use: a piped `dsh sessions list` never needs it

    if stderr:
        return Console(stderr=True, highlight=False, soft_wrap=True)
    return Console(file=stdout_writer(), highlight=False, soft_wrap=True)  # type: ignore[arg-type]


@functools.cache
def stdout_writer() -> _Stdout:
    """The process's one printer of standard output (the transcript, the status line, reports)."""
    return _Stdout()


def decouple_stdout() -> None:
    """From now until :func:`settle_stdout`, printing never waits for the reader (a turn runs)."""
    stdout_writer().decouple()


def settle_stdout() -> None:
    """Write out everything still queued (waiting for the reader: the turn is over) and print
    synchronously again; says what was dropped. A no-op when nothing was decoupled."""
    stdout_writer().settle()


class _Stdout:
    """Standard output as the printers see it: neither a slow nor a vanished reader changes a run.

    **A slow reader** (``dsh run ... | slow-consumer``, a pipe nobody reads, a terminal paused
    with Ctrl-S): while a turn runs (:func:`decouple_stdout`), a write only queues the text; a
    writer thread hands it to the reader at the reader's pace. The queue is bounded
    (:attr:`LIMIT` characters): past it, the transcript's text is dropped, counted, and replaced
    by one marker line when the reader catches up (the session log has every byte of it). So a
    model request, a tool body or a flush never waits on the printer. When the turn is over and
    its log flushed, :func:`settle_stdout` waits for the reader: the final report (the session
    line, ``--json``'s object) is written whole, after everything queued before it.

    **A reader that went away** (``dsh run ... | head -1``): the first failed write (``EPIPE``,
    or ``EIO`` from a terminal that went away) prints one notice on stderr, points descriptor 1
    at ``/dev/null`` (so neither a later print nor the interpreter's final flush fails again)
    and drops everything after it. rich would otherwise turn the broken pipe into
    ``SystemExit(1)`` in the middle of the turn.
    """

    #: characters queued for a slow reader before the transcript's text is dropped
    LIMIT: Final = 1 << 18

    def __init__(self) -> None:
        self.closed_by_reader = False
        self._cond = threading.Condition()
        self._queue: list[str] = []
        self._queued = 0  # characters queued or being written
        self._dropped = 0
        self._decoupled = False
        self._keep = 0
        self._thread: threading.Thread | None = None

    # -- the printers' side ----------------------------------------------------------------

    def write(self, text: str) -> int:
        if self.closed_by_reader or not text:
            return len(text)
        with self._cond:
            if self._decoupled or self._queued:
                self._enqueue(text, droppable=self._decoupled and not self._keep)
                return len(text)
        try:
            return sys.stdout.write(text)
        except OSError as exc:
            self._stop(exc)
        return len(text)

    def flush(self) -> None:
        if self.closed_by_reader:
            return
        with self._cond:
            if self._decoupled or self._queued:
                return  # the writer thread flushes after every batch
        try:
            sys.stdout.flush()
        except OSError as exc:
            self._stop(exc)

    @contextmanager
    def kept(self) -> Iterator[None]:
        """Around a line that is never dropped, however slow the reader (how a turn ended):
        it is queued past the limit (a few lines; the limit bounds the streamed text)."""
        with self._cond:
            self._keep += 1
        try:
            yield
        finally:
            with self._cond:
                self._keep -= 1

    def decouple(self) -> None:
        with self._cond:
            self._decoupled = True

    def settle(self) -> None:
        with self._cond:
            self._decoupled = False
            if self._dropped:
                self._enqueue(self._marker(), droppable=False)
            while self._queued and not self.closed_by_reader:
                # Waits for the reader (the run is over; nothing else is held up). A timeout
                # only so that a signal (Ctrl-C) is handled while waiting.
                self._cond.wait(0.5)

    def wait_written(self) -> None:
        """Wait until everything queued is written (before a question on the same terminal)."""
        with self._cond:
            while self._queued and not self.closed_by_reader:
                self._cond.wait(0.5)

    # -- the writer thread -----------------------------------------------------------------

    def _enqueue(self, text: str, *, droppable: bool) -> None:
        """Queue ``text`` (the condition is held); over the limit a droppable text is counted
        and dropped, and the marker goes first once there is room again."""
        if droppable and self._queued + len(text) > self.LIMIT:
            self._dropped += len(text)
            return
        if self._dropped:
            marker, self._dropped = self._marker(), 0
            self._queue.append(marker)
            self._queued += len(marker)
        self._queue.append(text)
        self._queued += len(text)
        if self._thread is None:
            self._thread = threading.Thread(target=self._drain, name="dsh-stdout", daemon=True)
            self._thread.start()
        self._cond.notify_all()

    def _marker(self) -> str:
        dropped, self._dropped = self._dropped, 0
        erase = "\r\x1b[2K" if self.isatty() else ""
        return (
            f"{erase}\n[dsh: {dropped} characters of output dropped here: standard output was "
            "read slower than the run wrote it; the session log has all of it (dsh sessions "
            "show)]\n"
        )

    def _drain(self) -> None:
        while True:
            with self._cond:
                while not self._queue:
                    self._cond.wait()
                batch, self._queue = "".join(self._queue), []
            try:
                if not self.closed_by_reader:
                    sys.stdout.write(batch)
                    sys.stdout.flush()
            except (OSError, ValueError) as exc:
                if isinstance(exc, OSError):
                    self._stop(exc)
                else:
                    self.closed_by_reader = True
            with self._cond:
                self._queued -= len(batch)
                if self.closed_by_reader:
                    self._queue, self._queued, self._dropped = [], 0, 0
                self._cond.notify_all()

    def _stop(self, exc: OSError) -> None:
        if self.closed_by_reader:
            return
        self.closed_by_reader = True
        with contextlib.suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        with contextlib.suppress(OSError, ValueError):
            print(
                f"dsh: standard output is gone ({exc.strerror or exc}); printing stops here, "
                "the command runs on and the session log stays complete",
                file=sys.stderr,
                flush=True,
            )

    def isatty(self) -> bool:
        return sys.stdout.isatty()

    def fileno(self) -> int:
        return sys.stdout.fileno()

    @property
    def encoding(self) -> str:
        return sys.stdout.encoding


@contextmanager
def progress(label: str, total: int | None) -> Iterator[Callable[[], None]]:
    """A progress bar on stderr when it is a terminal; a no-op otherwise.

    Long scans (listing many sessions, verifying a large log) would otherwise
    look hung; pipes and CI logs stay clean.
    """
    if not sys.stderr.isatty():
        yield lambda: None
        return
    from rich.progress import Progress

    with Progress(console=console(stderr=True), transient=True) as bar:
        task = bar.add_task(label, total=total)
        yield lambda: bar.advance(task)


def json_line(value: object) -> str:
    """One line of JSON for stdout: non-ASCII kept, lone surrogates as ``\\udXXX`` escapes.

    A log may hold a lone surrogate (a model's broken escape, stored as JS
    writers store it); printed raw it would leave stdout as invalid UTF-8.
    """
    text = json.dumps(value, ensure_ascii=False)
    if _LONE_SURROGATE.search(text):
        text = _LONE_SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
    return text


class StatusLine:
    """One live line at the bottom of a terminal run: a spinner, what runs, and for how long
    (``⠹ bash: run the tests · 12 s``), redrawn by a daemon thread while the model streams
    nothing or a tool runs, so a long wait does not look like a hang.

    It exists only when standard output is a terminal: into a pipe or a file it never writes
    a byte. Every other printer goes through :meth:`clear` (a context manager holding the
    same lock as the redraw), which erases the line first, so output never lands on or after
    it; and a prompt that reads from the person (the approval question) runs inside
    :meth:`paused`, where nothing is drawn at all. The line is redrawn only by the thread, on
    its next tick, and only while a label is set and nothing has paused it.
    """

    FRAMES: Final = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
    TICK: Final = 0.1
    #: At most this many lines of a running tool's live output are drawn above the line.
    TAIL_ROWS: Final = 5

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._label: str | None = None
        self._since = 0.0
        self._tail: tuple[str, ...] = ()
        #: rows on the screen now (the tail's and the line's); 0 when nothing is drawn
        self._drawn = 0
        self._paused = 0
        self._thread: threading.Thread | None = None
        self.enabled = sys.stdout.isatty()

    def show(self, label: str) -> None:
        """Show ``label`` (already :func:`~dsh_host._cli.render.terminal_safe`, one line)."""
        if not self.enabled:
            return
        with self._lock:
            if label != self._label:
                self._label, self._since = label, time.monotonic()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="dsh-status", daemon=True)
                self._thread.start()

    def show_tail(self, lines: Sequence[str]) -> None:
        """Draw ``lines`` (already terminal-safe, one line each; the last :data:`TAIL_ROWS`)
        dimmed above the line: what a running tool prints, live. ``()`` removes them; the
        transcript prints the tool's result itself once it is there."""
        if not self.enabled:
            return
        with self._lock:
            self._tail = tuple(lines[-self.TAIL_ROWS :])

    def hide(self) -> None:
        with self._lock:
            self._label = None
            self._tail = ()
            self._erase()

    @contextmanager
    def clear(self) -> Iterator[None]:
        """Around any other output: the status line is erased first and redrawn after."""
        with self._lock:
            self._erase()
            yield

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Around a prompt: nothing is drawn until it is answered."""
        with self._lock:
            self._paused += 1
            self._erase()
        if self.enabled:  # the question comes after everything printed before it
            stdout_writer().wait_written()
        try:
            yield
        finally:
            with self._lock:
                self._paused -= 1

    def _erase(self) -> None:
        if self._drawn:
            # The line, then each tail row above it; the cursor ends where the tail began.
            self._write("\r\x1b[2K" + "\x1b[1A\r\x1b[2K" * (self._drawn - 1))
            self._drawn = 0

    def _write(self, text: str) -> None:
        # Through the one printer: in order with the transcript, and never waiting on the
        # terminal while a turn runs.
        out = stdout_writer()
        out.write(text)
        out.flush()

    def _run(self) -> None:
        from rich.cells import cell_len, set_cell_size

        frame = 0
        while True:
            time.sleep(self.TICK)
            with self._lock:
                if self._label is None or self._paused:
                    continue
                width = shutil.get_terminal_size().columns
                seconds = int(time.monotonic() - self._since)
                text = f"{self.FRAMES[frame % len(self.FRAMES)]} {self._label} · {seconds} s"
                rows = [*(f"  │ {line}" for line in self._tail), text]
                # Cut to the terminal's width in cells (a wide character takes two): a row
                # that wrapped would leave its first part behind at every redraw.
                for i, row in enumerate(rows):
                    if cell_len(row) > width - 1:
                        rows[i] = set_cell_size(row, max(width - 2, 0)).rstrip() + "…"
                self._erase()
                self._write("\n".join(f"\r\x1b[2K\x1b[2m{row}\x1b[0m" for row in rows))
                self._drawn = len(rows)
                frame += 1


@functools.cache
def status_line() -> StatusLine:
    """The process's one status line (a no-op unless standard output is a terminal)."""
    return StatusLine()

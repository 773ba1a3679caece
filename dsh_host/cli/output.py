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
    return Console(file=_Stdout(), highlight=False, soft_wrap=True)  # type: ignore[arg-type]


class _Stdout:
    """Standard output as the printers see it: a reader that went away stops the printing.

    ``dsh run ... | head -1`` closes the pipe while the turn runs. The transcript prints
    from observers, which the bus already keeps from failing the turn; this is what makes
    the printing *stop* there, quietly: the first failed write (``EPIPE``, or ``EIO`` from
    a terminal that went away) prints one notice on stderr, points descriptor 1 at
    ``/dev/null`` (so neither a later print nor the interpreter's final flush fails again)
    and drops everything after it. rich would otherwise turn the broken pipe into
    ``SystemExit(1)`` in the middle of the turn.
    """

    def __init__(self) -> None:
        self.closed_by_reader = False

    def write(self, text: str) -> int:
        if not self.closed_by_reader:
            try:
                return sys.stdout.write(text)
            except OSError as exc:
                self._stop(exc)
        return len(text)

    def flush(self) -> None:
        if not self.closed_by_reader:
            try:
                sys.stdout.flush()
            except OSError as exc:
                self._stop(exc)

    def _stop(self, exc: OSError) -> None:
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
        """Show ``label`` (already :func:`~dsh_host.cli.render.terminal_safe`, one line)."""
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
        try:
            yield
        finally:
            with self._lock:
                self._paused -= 1

    def _erase(self) -> None:
        if self._drawn:
            # The line, then each tail row above it; the cursor ends where the tail began.
            self._write("\r\x1b[2K" + "\x1b[1A\x1b[2K" * (self._drawn - 1))
            self._drawn = 0

    def _write(self, text: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.write(text)
            sys.stdout.flush()

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
                self._write("\r\x1b[2m" + "\x1b[0m\r\n\x1b[2m".join(rows) + "\x1b[0m")
                self._drawn = len(rows)
                frame += 1


@functools.cache
def status_line() -> StatusLine:
    """The process's one status line (a no-op unless standard output is a terminal)."""
    return StatusLine()

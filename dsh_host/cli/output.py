"""Terminal output helpers shared by the commands."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

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

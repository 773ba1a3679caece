"""Terminal output helpers shared by the commands."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console


@functools.cache
def console(stderr: bool = False) -> Console:
    return Console(stderr=stderr, highlight=False, soft_wrap=True)


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

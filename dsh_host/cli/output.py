"""Terminal output helpers shared by the commands."""

from __future__ import annotations

import functools
import json
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


def json_line(value: object) -> str:
    """One line of JSON for stdout: non-ASCII kept, lone surrogates as ``\\udXXX`` escapes.

    A log may hold a lone surrogate (a model's broken escape, stored as JS
    writers store it); printed raw it would leave stdout as invalid UTF-8.
    """
    text = json.dumps(value, ensure_ascii=False)
    if _LONE_SURROGATE.search(text):
        text = _LONE_SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
    return text

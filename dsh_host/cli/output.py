"""Terminal output helpers shared by the commands."""

from __future__ import annotations

import functools

from rich.console import Console


@functools.cache
def console(stderr: bool = False) -> Console:
    return Console(stderr=stderr, highlight=False, soft_wrap=False)

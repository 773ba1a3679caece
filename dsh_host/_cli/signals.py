"""The signal handling every ``dsh`` command starts with (light: ``dsh --help`` imports it).

:mod:`.interrupts` builds the cooperative cancel of a running turn on top of this.
"""

from __future__ import annotations

import os
import signal
import sys
from contextlib import suppress
from typing import Final

__all__ = ["EXIT_CODES", "exit_on_signals", "say"]

#: The exit status for each handled signal: 128 + its number, as shells report it.
EXIT_CODES: Final = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129}


def exit_on_signals() -> None:
    """Until a command handles them itself: SIGINT / SIGTERM / SIGHUP exit at once.

    Installed first thing by ``dsh``'s ``main``: nothing has been written yet
    (or, between a command's handling and its exit, everything already has),
    so exiting with the signal's code is all there is to do, without a
    ``KeyboardInterrupt`` traceback. :meth:`Interrupts.watch` takes over while
    a command runs and restores this on exit.
    """

    def handler(number: int, frame: object) -> None:
        sig = signal.Signals(number)
        say(f"dsh: {sig.name}: exiting")
        os._exit(EXIT_CODES[sig])

    for sig in EXIT_CODES:
        with suppress(ValueError, OSError):
            signal.signal(sig, handler)


def say(text: str) -> None:
    """One line on stderr, whatever state the stream is in (a signal may come at any time)."""
    with suppress(OSError, ValueError):
        print(text, file=sys.stderr, flush=True)

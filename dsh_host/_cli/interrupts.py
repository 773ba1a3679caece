"""Signals for the command line: interrupt the turn, never the log (D18).

What a person (or a supervisor) gets from ``dsh run`` / ``dsh resume``:

- The **first** SIGINT (Ctrl-C), SIGTERM or SIGHUP (terminal closed) cancels
  the running turn cooperatively: the running tool body is asked to stop and
  awaited, a model stream keeps its visible prefix, the turn ends ``aborted``,
  everything is flushed, and the process exits 130 / 143 / 129. With no turn
  running yet (booting, repairing), the command itself is cancelled the same
  way.
- A **second** signal within the grace period exits at once, and so does the
  end of the grace period itself if the turn still has not stopped. Nothing
  more is written: the log holds what the last flush made durable, and
  ``dsh resume`` repairs it (every durable ``tool/call`` gets a result).
- No traceback on any of these paths.

After SIGHUP the terminal is gone, so writes to it would fail: the standard
streams that are terminals are pointed at ``/dev/null`` first.

The grace period is :data:`DEFAULT_GRACE_S` seconds; ``DSH_INTERRUPT_GRACE_S``
overrides it (tests use a short one).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from contextlib import suppress
from typing import Final

import anyio
import anyio.abc

from .._session.events import HookCancel, TurnEndCancelCause, UserCancel
from .signals import EXIT_CODES, exit_on_signals, say

__all__ = ["DEFAULT_GRACE_S", "EXIT_CODES", "Interrupts", "exit_on_signals"]

#: How long a cancelled turn may take to stop before the process exits anyway.
DEFAULT_GRACE_S: Final = 10.0

_CAUSES: Final[dict[signal.Signals, TurnEndCancelCause]] = {
    signal.SIGINT: UserCancel(),
    signal.SIGTERM: HookCancel(reason="SIGTERM received"),
    signal.SIGHUP: HookCancel(reason="SIGHUP received (terminal closed)"),
}


def grace_period() -> float:
    raw = os.environ.get("DSH_INTERRUPT_GRACE_S")
    if raw is None:
        return DEFAULT_GRACE_S
    try:
        value = float(raw)
    except ValueError:
        return DEFAULT_GRACE_S
    return value if value >= 0 else DEFAULT_GRACE_S


class Interrupts:
    """Turns signals into a cooperative cancel, then into an immediate exit.

    :meth:`watch` runs for the whole command (inside ``anyio.run``); the
    command tells it what to cancel with :meth:`target` (the running agent's
    ``cancel``) and falls back to cancelling ``scope`` (the command itself)
    when no turn is running. :attr:`exit_code` is set by the first signal.
    """

    def __init__(self, *, grace_s: float | None = None) -> None:
        self.grace_s = grace_period() if grace_s is None else grace_s
        self.exit_code: int | None = None
        self.received: signal.Signals | None = None
        self._cancel_turn: Callable[[TurnEndCancelCause], None] | None = None
        self._scope: anyio.CancelScope | None = None
        self._group: anyio.abc.TaskGroup | None = None
        self._grace_scope: anyio.CancelScope | None = None

    def target(self, cancel_turn: Callable[[TurnEndCancelCause], None] | None) -> None:
        """What the first signal cancels (None: the command as a whole)."""
        self._cancel_turn = cancel_turn

    async def watch(self, scope: anyio.CancelScope) -> None:
        """Handle SIGINT / SIGTERM / SIGHUP until cancelled (run it in the command's task group)."""
        self._scope = scope
        with anyio.open_signal_receiver(*EXIT_CODES) as signals:
            async with anyio.create_task_group() as group:
                self._group = group
                try:
                    async for received in signals:
                        self.deliver(signal.Signals(received))
                finally:
                    self._group = None

    def deliver(self, sig: signal.Signals) -> None:
        """Handle ``sig`` as if it had arrived here (the approval prompt forwards its Ctrl-C)."""
        if self.received is not None:
            self._exit_now(f"{sig.name} again")
        self._first(sig)
        if self._group is not None:
            self._group.start_soon(self._grace)

    def _first(self, sig: signal.Signals) -> None:
        self.received = sig
        self.exit_code = EXIT_CODES[sig]
        if sig is signal.SIGHUP:
            _detach_from_terminal()
        cancel_turn = self._cancel_turn
        if cancel_turn is not None:
            say(
                f"dsh: {sig.name}: cancelling the turn (waiting up to {self.grace_s:g} s for it "
                "to stop; press Ctrl-C again to exit at once)"
            )
            cancel_turn(_CAUSES[sig])
        else:
            say(f"dsh: {sig.name}: stopping")
            if self._scope is not None:
                self._scope.cancel()

    def reset(self) -> None:
        """The cancelled turn has stopped: forget the signal and stop its grace period.

        For a command that goes on after a cancelled turn (``dsh chat``): the
        next Ctrl-C is a first one again, cancelling the next turn.
        """
        self.received = None
        self.exit_code = None
        if self._grace_scope is not None:
            self._grace_scope.cancel()
            self._grace_scope = None

    async def _grace(self) -> None:
        with anyio.CancelScope() as scope:
            self._grace_scope = scope
            await anyio.sleep(self.grace_s)
            self._exit_now(f"still running {self.grace_s:g} s after {self._name()}")

    def _name(self) -> str:
        return self.received.name if self.received is not None else "the signal"

    def _exit_now(self, why: str) -> None:
        say(
            f"dsh: {why}: exiting now; the log keeps what was flushed "
            "(`dsh resume ID` repairs the session)"
        )
        code = self.exit_code if self.exit_code is not None else 130
        with suppress(OSError, ValueError):
            sys.stdout.flush()
        with suppress(OSError, ValueError):
            sys.stderr.flush()
        os._exit(code)


def _detach_from_terminal() -> None:
    """Point the standard streams that are terminals at /dev/null (the terminal is gone)."""
    try:
        null = os.open(os.devnull, os.O_RDWR)
    except OSError:
        return
    try:
        for fd in (0, 1, 2):
            with suppress(OSError):
                if os.isatty(fd):
                    os.dup2(null, fd)
    finally:
        os.close(null)

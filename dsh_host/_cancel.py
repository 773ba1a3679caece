"""Cooperative cancellation: :class:`CancelToken`.

Why not a bare cancel scope? DSH's cancellation is *observable*: a tool body
that already started is never abandoned, it is asked to stop and then awaited;
later pipeline stages re-check ``aborted`` and record what really happened
(``ABORTED_BEFORE_DISPATCH`` vs ``ABORTED``). A cancel scope is coercive: it
unwinds whatever is awaiting, so the loop could no longer tell the two apart.
A token is a flag plus a reason plus callbacks; code that *wants* coercive
cancellation for its own awaits (an HTTP stream, a subprocess wait) opts in
with :meth:`CancelToken.linked_scope`.

Tokens are single-event-loop objects: abort them from tasks of the loop that
uses them, not from other threads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import anyio

from .errors import AbortError

AbortCallback = Callable[[Any], None]


class CancelToken:
    """A one-shot abort flag with a reason; the first abort wins."""

    __slots__ = ("_aborted", "_callbacks", "_reason")

    def __init__(self) -> None:
        self._aborted = False
        self._reason: Any = None
        self._callbacks: list[AbortCallback] = []

    @property
    def aborted(self) -> bool:
        return self._aborted

    @property
    def reason(self) -> Any:
        """The reason given to the first :meth:`abort` (None while not aborted)."""
        return self._reason

    def abort(self, reason: Any = None) -> None:
        """Abort with ``reason``; later calls are no-ops (the first cause is kept)."""
        if self._aborted:
            return
        self._aborted = True
        self._reason = reason
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(reason)

    def throw_if_aborted(self) -> None:
        if self._aborted:
            reason = self._reason
            text = f"aborted: {reason!r}" if reason is not None else "aborted"
            raise AbortError(reason, message=text)

    def on_abort(self, callback: AbortCallback) -> Callable[[], None]:
        """Call ``callback(reason)`` on abort (at once if already aborted).

        Returns an unsubscribe function; calling it twice is harmless.
        """
        if self._aborted:
            callback(self._reason)
            return _noop
        self._callbacks.append(callback)

        def unsubscribe() -> None:
            try:
                self._callbacks.remove(callback)
            except ValueError:
                pass

        return unsubscribe

    async def wait(self) -> Any:
        """Block until aborted; return the reason."""
        if not self._aborted:
            event = anyio.Event()
            off = self.on_abort(lambda _reason: event.set())
            try:
                await event.wait()
            finally:
                off()
        return self._reason

    @contextmanager
    def linked_scope(self) -> Iterator[anyio.CancelScope]:
        """A cancel scope that is cancelled when this token aborts.

        The opt-in bridge to coercive cancellation: wrap the awaits you are
        happy to have interrupted, then translate the interruption into your
        own result (anyio swallows the cancellation at the scope boundary, so
        check ``scope.cancelled_caught`` or ``token.aborted`` afterwards).
        """
        with anyio.CancelScope() as scope:
            off = self.on_abort(lambda _reason: scope.cancel())
            try:
                yield scope
            finally:
                off()

    @classmethod
    def any(cls, *tokens: CancelToken | None) -> CancelToken:
        """A child token that aborts when any parent does, with that parent's reason."""
        child = cls()
        for token in tokens:
            if token is not None:
                token.on_abort(child.abort)
        return child

    def __repr__(self) -> str:
        state = f"aborted reason={self._reason!r}" if self._aborted else "live"
        return f"<CancelToken {state}>"


def fuse(caller: CancelToken, other: CancelToken) -> tuple[CancelToken, Callable[[], None]]:
    """A token aborted by either input (first reason wins), and a disposer that unsubscribes.

    Unlike :meth:`CancelToken.any` it leaves no callback behind on a
    long-lived ``caller`` (a turn's token) once the disposer ran: use it for
    per-call tokens. Fusing a token with itself returns it unchanged.
    """
    if caller is other:
        return caller, _noop
    fused = CancelToken()
    if other.aborted:
        fused.abort(other.reason)
        return fused, _noop
    if caller.aborted:
        fused.abort(caller.reason)
        return fused, _noop
    off_caller = caller.on_abort(fused.abort)
    off_other = other.on_abort(fused.abort)

    def dispose() -> None:
        off_caller()
        off_other()

    return fused, dispose


def _noop() -> None:
    return None

"""Write-behind batching for one write handle (session-and-persistence.md §7.3).

``append`` only *admits* events; this controller decides when they are written:

* **Window.** The first event admitted into an empty queue arms a fixed 200 ms
  window. Later events join it without moving the deadline: bounded coalescing,
  not a debounce, so a steady trickle of events is still written every 200 ms.
* **Expiry.** When the window expires and no write is running, the *whole*
  queue becomes one batch. If a write is running, the expiry is remembered and
  the next batch starts as soon as that write settles. Events admitted during
  a write form the next batch with their own window, which keeps its remaining
  time when the write ends.
* **Background failure.** The batch goes back in front of newer events (order
  is never lost), the window is cancelled and automatic writing pauses; the
  failure is reported once. The next admitted event (with a fresh window) or an
  explicit flush retries.
* **Barrier (flush).** Concurrent flushes share one barrier. It cancels the
  window, waits for a running write, then writes until the queue is empty,
  including events admitted meanwhile. A failure is retained, pauses automatic
  writing and is raised to every flush caller (not reported). Admission to the
  barrier closes before it resolves, so a later event arms its own window.

At most one write runs at a time, so the writer never sees two batches of the
same handle concurrently and batches reach storage in admission order. All
state lives on the event loop; the writer may hop to a thread.

The clock and the sleep are injectable so the tests can drive the window with a
manual clock instead of asserting on wall time.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, Generic, TypeVar

import anyio

__all__ = ["WINDOW_SECONDS", "WriteBehind"]

T = TypeVar("T")

#: The fixed coalescing window (seed 000 §4.1: "no longer configurable").
WINDOW_SECONDS: Final = 0.2

Spawn = Callable[..., object]


class _Barrier:
    """One shared flush: every concurrent caller waits on ``done``."""

    __slots__ = ("abandoned", "done", "error")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.error: BaseException | None = None
        #: The task running the barrier was cancelled; waiters start their own.
        self.abandoned = False


class WriteBehind(Generic[T]):
    """The pending queue, the window, the single active write and the flush barrier.

    ``write(batch)`` persists one batch all-or-nothing (raising leaves nothing
    written). It is called with an empty batch only by a flush with nothing
    pending when ``wants_empty_write()`` says so (header-only publication).
    ``spawn(fn, *args)`` starts a background task (``ctx.start_soon`` or a task
    group's ``start_soon``); ``report(exc)`` logs a background failure.
    """

    def __init__(
        self,
        *,
        write: Callable[[Sequence[T]], Awaitable[None]],
        spawn: Spawn,
        report: Callable[[BaseException], None],
        wants_empty_write: Callable[[], bool] = lambda: False,
        clock: Callable[[], float] = anyio.current_time,
        sleep_until: Callable[[float], Awaitable[Any]] = anyio.sleep_until,
        window: float = WINDOW_SECONDS,
    ) -> None:
        self._write = write
        self._spawn = spawn
        self._report = report
        self._wants_empty_write = wants_empty_write
        self._clock = clock
        self._sleep_until = sleep_until
        self._window = window
        self.pending: list[T] = []
        self._active: anyio.Event | None = None
        self._deadline: float | None = None
        self._window_id = 0
        self._expired = False
        self._paused = False
        self._barrier: _Barrier | None = None

    # ----------------------------------------------------------------- state

    @property
    def writing(self) -> bool:
        """A batch is being written right now."""
        return self._active is not None

    @property
    def window_armed(self) -> bool:
        return self._deadline is not None

    @property
    def paused(self) -> bool:
        """Automatic writing stopped after a failure (until the next event or flush)."""
        return self._paused

    @property
    def idle(self) -> bool:
        """Nothing pending, nothing being written, no flush running."""
        return not self.pending and self._active is None and self._barrier is None

    # ------------------------------------------------------------- admission

    def admit(self, items: Sequence[T]) -> None:
        """Queue ``items`` (already validated) behind everything admitted before."""
        if not items:
            return
        was_empty = not self.pending
        self.pending.extend(items)
        if self._barrier is not None:
            return  # the running barrier drains them; no window of their own
        if self._paused:
            self._paused = False
            self._arm()
        elif was_empty:
            self._arm()

    def _arm(self) -> None:
        self._window_id += 1
        self._deadline = self._clock() + self._window
        self._spawn(self._run_window, self._window_id, self._deadline)

    def _disarm(self) -> None:
        self._window_id += 1  # a sleeping timer wakes up stale and does nothing
        self._deadline = None

    async def _run_window(self, window_id: int, deadline: float) -> None:
        await self._sleep_until(deadline)
        if window_id != self._window_id or self._barrier is not None:
            return
        self._deadline = None
        if self._active is not None:
            self._expired = True  # the writer picks the batch up when it settles
            return
        await self._background_writes()

    async def _background_writes(self) -> None:
        while self.pending and self._barrier is None:
            try:
                await self._write_one()
            except Exception as exc:
                if self._barrier is not None:
                    return  # a flush is waiting for this write; it retries the batch
                self._disarm()
                self._paused = True
                self._expired = False
                self._report(exc)
                return
            if not self._expired:
                return  # a newer batch (if any) keeps its own window
            self._expired = False

    async def _write_one(self) -> None:
        """Write the whole queue as one batch; on any failure put it back in front."""
        batch, self.pending = self.pending, []
        done = self._active = anyio.Event()
        try:
            await self._write(batch)
        except BaseException:
            self.pending[:0] = batch
            raise
        finally:
            self._active = None
            done.set()

    # --------------------------------------------------------------- barrier

    async def flush(self) -> None:
        """Write everything admitted so far (and meanwhile); return once it is stored."""
        while self._barrier is not None:
            shared = self._barrier
            await shared.done.wait()
            if shared.error is not None:
                raise shared.error
            if not shared.abandoned:
                return
        barrier = self._barrier = _Barrier()
        try:
            self._disarm()
            self._paused = False
            self._expired = False
            if self._active is not None:
                # Its failure (if any) already put the batch back; we retry it below.
                await self._active.wait()
            wrote = False
            while self.pending:
                try:
                    await self._write_one()
                except Exception as exc:
                    self._paused = True
                    barrier.error = exc
                    raise
                wrote = True
            if not wrote and self._wants_empty_write():
                try:
                    await self._write([])
                except Exception as exc:
                    barrier.error = exc
                    raise
        except BaseException:
            if barrier.error is None:
                # Cancelled: let waiters run their own barrier, and keep the
                # queue moving if nobody flushes again.
                barrier.abandoned = True
                if self.pending and not self._paused:
                    self._arm()
            raise
        finally:
            self._barrier = None  # closes admission before anyone resumes
            barrier.done.set()

"""Blocking storage work on a worker thread, at the least cost the event loop allows.

A storage's durability barrier is a few hundred microseconds of ``write`` +
``fsync``; it runs off the event loop so one session's disk wait never stalls
the others (``bench/concurrency.py`` proves it). ``anyio.to_thread.run_sync``
costs 65-105 µs of CPU per hop on trio (its limiter and cancel-scope bookkeeping
on top of trio's own hop); the checkpoint policy makes three such hops a step.
:func:`run_sync` keeps its contract -- ``fn(*args)`` runs on a worker thread in a
copy of the caller's context, the caller waits for it and cannot be cancelled
while it runs (a write is never abandoned half-way), its exception is re-raised
in the caller -- and on trio hands the work straight to trio's thread cache
(``trio.lowlevel.start_thread_soon``) and wakes the task with one
``run_sync_soon``: ~50 µs a hop (``bench/barrier.py`` measures both). At most
:data:`MAX_IN_FLIGHT` calls take that path at once; beyond it, and on asyncio,
``anyio.to_thread.run_sync`` is used as is (its limiter bounds the threads).
"""

from __future__ import annotations

import contextvars
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, TypeVar, cast

import anyio

if TYPE_CHECKING:
    import outcome

__all__ = ["MAX_IN_FLIGHT", "run_sync"]

T = TypeVar("T")

#: Calls on trio's thread cache at once (anyio's default limiter allows 40 threads). The
#: count is the process's, kept by event-loop threads: a bound, not an exact census.
MAX_IN_FLIGHT: Final = 40

_in_flight = 0


async def run_sync(fn: Callable[..., T], *args: object) -> T:
    """``await anyio.to_thread.run_sync(fn, *args)``, cheaper on trio (see the module)."""
    global _in_flight
    loaded = sys.modules.get("trio")  # not imported here: a running trio has loaded it
    if _in_flight >= MAX_IN_FLIGHT or loaded is None or not loaded.lowlevel.in_trio_task():
        return await anyio.to_thread.run_sync(fn, *args)
    import trio  # the module just found loaded

    await trio.lowlevel.checkpoint_if_cancelled()  # a cancelled caller starts nothing
    task = trio.lowlevel.current_task()
    token = trio.lowlevel.current_trio_token()
    context = contextvars.copy_context()

    def work() -> T:
        return context.run(fn, *args)

    def deliver(result: outcome.Outcome[T]) -> None:  # on the worker thread
        token.run_sync_soon(trio.lowlevel.reschedule, task, result)

    def refuse_abort(_raise_cancel: Any) -> trio.lowlevel.Abort:
        return trio.lowlevel.Abort.FAILED  # the work runs to its end; so does the wait

    _in_flight += 1
    try:
        trio.lowlevel.start_thread_soon(work, deliver)
        result = await trio.lowlevel.wait_task_rescheduled(refuse_abort)
    finally:
        _in_flight -= 1
    return cast(T, result)

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

Even that hop is a round trip of two wake-ups, ~70-120 µs on a shared 2-core VM:
half of a fast disk's ``write`` + ``fsync``. :class:`BarrierLane` decides per
call whether a storage's barrier may run on the event loop instead (trio, nothing
else ready to run, no other work in flight, and the work recently fast), and sends
the others to a few long-lived writer threads; the JSONL storage uses one.
"""

from __future__ import annotations

import collections
import contextvars
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, TypeVar, cast

import anyio

if TYPE_CHECKING:
    import outcome

__all__ = ["DEFAULT_INLINE_BUDGET", "MAX_IN_FLIGHT", "BarrierLane", "run_sync"]

T = TypeVar("T")

#: Calls on trio's thread cache at once (anyio's default limiter allows 40 threads). The
#: count is the process's, kept by event-loop threads: a bound, not an exact census.
MAX_IN_FLIGHT: Final = 40

_in_flight = 0

#: :class:`BarrierLane`'s default budget: work whose recent duration is within 2 ms may run
#: on the event loop (a fast disk's write + fsync is 0.15-0.6 ms; its slow mode ~3 ms).
DEFAULT_INLINE_BUDGET: Final = 0.002


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

    _in_flight += 1
    try:
        trio.lowlevel.start_thread_soon(work, deliver)
        result = await trio.lowlevel.wait_task_rescheduled(_refuse_abort)
    finally:
        _in_flight -= 1
    return cast(T, result)


class BarrierLane:
    """Where one storage's durability work runs: on the event loop when that is both cheaper
    than a worker hop and stalls nobody, else on a worker thread (on trio one of the
    process's barrier writers, below; on asyncio :func:`run_sync`).

    A worker hop's round trip (wake a thread, then wake the event loop) costs ~70-120 µs
    on a shared 2-core VM: more than half of a fast disk's ``write`` + ``fsync``
    (``bench/barrier.py``). So a barrier runs inline, on the event-loop thread, when all
    of these hold at the moment it starts:

    * the loop is trio (asyncio always hops);
    * no other task is ready to run (trio's ``tasks_runnable`` is 0) and no other
      worker-thread work of this module is in flight (nobody's completion would wait);
    * the work's recent duration is within ``inline_budget`` seconds: an estimate that
      rises at once to any slower call and decays by 1/8 per call, measured on
      whichever thread ran the work. A disk in its slow mode therefore gets the hop
      after one call, and the inline path back only once calls are fast again.

    Other tasks of the process (a live display, an HTTP client waiting for its socket)
    then wait at most one call within the budget; any other session mid-step keeps its
    hop (``bench/concurrency.py`` counts the steps other agents take while one agent's
    fsyncs are stalled, with the lane on and off). Inline work is protected from
    ``KeyboardInterrupt`` (trio's ``enable_ki_protection``), so a write is never
    abandoned half-way on either path, and a cancelled caller starts nothing.

    ``inline_budget`` 0 disables the inline path (every call hops).
    """

    __slots__ = ("_estimate", "inline_budget", "inline_calls", "thread_calls")

    def __init__(self, inline_budget: float = DEFAULT_INLINE_BUDGET) -> None:
        if not inline_budget >= 0:
            raise ValueError(f"inline_budget must be >= 0 seconds, got {inline_budget!r}")
        self.inline_budget = inline_budget
        self._estimate = 0.0
        #: How many calls ran inline and on a worker thread (for benches and tests).
        self.inline_calls = 0
        self.thread_calls = 0

    @property
    def estimate(self) -> float:
        """The lane's current estimate of one call's duration, in seconds."""
        return self._estimate

    def _observe(self, seconds: float) -> None:
        estimate = self._estimate
        self._estimate = seconds if seconds > estimate else estimate + (seconds - estimate) / 8

    def _may_run_inline(self) -> Any:
        """The running trio module when this call may run inline, else None."""
        if self._estimate > self.inline_budget or _in_flight:
            return None
        loaded = sys.modules.get("trio")
        if loaded is None or not loaded.lowlevel.in_trio_task():
            return None
        if _runnable_tasks(loaded):
            return None
        return loaded

    async def run(self, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)`` inline or on a worker thread (see the class); its result or error."""
        trio = None if self.inline_budget == 0 else self._may_run_inline()
        if trio is None:
            self.thread_calls += 1
            loaded = sys.modules.get("trio")
            if loaded is not None and loaded.lowlevel.in_trio_task():
                return await _on_writer_thread(loaded, self._timed, fn, *args)
            return await run_sync(self._timed, fn, *args)
        await trio.lowlevel.checkpoint_if_cancelled()  # a cancelled caller starts nothing
        self.inline_calls += 1
        return cast(T, _protected(trio)(self._timed, (fn, *args)))

    def _timed(self, fn: Callable[..., T], *args: object) -> T:
        started = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self._observe(time.perf_counter() - started)


def _runnable_tasks(trio: Any) -> int:
    """How many trio tasks are ready to run. ``current_statistics().tasks_runnable`` says it,
    but also counts every registered file descriptor (O(sockets) a barrier, in a server with
    many clients); the run queue's length is the same number at O(1), read from trio's
    internals while they have that shape (``tests/session/test_barrier_lane.py`` checks the
    two agree) and from the public call otherwise."""
    try:
        return len(trio._core._run.GLOBAL_RUN_CONTEXT.runner.runq)
    except AttributeError:
        return int(trio.lowlevel.current_statistics().tasks_runnable)


_ki_protected: Callable[..., Any] | None = None


def _protected(trio: Any) -> Callable[..., Any]:
    """``call(fn, args)`` -> ``fn(*args)``, with KeyboardInterrupt deferred while it runs."""
    global _ki_protected
    if _ki_protected is None:

        @trio.lowlevel.enable_ki_protection  # type: ignore[untyped-decorator]
        def call(fn: Callable[..., Any], args: tuple[object, ...]) -> Any:
            return fn(*args)

        _ki_protected = call
    return _ki_protected


# --- the barrier writers ---------------------------------------------------------------------
#
# Under many sessions, trio's thread cache wakes one thread per hop, and each hop moves the
# GIL between that thread and the event loop: at 50 agents the hop cost ~170 µs of CPU where
# it costs ~40 alone (``bench/concurrency.py``: CPU per step 1.5x one agent's). A few
# long-lived writers serving one queue instead take the next barrier as soon as they finish
# one, without being woken, so the wake-ups and GIL hand-offs shrink with the load.

#: Writer threads of the process (each runs one barrier at a time; their fsyncs overlap).
WRITER_THREADS: Final = 4


class _Job:
    __slots__ = ("args", "context", "fn", "task", "token")

    def __init__(self, fn: Callable[..., Any], args: tuple[object, ...], task: Any, token: Any):
        self.fn, self.args, self.task, self.token = fn, args, task, token
        self.context = contextvars.copy_context()


class _Writers:
    """Up to ``threads`` daemon threads serving queued jobs in arrival order; a job's result
    (or exception) reschedules its waiting trio task through that task's run token, and
    jobs that finish before the event loop comes round are handed back together."""

    def __init__(self, threads: int) -> None:
        self._jobs: collections.deque[_Job] = collections.deque()
        self._ready = threading.Condition(threading.Lock())
        self._idle = 0  # writers waiting on _ready
        self._started = 0
        self._threads = threads
        #: Finished jobs per trio run token, not yet handed back: the first one finished
        #: schedules one delivery, the ones finished before it runs join it (one wake-up of
        #: the event loop, one system call on the writer, for all of them).
        self._finished: dict[Any, list[tuple[Any, Any]]] = {}
        self._finished_lock = threading.Lock()

    def submit(self, job: _Job) -> None:
        with self._ready:
            self._jobs.append(job)
            if self._idle >= len(self._jobs):
                self._ready.notify()  # an idle writer takes it
            elif self._started < self._threads:
                self._started += 1
                threading.Thread(target=self._serve, name="dsh barrier writer", daemon=True).start()
            # else: every writer is busy; the first one done takes it without a wake-up

    def _serve(self) -> None:
        import outcome
        import trio

        while True:
            with self._ready:
                while not self._jobs:
                    self._idle += 1
                    try:
                        self._ready.wait()
                    finally:
                        self._idle -= 1
                job = self._jobs.popleft()
            result = outcome.capture(job.context.run, job.fn, *job.args)
            token = job.token
            with self._finished_lock:
                waiting = self._finished.get(token)
                if waiting is None:
                    self._finished[token] = [(job.task, result)]
                else:
                    waiting.append((job.task, result))
            del job, result  # hold nothing of a finished job while waiting for the next
            if waiting is None:
                try:
                    token.run_sync_soon(self._deliver, trio, token)
                except trio.RunFinishedError:  # nobody is left to hand them to
                    with self._finished_lock:
                        self._finished.pop(token, None)
            del token, waiting

    def _deliver(self, trio: Any, token: Any) -> None:
        """On the event loop: wake every task whose job finished since the last delivery."""
        with self._finished_lock:
            finished = self._finished.pop(token, [])
        for task, result in finished:
            trio.lowlevel.reschedule(task, result)


_writers = _Writers(WRITER_THREADS)


def _forget_writers_after_fork() -> None:
    global _writers, _in_flight
    _writers, _in_flight = _Writers(WRITER_THREADS), 0  # a forked child has none of the threads


os.register_at_fork(after_in_child=_forget_writers_after_fork)


async def _on_writer_thread(trio: Any, fn: Callable[..., T], *args: object) -> T:
    """:func:`run_sync`'s contract, on one of the process's barrier writers (trio only)."""
    global _in_flight
    await trio.lowlevel.checkpoint_if_cancelled()  # a cancelled caller starts nothing
    job = _Job(fn, args, trio.lowlevel.current_task(), trio.lowlevel.current_trio_token())
    _in_flight += 1
    try:
        _writers.submit(job)
        result = await trio.lowlevel.wait_task_rescheduled(_refuse_abort)
    finally:
        _in_flight -= 1
    return cast(T, result)


def _refuse_abort(_raise_cancel: Any) -> Any:
    import trio

    return trio.lowlevel.Abort.FAILED  # the work runs to its end; so does the wait

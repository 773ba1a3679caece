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
call whether a storage's barrier may run on the event loop instead (trio, no other
work of this module in flight, the run's previous barrier was this lane's, and the
work recently fast), and sends the others to a few long-lived writer threads; the
JSONL storage uses one.

The module reads no trio internals and keeps no process-wide mutable state: the
in-flight count, the last lane and the writer threads belong to one trio run
(:class:`_RunState`, in a ``trio.lowlevel.RunVar``; the writers exit when the run
ends), per docs/decisions.md D41.
"""

from __future__ import annotations

import collections
import contextvars
import math
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, TypeVar, cast

import anyio

if TYPE_CHECKING:
    import outcome

__all__ = [
    "DEFAULT_INLINE_BUDGET",
    "DEFAULT_QUICK_BUDGET",
    "MAX_IN_FLIGHT",
    "BarrierLane",
    "QuickLane",
    "run_sync",
]

T = TypeVar("T")

#: Calls on trio's thread cache at once, per trio run (anyio's default limiter allows 40
#: threads).
MAX_IN_FLIGHT: Final = 40

#: :class:`BarrierLane`'s default budget: work whose recent duration is within 2 ms may run
#: on the event loop (a fast disk's write + fsync is 0.15-0.6 ms; its slow mode ~3 ms).
DEFAULT_INLINE_BUDGET: Final = 0.002

#: :class:`QuickLane`'s default budget: a call whose recent duration is within 0.5 ms may run
#: on the event loop (``read_file`` of a small file: ~20-60 µs of ``openat2`` + ``pread``).
DEFAULT_QUICK_BUDGET: Final = 0.0005


async def run_sync(fn: Callable[..., T], *args: object) -> T:
    """``await anyio.to_thread.run_sync(fn, *args)``, cheaper on trio (see the module)."""
    loaded = sys.modules.get("trio")  # not imported here: a running trio has loaded it
    if loaded is None or not loaded.lowlevel.in_trio_task():
        return await anyio.to_thread.run_sync(fn, *args)
    state = _run_state(loaded)
    if state.in_flight >= MAX_IN_FLIGHT:
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

    state.in_flight += 1
    try:
        trio.lowlevel.start_thread_soon(work, deliver)
        result = await trio.lowlevel.wait_task_rescheduled(_refuse_abort)
    finally:
        state.in_flight -= 1
    return cast(T, result)


class _MeasuredLane:
    """What both lanes share: their estimate of one call's duration (it rises at once to any
    slower call and decays by 1/8 per call), their counts, and the inline path's tail."""

    __slots__ = ("_estimate", "inline_calls", "thread_calls")

    def __init__(self, estimate: float) -> None:
        self._estimate = estimate
        #: How many calls ran inline and on a worker thread (for benches and tests).
        self.inline_calls = 0
        self.thread_calls = 0

    @property
    def estimate(self) -> float:
        """The lane's estimate of one call's duration in seconds (``inf``: nothing measured)."""
        return self._estimate

    def _observe(self, seconds: float) -> None:
        estimate = self._estimate
        if seconds >= estimate or estimate == math.inf:
            self._estimate = seconds
        else:
            self._estimate = estimate + (seconds - estimate) / 8

    def _timed(self, fn: Callable[..., T], *args: object) -> T:
        started = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self._observe(time.perf_counter() - started)

    async def _inline(self, trio: Any, call: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        """``call(*args)`` on the event-loop thread, ``KeyboardInterrupt`` deferred until it
        returns, then one schedule point; the caller has checked it may run inline."""
        await trio.lowlevel.checkpoint_if_cancelled()  # a cancelled caller starts nothing
        self.inline_calls += 1
        try:
            return _protected(trio)(call, args)
        finally:
            # Whatever became ready meanwhile runs before the caller goes on: a task waits at
            # most one inline call, never a whole turn of them (D41). Shielded: the work is
            # done, so its result is delivered, not replaced by a cancellation.
            await trio.lowlevel.cancel_shielded_checkpoint()


class BarrierLane(_MeasuredLane):
    """Where one storage's durability work runs: on the event loop when that is both cheaper
    than a worker hop and stalls nobody, else on a worker thread (on trio one of the run's
    barrier writers, below; on asyncio :func:`run_sync`).

    A worker hop's round trip (wake a thread, then wake the event loop) costs ~70-120 µs
    on a shared 2-core VM: more than half of a fast disk's ``write`` + ``fsync``
    (``bench/barrier.py``). So a barrier runs inline, on the event-loop thread, when all
    of these hold at the moment it starts:

    * the loop is trio (asyncio always hops);
    * no worker-thread work of this module is in flight in this trio run (nobody's
      completion would wait behind it);
    * the run's previous barrier was this lane's (or this is the run's first): a lone
      session goes inline, while sessions taking turns (another session mid-step) keep
      the hop, so their fsyncs overlap on the writers instead of queueing on the loop;
    * the work's recent duration is within ``inline_budget`` seconds: an estimate that
      rises at once to any slower call and decays by 1/8 per call, measured on
      whichever thread ran the work. A disk in its slow mode therefore gets the hop
      after one call, and the inline path back only once calls are fast again.

    The decision reads only this module's own accounting, O(1) whatever the process
    holds (docs/decisions.md D41): no look at trio's run queue, whose public count
    (``current_statistics()``) walks every registered descriptor. Any other task of the
    process (a live display, an HTTP client, one just woken) therefore waits at most one
    call within the budget; ``bench/concurrency.py`` counts the steps other agents take
    while one agent's fsyncs are stalled, with the lane on and off. Inline work is
    protected from ``KeyboardInterrupt`` (trio's ``enable_ki_protection``), so a write is
    never abandoned half-way on either path, and a cancelled caller starts nothing.

    ``inline_budget`` 0 disables the inline path (every call hops).
    """

    __slots__ = ("inline_budget",)

    def __init__(self, inline_budget: float = DEFAULT_INLINE_BUDGET) -> None:
        if not inline_budget >= 0:
            raise ValueError(f"inline_budget must be >= 0 seconds, got {inline_budget!r}")
        super().__init__(0.0)
        self.inline_budget = inline_budget

    async def run(self, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)`` inline or on a worker thread (see the class); its result or error."""
        trio = sys.modules.get("trio")
        if trio is None or not trio.lowlevel.in_trio_task():
            self.thread_calls += 1
            return await run_sync(self._timed, fn, *args)
        state = _run_state(trio)
        previous, state.last_lane = state.last_lane, self
        if (
            self.inline_budget == 0
            or self._estimate > self.inline_budget
            or state.in_flight
            or (previous is not self and previous is not None)
        ):
            self.thread_calls += 1
            return await _on_writer_thread(trio, state, self._timed, fn, *args)
        return cast(T, await self._inline(trio, self._timed, (fn, *args)))


class QuickLane(_MeasuredLane):
    """Where one kind of short blocking call (``read_file``'s open + read) runs: on the event
    loop once its calls have been measured quick, else through :func:`run_sync`.

    A :func:`run_sync` hop costs more CPU than a small file read itself (a thread woken, the
    event loop woken through trio's wake-up socket, one more pass of the run loop: ~10 system
    calls and two context switches a step of the shipped composition, ``bench/README.md``), so
    a call runs inline, on the event-loop thread, when all of these hold (docs/decisions.md D43):

    * the loop is trio (asyncio always hops);
    * no worker-thread work of this module is in flight in this trio run;
    * the lane has measured a call (its first call hops: nothing is known of the file system
      yet), and its estimate of a call's duration is within ``budget`` seconds: like
      :class:`BarrierLane`'s, it rises at once to any slower call and decays by 1/8 per call,
      so a slow file system (or a large file) gets the hop after one call.

    The decision reads only this lane's own accounting and the run's in-flight count; it
    does not take part in :class:`BarrierLane`'s "previous barrier" rule (a read is no
    barrier). Either path runs ``fn`` in a copy of the caller's context, re-raises its
    exception in the caller, and never abandons it half-way (inline, ``KeyboardInterrupt`` is
    deferred as for a barrier); a cancelled caller starts nothing; an inline call ends with one
    cancel-shielded schedule point, so a ready task waits at most one call (D41). ``budget`` 0
    disables the inline path.
    """

    __slots__ = ("budget",)

    def __init__(self, budget: float = DEFAULT_QUICK_BUDGET) -> None:
        if not budget >= 0:
            raise ValueError(f"budget must be >= 0 seconds, got {budget!r}")
        super().__init__(math.inf)  # nothing measured: the first call hops
        self.budget = budget

    async def run(self, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)`` inline or on a worker thread (see the class); its result or error."""
        trio = sys.modules.get("trio")
        if (
            trio is None
            or self._estimate > self.budget
            or not trio.lowlevel.in_trio_task()
            or _run_state(trio).in_flight
        ):
            self.thread_calls += 1
            return await run_sync(self._timed, fn, *args)
        context = contextvars.copy_context()  # as a worker thread runs it (run_sync)
        return cast(T, await self._inline(trio, context.run, (self._timed, fn, *args)))


_ki_protected: Callable[..., Any] | None = None


def _protected(trio: Any) -> Callable[..., Any]:
    """``call(fn, args)`` -> ``fn(*args)``, with KeyboardInterrupt deferred while it runs.
    (Made once, on first use: a function, not state of any run.)"""
    global _ki_protected
    if _ki_protected is None:

        @trio.lowlevel.enable_ki_protection  # type: ignore[untyped-decorator]
        def call(fn: Callable[..., Any], args: tuple[object, ...]) -> Any:
            return fn(*args)

        _ki_protected = call
    return _ki_protected


# --- state per trio run -------------------------------------------------------------------


class _RunState:
    """What this module knows about one trio run: calls of it on worker threads now
    (:func:`run_sync` and the writers), the lane whose barrier started last, and the run's
    barrier writers (started on the first hop, told to exit when the run ends)."""

    __slots__ = ("in_flight", "last_lane", "writers")

    def __init__(self) -> None:
        self.in_flight = 0
        self.last_lane: BarrierLane | None = None
        self.writers: _Writers | None = None


#: The ``trio.lowlevel.RunVar`` holding each run's :class:`_RunState`: made on first use
#: (trio is not imported by this module) and never changed after; the values are per run.
_state_var: Any = None


def _run_state(trio: Any) -> _RunState:
    """This trio run's state (made on the run's first call)."""
    global _state_var
    var = _state_var
    if var is None:
        var = _state_var = trio.lowlevel.RunVar("dsh offload state")
    state: _RunState | None = var.get(None)
    if state is None:
        state = _RunState()
        var.set(state)
    return state


# --- the barrier writers ---------------------------------------------------------------------
#
# Under many sessions, trio's thread cache wakes one thread per hop, and each hop moves the
# GIL between that thread and the event loop: at 50 agents the hop cost ~170 µs of CPU where
# it costs ~40 alone (``bench/concurrency.py``: CPU per step 1.5x one agent's). A few
# long-lived writers serving one queue instead take the next barrier as soon as they finish
# one, without being woken, so the wake-ups and GIL hand-offs shrink with the load.

#: Writer threads of a trio run (each runs one barrier at a time; their fsyncs overlap).
WRITER_THREADS: Final = 4


class _Job:
    __slots__ = ("args", "context", "fn", "task")

    def __init__(self, fn: Callable[..., Any], args: tuple[object, ...], task: Any):
        self.fn, self.args, self.task = fn, args, task
        self.context = contextvars.copy_context()


class _Writers:
    """Up to ``threads`` daemon threads of one trio run serving queued jobs in arrival order;
    a job's result (or exception) reschedules its waiting task through the run's token, and
    jobs that finish before the event loop comes round are handed back together. After
    :meth:`close` (the run ended) each thread exits once the queue is empty."""

    def __init__(self, threads: int, trio: Any) -> None:
        self._jobs: collections.deque[_Job] = collections.deque()
        self._ready = threading.Condition(threading.Lock())
        self._idle = 0  # writers waiting on _ready
        self._alive = 0  # writers started and not exited
        self._threads = threads
        self._closed = False
        self._trio = trio
        self._token = trio.lowlevel.current_trio_token()
        #: Finished jobs not yet handed back: the first one finished schedules one delivery,
        #: the ones finished before it runs join it (one wake-up of the event loop, one
        #: system call on the writer, for all of them). None: no delivery is scheduled.
        self._finished: list[tuple[Any, Any]] | None = None
        self._finished_lock = threading.Lock()
        #: The threads started (for tests: they end with the run).
        self.threads: list[threading.Thread] = []

    def submit(self, job: _Job) -> None:
        with self._ready:
            self._jobs.append(job)
            if self._idle >= len(self._jobs):
                self._ready.notify()  # an idle writer takes it
            elif self._alive < self._threads:
                self._alive += 1
                thread = threading.Thread(
                    target=self._serve, name="dsh barrier writer", daemon=True
                )
                self.threads.append(thread)
                thread.start()
            # else: every writer is busy; the first one done takes it without a wake-up

    def close(self) -> None:
        """The run is ending: writers exit once nothing is queued."""
        with self._ready:
            self._closed = True
            self._ready.notify_all()

    def _serve(self) -> None:
        import outcome

        while True:
            with self._ready:
                while not self._jobs:
                    if self._closed:
                        self._alive -= 1  # a job submitted later starts a writer again
                        return
                    self._idle += 1
                    try:
                        self._ready.wait()
                    finally:
                        self._idle -= 1
                job = self._jobs.popleft()
            result = outcome.capture(job.context.run, job.fn, *job.args)
            with self._finished_lock:
                waiting = self._finished
                if waiting is None:
                    self._finished = [(job.task, result)]
                else:
                    waiting.append((job.task, result))
            del job, result  # hold nothing of a finished job while waiting for the next
            if waiting is None:
                try:
                    self._token.run_sync_soon(self._deliver)
                except self._trio.RunFinishedError:  # nobody is left to hand them to
                    with self._finished_lock:
                        self._finished = None
            del waiting

    def _deliver(self) -> None:
        """On the event loop: wake every task whose job finished since the last delivery."""
        with self._finished_lock:
            finished, self._finished = self._finished or [], None
        for task, result in finished:
            self._trio.lowlevel.reschedule(task, result)


def _writers_of(trio: Any, state: _RunState) -> _Writers:
    """The run's writers, made on its first hop with a system task that closes them when the
    run ends (trio cancels system tasks once the main task has returned)."""
    writers = state.writers
    if writers is None:
        writers = state.writers = _Writers(WRITER_THREADS, trio)
        try:
            trio.lowlevel.spawn_system_task(_close_at_run_end, trio, writers, name="dsh writers")
        except RuntimeError:  # the run is already shutting down: serve what comes, then exit
            writers.close()
    return writers


async def _close_at_run_end(trio: Any, writers: _Writers) -> None:
    try:
        await trio.sleep_forever()
    finally:
        writers.close()


async def _on_writer_thread(trio: Any, state: _RunState, fn: Callable[..., T], *args: object) -> T:
    """:func:`run_sync`'s contract, on one of the run's barrier writers (trio only)."""
    await trio.lowlevel.checkpoint_if_cancelled()  # a cancelled caller starts nothing
    job = _Job(fn, args, trio.lowlevel.current_task())
    state.in_flight += 1
    try:
        _writers_of(trio, state).submit(job)
        result = await trio.lowlevel.wait_task_rescheduled(_refuse_abort)
    finally:
        state.in_flight -= 1
    return cast(T, result)


def _refuse_abort(_raise_cancel: Any) -> Any:
    import trio

    return trio.lowlevel.Abort.FAILED  # the work runs to its end; so does the wait

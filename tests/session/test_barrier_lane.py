"""``dsh_host._persistence.offload.BarrierLane``: a barrier inline on the event loop only when that
stalls nobody and the work has been fast; otherwise the worker-thread hop."""

from __future__ import annotations

import functools
import inspect
import re
import signal
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio

from dsh_host._persistence import offload

pytestmark = pytest.mark.anyio


def where() -> int:
    return threading.get_ident()


async def test_fast_work_with_nothing_else_ready_runs_on_the_event_loop() -> None:
    lane = offload.BarrierLane(0.05)
    assert await lane.run(where) == threading.get_ident()
    assert (lane.inline_calls, lane.thread_calls) == (1, 0)
    assert 0 < lane.estimate < 0.05


async def test_a_zero_budget_always_hops() -> None:
    lane = offload.BarrierLane(0)
    for _ in range(3):
        assert await lane.run(where) != threading.get_ident()
    assert (lane.inline_calls, lane.thread_calls) == (0, 3)


async def test_slow_work_moves_to_the_worker_thread_until_calls_are_fast_again() -> None:
    lane = offload.BarrierLane(0.01)
    await lane.run(time.sleep, 0.05)  # inline: nothing known yet; now the estimate is 50 ms
    assert lane.inline_calls == 1 and lane.estimate >= 0.05
    hopped = 0
    while await lane.run(where) != threading.get_ident():  # fast calls decay the estimate
        hopped += 1
        assert hopped < 100
    # 50 ms decays by 1/8 per fast call: 0.05 * (7/8)^n <= 0.01 needs n >= 13.
    assert hopped >= 12
    assert lane.thread_calls == hopped and lane.estimate <= 0.01


async def test_sessions_taking_turns_hop_and_a_lone_one_goes_inline() -> None:
    """The run's previous barrier decides (docs/decisions.md D41): a lane whose barrier
    follows another lane's hops (their fsyncs overlap on the writers); one that follows
    its own goes inline."""
    first, second = offload.BarrierLane(1.0), offload.BarrierLane(1.0)
    here = threading.get_ident()
    assert await first.run(where) == here  # the run's first barrier
    assert await second.run(where) != here  # another session's barrier came last
    assert await second.run(where) == here  # its own came last
    assert await first.run(where) != here
    assert (first.inline_calls, first.thread_calls) == (1, 1)
    assert (second.inline_calls, second.thread_calls) == (1, 1)


async def test_other_thread_work_in_flight_gets_the_hop() -> None:
    lane = offload.BarrierLane(1.0)
    gate = threading.Event()
    seen: list[int] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(offload.run_sync, gate.wait, 10)
        await trio.sleep(0.01)  # that work is now on its thread; nothing is runnable
        seen.append(await lane.run(where))
        gate.set()
    assert seen != [threading.get_ident()]


async def test_errors_reach_the_caller_on_both_paths() -> None:
    def fail() -> None:
        raise OSError(28, "No space left on device")

    for budget in (1.0, 0.0):
        lane = offload.BarrierLane(budget)
        with pytest.raises(OSError, match="No space left"):
            await lane.run(fail)
        assert lane.estimate > 0  # a failing call is still timed


async def test_a_cancelled_caller_starts_nothing_on_either_path() -> None:
    ran: list[bool] = []
    for budget in (1.0, 0.0):
        lane = offload.BarrierLane(budget)
        with trio.CancelScope() as scope:
            scope.cancel()
            await lane.run(ran.append, True)
        assert scope.cancelled_caught
    assert ran == []


@pytest.mark.both_backends
async def test_asyncio_always_hops(anyio_backend: str) -> None:
    lane = offload.BarrierLane(1.0)
    on_loop = await lane.run(where) == threading.get_ident()
    assert on_loop is (anyio_backend == "trio")


def test_a_negative_budget_is_refused() -> None:
    with pytest.raises(ValueError, match="inline_budget must be >= 0 seconds, got -1"):
        offload.BarrierLane(-1)


def _interrupted_write(steps: list[str]) -> None:
    """A write that gets SIGINT half-way (as Ctrl-C would).

    The signal goes to the main thread itself (``pthread_kill``): a process-directed one
    is taken by whichever thread of the test process the kernel picks, and that is not
    what this test is about.
    """
    steps.append("write")
    signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)
    time.sleep(0.05)  # the handler runs here, on the main thread
    steps.append("fsync")


def test_inline_work_is_not_torn_by_ctrl_c() -> None:
    """Ctrl-C during an inline barrier is delivered after the write and its fsync, never
    between them; the control (the same work unprotected) is torn."""

    async def lane_write(steps: list[str]) -> None:
        lane = offload.BarrierLane(1.0)
        await lane.run(_interrupted_write, steps)
        assert lane.inline_calls == 1
        steps.append("returned")
        await trio.sleep(1)

    async def bare_write(steps: list[str]) -> None:
        _interrupted_write(steps)
        steps.append("returned")

    # trio installs its Ctrl-C handler only over Python's default one: say so if a test
    # that ran before this one in the same process left another handler (or a mask) behind.
    handler = signal.getsignal(signal.SIGINT)
    assert handler is signal.default_int_handler, f"SIGINT's handler is {handler!r}"
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    protected: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        trio.run(lane_write, protected)
    assert protected == ["write", "fsync", "returned"]
    control: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        trio.run(bare_write, control)
    assert control == ["write"]


async def test_hopped_barriers_share_a_few_long_lived_writers_and_overlap() -> None:
    """Their fsyncs overlap (four calls meet inside a threading barrier: serialized calls
    would time out there), more calls than writers queue and all complete, on at most
    ``WRITER_THREADS`` threads."""
    lane = offload.BarrierLane(0)
    meet = threading.Barrier(offload.WRITER_THREADS, timeout=10)
    seen: list[tuple[int, str]] = []

    def write(n: int) -> int:
        if n < offload.WRITER_THREADS:
            meet.wait()
        seen.append((threading.get_ident(), threading.current_thread().name))
        return n

    results: list[int] = []
    async with trio.open_nursery() as nursery:
        for n in range(3 * offload.WRITER_THREADS):
            nursery.start_soon(_append, results, functools.partial(lane.run, write, n))
    assert sorted(results) == list(range(3 * offload.WRITER_THREADS))
    assert {name for _, name in seen} == {"dsh barrier writer"}
    assert len({ident for ident, _ in seen}) <= offload.WRITER_THREADS
    assert offload._run_state(trio).in_flight == 0


async def _append(out: list[int], call: Callable[[], Awaitable[int]]) -> None:
    out.append(await call())


async def test_jobs_finished_while_the_loop_is_busy_are_handed_back_in_one_delivery(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under load the writers finish barriers faster than the event loop comes round: the
    first finished job schedules a delivery, the others join it (one wake-up of the loop for
    all of them); every caller still gets its own result, in any order."""
    lane = offload.BarrierLane(0)
    writers = offload._writers_of(trio, offload._run_state(trio))
    deliveries: list[int] = []
    deliver = writers._deliver

    def counted() -> None:
        deliveries.append(len(writers._finished or ()))
        deliver()

    monkeypatch.setattr(writers, "_deliver", counted)
    jobs = offload.WRITER_THREADS - 1
    started: list[int] = []
    release = threading.Event()

    def write(n: int) -> int:
        started.append(n)
        release.wait(10)
        return n

    results: list[int] = []
    async with trio.open_nursery() as nursery:
        for n in range(jobs):
            nursery.start_soon(_append, results, functools.partial(lane.run, write, n))
        with trio.fail_after(10):
            while len(started) < jobs:  # noqa: ASYNC110 - writer threads append to it
                await trio.sleep(0.001)
        release.set()
        # The event loop is held on purpose until every job has finished (they queue for
        # the delivery the first of them scheduled, which cannot run before the loop does).
        deadline = time.monotonic() + 10
        while len(writers._finished or ()) < jobs and time.monotonic() < deadline:
            time.sleep(0.001)  # noqa: ASYNC251
    assert sorted(results) == list(range(jobs))
    assert deliveries == [jobs]
    assert writers._finished is None
    assert offload._run_state(trio).in_flight == 0


def test_the_module_reads_no_trio_internals() -> None:
    """Performance code does not leak (docs/decisions.md D41): nothing of trio's private
    modules or attributes is named in the offload module, only ``trio.lowlevel``'s public
    API."""
    source = inspect.getsource(offload)
    private = re.findall(r"\btrio\._\w+|\b_core\b|GLOBAL_RUN_CONTEXT|\brunq\b", source)
    assert private == []


def test_the_state_ends_with_the_trio_run() -> None:
    """In-flight count, last lane and writer threads are the run's: after ``trio.run``
    returns its writers exit, and the next run starts with fresh state (a first barrier
    inline again, new writers)."""

    async def hop_and_share(out: dict[str, Any]) -> None:
        lane = offload.BarrierLane(0)
        for _ in range(3):
            await lane.run(where)
        state = offload._run_state(trio)
        out["state"], out["writers"] = state, state.writers
        out["inline"] = await offload.BarrierLane(1.0).run(where) == threading.get_ident()

    one: dict[str, Any] = {}
    two: dict[str, Any] = {}
    trio.run(hop_and_share, one)
    trio.run(hop_and_share, two)
    assert one["state"] is not two["state"]
    assert one["writers"] is not two["writers"]
    for out in (one, two):
        threads = out["writers"].threads
        assert threads, "the hops ran on the run's writers"
        for thread in threads:
            thread.join(10)
            assert not thread.is_alive(), "a writer outlived its trio run"
        assert out["state"].in_flight == 0
        assert out["inline"] is False  # the previous barrier was another lane's


async def test_a_job_submitted_after_the_writers_closed_still_runs() -> None:
    """A barrier hopped while the run is ending (from a system task, after the writers were
    told to exit and did) starts a writer again instead of waiting forever."""
    state = offload._RunState()
    writers = state.writers = offload._Writers(1, trio)
    assert await offload._on_writer_thread(trio, state, where) != threading.get_ident()
    writers.close()
    for thread in writers.threads:
        thread.join(10)
        assert not thread.is_alive()
    ran = threading.Event()
    waiting: list[Any] = []

    async def late() -> None:
        waiting.append(trio.lowlevel.current_task())
        await offload._on_writer_thread(trio, state, ran.set)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(late)
        with trio.move_on_after(10):
            while not ran.is_set():  # noqa: ASYNC110 - a writer thread sets it
                await trio.sleep(0.001)
        if not ran.is_set():  # nobody will ever hand it back: release the waiting task
            import outcome

            trio.lowlevel.reschedule(waiting[0], outcome.Value(None))
    assert ran.is_set(), "the late job never ran"


async def test_a_ready_task_runs_between_inline_calls() -> None:
    """D41: a task that becomes ready waits at most one inline call. Without a schedule point
    after each call, a caller whose other awaits never block (a scripted model, no tool hop)
    ran every barrier inline back to back and held the loop for them all."""
    if not trio.lowlevel.in_trio_task():
        pytest.skip("the inline lane is trio's")
    lane = offload.BarrierLane(1.0)
    ticks = 0
    seen: list[int] = []

    async def other() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(other)
        await trio.lowlevel.checkpoint()  # let it start
        for _ in range(20):
            assert await lane.run(where) == threading.get_ident()  # inline, every time
            seen.append(ticks)
        nursery.cancel_scope.cancel()
    assert lane.inline_calls == 20
    # The other task runs once in each scheduling batch after a call (before or after this
    # one resumes, in the order trio picks): about one tick a call; none without the yield.
    assert seen[-1] - seen[0] >= len(seen) - 2, seen

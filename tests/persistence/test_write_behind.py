"""The shared write-behind controller (D7), driven by a manual clock.

The controller takes its clock and its sleep as parameters; here both come from
:class:`ManualClock`, so "200 ms" is an explicit ``advance`` and no test
depends on how fast the machine is.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import anyio
import pytest

from dsh_host._persistence.write_behind import WINDOW_SECONDS, WriteBehind

# both backends: the persistence write-behind
pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]

MS = 0.001


class ManualClock:
    def __init__(self) -> None:
        self.now = 0.0
        self._sleepers: list[tuple[float, anyio.Event]] = []

    def __call__(self) -> float:
        return self.now

    async def sleep_until(self, deadline: float) -> None:
        if deadline <= self.now:
            await anyio.lowlevel.checkpoint()
            return
        event = anyio.Event()
        self._sleepers.append((deadline, event))
        await event.wait()

    async def advance(self, seconds: float) -> None:
        await anyio.wait_all_tasks_blocked()
        self.now += seconds
        due = [item for item in self._sleepers if item[0] <= self.now + 1e-9]
        for item in due:
            self._sleepers.remove(item)
            item[1].set()
        await anyio.wait_all_tasks_blocked()


class Writer:
    """Records batches; can hold writes open (``gate``) or fail them (``fail``, ``fail_once``)."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.calls = 0
        self.gate: anyio.Event | None = None
        self.fail: Exception | None = None
        self.fail_once: Exception | None = None

    async def __call__(self, batch: Sequence[int]) -> None:
        self.calls += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.fail_once is not None:
            failure, self.fail_once = self.fail_once, None
            raise failure
        if self.fail is not None:
            raise self.fail
        self.batches.append(list(batch))


@asynccontextmanager
async def task_group() -> AsyncIterator[anyio.abc.TaskGroup]:
    """A task group whose leftover window sleepers (stale, on the manual clock) are cancelled."""
    async with anyio.create_task_group() as tg:
        yield tg
        tg.cancel_scope.cancel()


class Harness:
    def __init__(self, tg: anyio.abc.TaskGroup, *, empty_write: bool = False) -> None:
        self.clock = ManualClock()
        self.writer = Writer()
        self.reports: list[BaseException] = []
        self.batcher: WriteBehind[int] = WriteBehind(
            write=self.writer,
            spawn=tg.start_soon,
            report=self.reports.append,
            wants_empty_write=lambda: empty_write,
            clock=self.clock,
            sleep_until=self.clock.sleep_until,
        )


async def test_window_is_fixed_from_the_first_event_not_a_debounce() -> None:
    async with task_group() as tg:
        h = Harness(tg)
        h.batcher.admit([0])
        await h.clock.advance(150 * MS)
        h.batcher.admit([1])  # joins the window; the deadline stays at 200 ms
        await h.clock.advance(49 * MS)
        assert h.writer.batches == []
        await h.clock.advance(1 * MS)
        assert h.writer.batches == [[0, 1]]
        assert not h.batcher.window_armed


async def test_twenty_events_ten_ms_apart_are_one_batch() -> None:
    async with task_group() as tg:
        h = Harness(tg)
        for seq in range(20):
            h.batcher.admit([seq])
            await h.clock.advance(10 * MS)
        assert h.writer.batches == [list(range(20))]


async def test_controller_owns_its_copy_of_the_batch() -> None:
    async with task_group() as tg:
        h = Harness(tg)
        items = [0, 1]
        h.batcher.admit(items)
        items.append(99)
        await h.clock.advance(WINDOW_SECONDS)
        assert h.writer.batches == [[0, 1]]


async def test_concurrent_flushes_share_one_barrier_that_drains_late_events() -> None:
    async with task_group() as tg:
        h = Harness(tg)
        h.writer.gate = anyio.Event()
        h.batcher.admit([0, 1])
        done: list[int] = []

        async def flush(n: int) -> None:
            await h.batcher.flush()
            done.append(n)

        tg.start_soon(flush, 1)
        tg.start_soon(flush, 2)
        await anyio.wait_all_tasks_blocked()
        h.batcher.admit([2])  # admitted while the barrier runs: no window of its own
        assert not h.batcher.window_armed
        h.writer.gate.set()
        await anyio.wait_all_tasks_blocked()
        assert sorted(done) == [1, 2]
        assert h.writer.batches == [[0, 1], [2]]
        assert not h.batcher.window_armed and h.batcher.idle
        # After a quiescent barrier a new event gets a fresh 200 ms window.
        h.batcher.admit([3])
        assert h.batcher.window_armed
        await h.clock.advance(199 * MS)
        assert h.writer.batches == [[0, 1], [2]]
        await h.clock.advance(1 * MS)
        assert h.writer.batches == [[0, 1], [2], [3]]


async def test_expired_tail_starts_right_after_the_active_write() -> None:
    async with task_group() as tg:
        h = Harness(tg)
        h.writer.gate = anyio.Event()
        h.batcher.admit([0])
        await h.clock.advance(WINDOW_SECONDS)  # write of [0] starts and hangs
        assert h.batcher.writing
        h.batcher.admit([1])  # its own window: 200..400 ms
        await h.clock.advance(WINDOW_SECONDS)  # expires while [0] is still being written
        assert h.writer.calls == 1
        h.writer.gate.set()
        await anyio.wait_all_tasks_blocked()  # no clock movement needed
        assert h.writer.batches == [[0], [1]]


async def test_unexpired_tail_keeps_its_remaining_time() -> None:
    async with task_group() as tg:
        h = Harness(tg)
        h.writer.gate = anyio.Event()
        h.batcher.admit([0])
        await h.clock.advance(WINDOW_SECONDS)  # t=200: write of [0] starts
        await h.clock.advance(50 * MS)
        h.batcher.admit([1])  # t=250: window until 450
        await h.clock.advance(50 * MS)
        h.writer.gate.set()  # t=300: [0] lands; [1] keeps waiting
        await anyio.wait_all_tasks_blocked()
        assert h.writer.batches == [[0]]
        await h.clock.advance(149 * MS)
        assert h.writer.batches == [[0]]
        await h.clock.advance(1 * MS)
        assert h.writer.batches == [[0], [1]]


async def test_background_failure_is_reported_once_and_pauses_until_the_next_event() -> None:
    async with task_group() as tg:
        h = Harness(tg)
        failure = OSError("disk unavailable")
        h.writer.fail = failure
        h.batcher.admit([0])
        await h.clock.advance(WINDOW_SECONDS)
        assert h.reports == [failure]
        assert h.batcher.paused and h.batcher.pending == [0]
        await h.clock.advance(1.0)  # no retry on its own
        assert h.writer.calls == 1 and h.reports == [failure]
        h.writer.fail = None
        h.batcher.admit([1])  # the next event restarts a fresh window
        await h.clock.advance(199 * MS)
        assert h.writer.batches == []
        await h.clock.advance(1 * MS)
        assert h.writer.batches == [[0, 1]]
        assert h.reports == [failure]


async def test_failure_inside_the_barrier_is_raised_not_reported_and_retained() -> None:
    async with task_group() as tg:
        h = Harness(tg)
        failure = OSError("disk unavailable")
        h.writer.fail = failure
        h.batcher.admit(list(range(150_000)))
        with pytest.raises(OSError) as raised:
            await h.batcher.flush()
        assert raised.value is failure
        assert h.reports == []
        assert len(h.batcher.pending) == 150_000 and h.batcher.paused
        h.writer.fail = None
        await h.batcher.flush()
        assert [len(b) for b in h.writer.batches] == [150_000]
        assert h.batcher.idle and not h.batcher.paused


async def test_concurrent_flush_callers_all_get_the_same_failure() -> None:
    async with task_group() as tg:
        h = Harness(tg)
        h.writer.gate = anyio.Event()
        h.writer.fail = OSError("boom")
        h.batcher.admit([0])
        errors: list[BaseException] = []

        async def flush() -> None:
            try:
                await h.batcher.flush()
            except OSError as error:
                errors.append(error)

        tg.start_soon(flush)
        tg.start_soon(flush)
        await anyio.wait_all_tasks_blocked()
        h.writer.gate.set()
        await anyio.wait_all_tasks_blocked()
        assert len(errors) == 2 and errors[0] is errors[1] is h.writer.fail


async def test_flush_waits_for_a_running_background_write_and_retries_its_batch() -> None:
    async with task_group() as tg:
        h = Harness(tg)
        h.writer.gate = anyio.Event()
        h.writer.fail_once = OSError("transient")
        h.batcher.admit([0])
        await h.clock.advance(WINDOW_SECONDS)  # the background write starts and hangs
        flushed = anyio.Event()

        async def flush() -> None:
            await h.batcher.flush()
            flushed.set()

        tg.start_soon(flush)
        await anyio.wait_all_tasks_blocked()
        assert not flushed.is_set()
        h.writer.gate.set()  # the background attempt fails; the barrier writes the batch again
        await flushed.wait()
        assert h.writer.calls == 2 and h.writer.batches == [[0]]
        assert h.reports == []  # the barrier took over: not a background failure
        assert h.batcher.idle and not h.batcher.paused


async def test_empty_flush_asks_for_an_empty_write_only_when_wanted() -> None:
    async with task_group() as tg:
        wanted = Harness(tg, empty_write=True)
        await wanted.batcher.flush()
        assert wanted.writer.batches == [[]]
        unwanted = Harness(tg, empty_write=False)
        await unwanted.batcher.flush()
        assert unwanted.writer.batches == []


async def test_cancelled_flush_keeps_the_queue_moving() -> None:
    async with task_group() as tg:
        h = Harness(tg)
        h.writer.gate = anyio.Event()
        h.batcher.admit([0])
        await h.clock.advance(WINDOW_SECONDS)  # background write of [0] hangs
        h.batcher.admit([1])
        with anyio.CancelScope() as scope:
            scope.cancel()
            await h.batcher.flush()  # cancelled while waiting for the active write
        assert scope.cancelled_caught
        h.writer.gate.set()
        await anyio.wait_all_tasks_blocked()
        assert h.writer.batches == [[0]]
        await h.clock.advance(WINDOW_SECONDS)  # the re-armed window writes [1]
        assert h.writer.batches == [[0], [1]]


async def test_a_window_disarmed_by_flushes_is_reused_not_respawned() -> None:
    """The checkpoint policy's pattern (admit, flush, admit, flush, ...) arms a window per
    batch; one sleeper task serves them all, and the last window still expires on time."""
    async with task_group() as tg:
        spawned: list[object] = []

        def spawn(fn: object) -> None:
            spawned.append(fn)
            tg.start_soon(fn)  # type: ignore[arg-type]

        clock = ManualClock()
        writer = Writer()
        batcher: WriteBehind[int] = WriteBehind(
            write=writer,
            spawn=spawn,
            report=lambda _: None,
            clock=clock,
            sleep_until=clock.sleep_until,
        )
        for seq in range(10):
            batcher.admit([seq])
            assert batcher.window_armed
            await batcher.flush()
            assert not batcher.window_armed
            await clock.advance(5 * MS)
        assert len(spawned) == 1
        assert writer.batches == [[seq] for seq in range(10)]
        batcher.admit([10])  # armed at 50 ms: expires at 250 ms, not at the stale 200 ms
        await clock.advance(150 * MS)  # now 200 ms: the sleeper wakes and sleeps on
        assert writer.batches[-1] == [9]
        await clock.advance(50 * MS)
        assert writer.batches[-1] == [10]
        assert not batcher.window_armed

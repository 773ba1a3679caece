"""``dsh_host._persistence.offload.run_sync``: the storages' worker-thread hop (both backends)."""

from __future__ import annotations

import contextvars
import threading
import time

import anyio
import pytest
import trio

from dsh_host._persistence import offload

pytestmark = pytest.mark.anyio

_where: contextvars.ContextVar[str] = contextvars.ContextVar("where", default="unset")


async def test_runs_on_a_worker_thread_in_the_callers_context() -> None:
    _where.set("caller")

    def probe(extra: int) -> tuple[int, str, int]:
        return threading.get_ident(), _where.get(), extra

    ident, seen, extra = await offload.run_sync(probe, 7)
    assert ident != threading.get_ident()
    assert (seen, extra) == ("caller", 7)


async def test_the_workers_exception_is_raised_in_the_caller() -> None:
    def fail() -> None:
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        await offload.run_sync(fail)


async def test_a_cancelled_caller_waits_for_the_work_to_finish() -> None:
    """Cancellation never abandons a write half-way: the wait outlives the cancel and the
    cancellation is delivered once the work is done."""
    finished: list[bool] = []

    def slow_write() -> None:
        time.sleep(0.2)
        finished.append(True)

    with anyio.CancelScope() as scope:
        scope.cancel()
        await offload.run_sync(slow_write)  # already cancelled: nothing starts
    assert finished == []
    async with anyio.create_task_group() as tg:

        async def write() -> None:
            await offload.run_sync(slow_write)

        tg.start_soon(write)
        await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    assert finished == [True]


async def test_past_the_in_flight_bound_calls_still_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(offload, "MAX_IN_FLIGHT", 2)
    gate = threading.Event()
    results: list[int] = []

    def held(n: int) -> int:
        gate.wait(10)
        return n

    async with anyio.create_task_group() as tg:

        async def one(n: int) -> None:
            results.append(await offload.run_sync(held, n))

        for n in range(5):
            tg.start_soon(one, n)
        await anyio.sleep(0.05)
        gate.set()
    assert sorted(results) == [0, 1, 2, 3, 4]
    assert offload._run_state(trio).in_flight == 0

"""``dsh_host._persistence.offload.QuickLane``: a short blocking call (``read_file``'s open and
read) runs inline on the event loop once it has been measured quick; the first call, a slow
one's successors and a call beside other worker-thread work hop (docs/decisions.md D43)."""

from __future__ import annotations

import contextvars
import functools
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from dsh_host import CancelToken, Row, open_host
from dsh_host._persistence import offload
from dsh_host._tools import TOOLS, ToolExecutionInput

pytestmark = pytest.mark.anyio


def where() -> int:
    return threading.get_ident()


async def test_the_first_call_hops_then_quick_calls_run_on_the_event_loop() -> None:
    lane = offload.QuickLane(1.0)
    here = threading.get_ident()
    assert lane.estimate == float("inf")
    assert await lane.run(where) != here  # nothing measured yet
    assert 0 < lane.estimate < 1.0
    for _ in range(3):
        assert await lane.run(where) == here
    assert (lane.inline_calls, lane.thread_calls) == (3, 1)


async def test_a_slow_call_sends_the_next_ones_to_a_worker_thread() -> None:
    lane = offload.QuickLane(0.01)
    here = threading.get_ident()
    await lane.run(where)  # hops: measured
    await lane.run(time.sleep, 0.05)  # inline, and 50 ms now the estimate
    assert lane.estimate >= 0.05
    assert await lane.run(where) != here
    assert (lane.inline_calls, lane.thread_calls) == (1, 2)


async def test_a_zero_budget_always_hops_and_a_negative_one_is_refused() -> None:
    lane = offload.QuickLane(0)
    for _ in range(3):
        assert await lane.run(where) != threading.get_ident()
    assert (lane.inline_calls, lane.thread_calls) == (0, 3)
    with pytest.raises(ValueError, match="budget must be >= 0 seconds, got -1"):
        offload.QuickLane(-1)


async def test_other_thread_work_in_flight_gets_the_hop() -> None:
    lane = offload.QuickLane(1.0)
    await lane.run(where)
    gate = threading.Event()
    seen: list[int] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(offload.run_sync, gate.wait, 10)
        await trio.sleep(0.01)  # that work is now on its thread
        seen.append(await lane.run(where))
        gate.set()
    assert seen != [threading.get_ident()]


async def test_errors_context_and_cancellation_on_the_inline_path() -> None:
    lane = offload.QuickLane(1.0)
    await lane.run(where)
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="caller")

    def fail() -> None:
        raise OSError(5, "Input/output error")

    def set_var() -> str:
        var.set("callee")
        return var.get()

    with pytest.raises(OSError, match="Input/output error"):
        await lane.run(fail)
    assert await lane.run(set_var) == "callee"
    assert var.get() == "caller"  # a copy of the caller's context, as on a worker thread
    ran: list[bool] = []
    with trio.CancelScope() as scope:
        scope.cancel()
        await lane.run(ran.append, True)
    assert scope.cancelled_caught and ran == []
    assert lane.inline_calls == 2


async def test_a_quick_call_leaves_the_barrier_lanes_turn_alone() -> None:
    """A read is no barrier: a lone session's barriers stay inline around it (D41, D43)."""
    barrier, quick = offload.BarrierLane(1.0), offload.QuickLane(1.0)
    here = threading.get_ident()
    await quick.run(where)
    assert await barrier.run(where) == here
    assert await quick.run(where) == here
    assert await barrier.run(where) == here
    assert (barrier.inline_calls, barrier.thread_calls) == (2, 0)


async def test_read_file_hops_once_then_reads_on_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shipped read_file reads through a ``QuickLane``: of 20 reads of a small file only
    the first goes to a worker thread (each hop woke a thread and then the event loop: ~10
    system calls a step, bench/README.md). A budget no read can exceed keeps the count
    independent of the machine's load."""
    hops: list[Any] = []
    real_run_sync = offload.run_sync

    async def counting(fn: Any, *args: object) -> Any:
        hops.append(fn)
        return await real_run_sync(fn, *args)

    monkeypatch.setattr(offload, "run_sync", counting)
    monkeypatch.setattr(offload, "QuickLane", functools.partial(offload.QuickLane, 60.0))
    (tmp_path / "notes.txt").write_text("one\ntwo\n")
    rows = [Row(name="tools"), Row(name="builtin-tools", config={"workspace": str(tmp_path)})]
    async with open_host(rows) as host:
        tools = host.ctx.service(TOOLS)
        for n in range(20):
            request = ToolExecutionInput(
                call_id=f"call-{n}",
                name="read_file",
                arguments={"path": "notes.txt"},
                signal=CancelToken(),
            )
            result = await tools.execute(request)
            text = "".join(getattr(block, "text", "") for block in result.content)
            assert "1: one" in text and "2: two" in text, text
    assert len(hops) == 1, hops


def _interrupted_read(steps: list[str]) -> None:
    """A read that gets SIGINT half-way (as Ctrl-C would), on the main thread itself."""
    steps.append("open")
    signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)
    time.sleep(0.05)  # the handler runs here, on the main thread
    steps.append("close")


def test_an_inline_call_is_not_torn_by_ctrl_c() -> None:
    """As a barrier's (D41): Ctrl-C during an inline call is delivered after it, never
    between its open and its close (a descriptor would leak)."""

    async def lane_read(steps: list[str]) -> None:
        lane = offload.QuickLane(1.0)
        await lane.run(where)  # measured: the next call runs inline
        await lane.run(_interrupted_read, steps)
        assert lane.inline_calls == 1
        steps.append("returned")
        await trio.sleep(1)

    handler = signal.getsignal(signal.SIGINT)
    assert handler is signal.default_int_handler, f"SIGINT's handler is {handler!r}"
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    steps: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        trio.run(lane_read, steps)
    assert steps == ["open", "close", "returned"]

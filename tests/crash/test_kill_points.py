"""SIGKILL at chosen points of real agent turns, then judge the disk and resume (see harness.py).

Every point must really be reached (the child prints ``kill <point>`` first);
a point that is never reached fails its test rather than passing vacuously.
Where the outcome at a point is fully determined, the exact repair is
asserted too (``expect``); elsewhere the generic checks apply.

Call ids of the child's script: ``call_1_1`` and ``call_1_2`` (one assistant
message, turn 1 step 1), ``call_2_1`` (turn 1 step 2), ``call_4_1`` (turn 2).
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest

from .conftest import selected_params
from .harness import ChildRun, judge, new_spec, run_child

pytestmark = pytest.mark.slow

STEP_CLOSED = ["step/end", "turn/end interrupted"]


@dataclass(frozen=True)
class Point:
    kind: str
    detail: str
    kill: tuple[tuple[str, Any], ...]
    expect: tuple[str, ...] | None = None
    #: seconds the child idles between its turns (default: the harness's)
    idle: float | None = None

    @property
    def key(self) -> str:
        return f"{self.kind}: {self.detail}"

    def spec_kill(self) -> dict[str, Any]:
        return dict(self.kill)


def point(
    kind: str,
    detail: str,
    expect: list[str] | None = None,
    *,
    idle: float | None = None,
    **kill: Any,
) -> Point:
    return Point(kind, detail, tuple(sorted(kill.items())), tuple(expect) if expect else None, idle)


def barrier(name: str, n: int, phase: str, expect: list[str] | None = None) -> Point:
    return point(
        "barrier",
        f"{name} #{n} {phase}",
        expect,
        at="barrier",
        barrier=name,
        n=n,
        phase=phase,
    )


FIRST_BODY_RUNNING = ["UNKNOWN call_1_1", "NOT_STARTED call_1_2", *STEP_CLOSED]

POINTS = [
    # The first checkpoint publishes the log: 3 directory fsyncs (root, project,
    # session dir), the temp file's fsync, link, the final directory fsync.
    point("materialization", "fsync 1 before", at="fsync", n=1, phase="before"),
    point("materialization", "fsync 3 after", at="fsync", n=3, phase="after"),
    point(
        "materialization", "fsync 4 before (temp file unsynced)", at="fsync", n=4, phase="before"
    ),
    point(
        "materialization", "fsync 4 after (temp synced, not linked)", at="fsync", n=4, phase="after"
    ),
    point("materialization", "link before", at="link", n=1, phase="before"),
    point("materialization", "link after (directory not synced)", at="link", n=1, phase="after"),
    point("materialization", "fsync 5 after (published)", at="fsync", n=5, phase="after"),
    # The request checkpoint before the first model call: "at request dispatch"
    # the request envelope is durable and repair closes the step (spec §10, item 51).
    # "before-fsync" is after the write: a killed process (unlike a power cut)
    # leaves written bytes in the page cache, so either outcome is correct there.
    barrier("llm", 1, "before-flush", ["turn/end interrupted"]),
    barrier("llm", 1, "before-fsync"),
    barrier("llm", 1, "after-fsync", STEP_CLOSED),
    barrier("llm", 1, "after-flush", STEP_CLOSED),
    # The tool checkpoint: before it nothing of the reply is durable; after it
    # the call is on record although the body never ran.
    barrier("tool", 1, "before-flush", STEP_CLOSED),
    barrier("tool", 1, "before-fsync"),
    barrier("tool", 1, "after-fsync", FIRST_BODY_RUNNING),
    barrier("tool", 1, "after-flush", FIRST_BODY_RUNNING),
    barrier("tool", 2, "after-flush", ["UNKNOWN call_1_2", *STEP_CLOSED]),
    # The step boundary after the first tool batch.
    barrier("pre-step", 2, "before-flush", ["UNKNOWN call_1_2", *STEP_CLOSED]),
    barrier("pre-step", 2, "before-fsync"),
    barrier("pre-step", 2, "after-fsync", ["turn/end interrupted"]),
    barrier("pre-step", 2, "after-flush", ["turn/end interrupted"]),
    # Inside a tool body: the side effect happened (it is in the ledger).
    point("tool-body", "call_1_1 running", FIRST_BODY_RUNNING, at="tool-body", n=1),
    point("tool-body", "call_1_2 running", ["UNKNOWN call_1_2", *STEP_CLOSED], at="tool-body", n=2),
    point(
        "tool-body",
        "call_4_1 running (turn 2)",
        ["UNKNOWN call_4_1", *STEP_CLOSED],
        at="tool-body",
        n=4,
    ),
    point(
        "tool-body", "call_1_1 returned, no result yet", FIRST_BODY_RUNNING, at="after-body", n=1
    ),
    # tool/result appended (buffered), the next checkpoint not reached yet.
    point("between result and flush", "after result 1", FIRST_BODY_RUNNING, at="after-result", n=1),
    point(
        "between result and flush",
        "after result 3",
        ["UNKNOWN call_2_1", *STEP_CLOSED],
        at="after-result",
        n=3,
    ),
    # The last events of a turn are followed by no checkpoint: the 200 ms window
    # writes them. Killed inside the window they are lost (the turn is repaired);
    # killed after it, the turn is durable and balanced.
    # (Timer-based: either outcome is correct, so only the generic checks apply.)
    point("batching window", "turn/end +50 ms", at="window", event="turn/end", n=1, delay=0.05),
    point(
        "batching window",
        "assistant/message +120 ms",
        at="window",
        event="assistant/message",
        n=3,
        delay=0.12,
    ),
    point(
        "batching window",
        "turn/end +450 ms (window written, idle between turns)",
        idle=0.9,
        at="window",
        event="turn/end",
        n=1,
        delay=0.45,
    ),
]

ASYNCIO_POINTS = [
    p
    for p in POINTS
    if p.key
    in {
        "barrier: llm #1 after-flush",
        "barrier: tool #1 after-fsync",
        "tool-body: call_1_1 running",
        "between result and flush: after result 1",
        "materialization: link after (directory not synced)",
    }
]


def _submit(
    request: pytest.FixtureRequest,
    pool: ThreadPoolExecutor,
    tmp_path_factory: pytest.TempPathFactory,
    sandbox: str,
    backend: str,
) -> dict[str, Future[ChildRun]]:
    runs: dict[str, Future[ChildRun]] = {}
    name = "point" if backend == "trio" else "asyncio_point"
    for chosen in selected_params(request, name):
        directory = tmp_path_factory.mktemp("kill")
        spec = new_spec(directory, kill=chosen.spec_kill(), backend=backend, sandbox=sandbox)
        if chosen.idle is not None:
            spec["idle"] = chosen.idle
        runs[chosen.key] = pool.submit(run_child, chosen.key, spec)
    return runs


@pytest.fixture(scope="module")
def trio_runs(
    request: pytest.FixtureRequest,
    crash_pool: ThreadPoolExecutor,
    tmp_path_factory: pytest.TempPathFactory,
    sandbox: str,
) -> dict[str, Future[ChildRun]]:
    return _submit(request, crash_pool, tmp_path_factory, sandbox, "trio")


@pytest.fixture(scope="module")
def asyncio_runs(
    request: pytest.FixtureRequest,
    crash_pool: ThreadPoolExecutor,
    tmp_path_factory: pytest.TempPathFactory,
    sandbox: str,
) -> dict[str, Future[ChildRun]]:
    return _submit(request, crash_pool, tmp_path_factory, sandbox, "asyncio")


def _check(run: ChildRun, chosen: Point, backend: str) -> None:
    assert run.killed, f"the child was not killed at {chosen.key}\n{run.describe()}"
    assert run.kill_point is not None, run.describe()
    problems, resumed = judge(run, backend=backend)
    assert problems == [], f"{problems}\n{run.describe()}"
    if chosen.expect is not None:
        assert resumed.closers == list(chosen.expect), run.describe()


@pytest.mark.parametrize("point", POINTS, ids=lambda p: p.key)
def test_kill_point(point: Point, trio_runs: dict[str, Future[ChildRun]]) -> None:
    _check(trio_runs[point.key].result(), point, "trio")


@pytest.mark.parametrize("asyncio_point", ASYNCIO_POINTS, ids=lambda p: p.key)
def test_kill_point_on_asyncio(
    asyncio_point: Point, asyncio_runs: dict[str, Future[ChildRun]]
) -> None:
    """The same process and checks with the child (and the resumer) on asyncio."""
    _check(asyncio_runs[asyncio_point.key].result(), asyncio_point, "asyncio")

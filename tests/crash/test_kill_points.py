"""SIGKILL at chosen points of real agent turns, then judge the store and resume (see harness.py).

Every point must really be reached (the child prints ``kill <point>`` first);
a point that is never reached fails its test rather than passing vacuously.
Where the outcome at a point is determined, the exact repair is asserted too
(``expect``: the closers, or ``no log``; a point where either of two states is
correct lists both); elsewhere the generic checks apply.

The points common to every backend (tool bodies, results, the batching window)
run on each; the write-level points are the backend's own (SQLite has none here): JSONL dies around
``os.fsync`` / ``os.link``, PostgreSQL around the events ``INSERT`` (before it,
after it inside an uncommitted transaction, while the server holds it, after
its commit -- see ``INSERT_PHASES`` in child.py). Each barrier is killed at the
same phases the backend's writes offer.

Call ids of the child's script: ``call_1_1`` and ``call_1_2`` (one assistant
message, turn 1 step 1), ``call_2_1`` (turn 1 step 2), ``call_4_1`` (turn 2).
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest

from .conftest import Stores, selected_params
from .harness import TALLY, ChildRun, judge, new_spec, run_child

pytestmark = pytest.mark.slow

STEP_CLOSED = ["step/end", "turn/end interrupted"]


#: what resume reports for a session that was never published
NO_LOG = ["no log"]


@dataclass(frozen=True)
class Point:
    kind: str
    detail: str
    kill: tuple[tuple[str, Any], ...]
    #: the outcomes any of which is correct here (closers, or ``NO_LOG``); None: not determined
    expect: tuple[tuple[str, ...], ...] | None = None
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
    either: list[list[str]] | None = None,
    idle: float | None = None,
    **kill: Any,
) -> Point:
    outcomes = either if either is not None else [expect] if expect else None
    return Point(
        kind,
        detail,
        tuple(sorted(kill.items())),
        tuple(tuple(outcome) for outcome in outcomes) if outcomes else None,
        idle,
    )


def barrier(
    name: str,
    n: int,
    phase: str,
    expect: list[str] | None = None,
    *,
    either: list[list[str]] | None = None,
) -> Point:
    return point(
        "barrier",
        f"{name} #{n} {phase}",
        expect,
        either=either,
        at="barrier",
        barrier=name,
        n=n,
        phase=phase,
    )


FIRST_BODY_RUNNING = ["UNKNOWN call_1_1", "NOT_STARTED call_1_2", *STEP_CLOSED]

#: Barriers killed at every phase: (barrier, n, the repair if its batch is lost,
#: the repair if its batch is stored).
#: - The request checkpoint before the first model call: "at request dispatch"
#:   the request envelope is durable and repair closes the step.
#: - The tool checkpoint: before it nothing of the reply is durable; after it the
#:   call is on record although the body never ran.
#: - The step boundary after the first tool batch.
BARRIERS: list[tuple[str, int, list[str], list[str]]] = [
    ("llm", 1, ["turn/end interrupted"], STEP_CLOSED),
    ("tool", 1, STEP_CLOSED, FIRST_BODY_RUNNING),
    ("pre-step", 2, ["UNKNOWN call_1_2", *STEP_CLOSED], ["turn/end interrupted"]),
]


def barrier_points(
    lost: tuple[str, ...], either: tuple[str, ...], kept: tuple[str, ...]
) -> list[Point]:
    """Each barrier at ``before-flush``, the backend's write phases, and ``after-flush``."""
    out: list[Point] = []
    for name, n, if_lost, if_kept in BARRIERS:
        out.append(barrier(name, n, "before-flush", if_lost))
        out += [barrier(name, n, phase, if_lost) for phase in lost]
        out += [barrier(name, n, phase, either=[if_lost, if_kept]) for phase in either]
        out += [barrier(name, n, phase, if_kept) for phase in kept]
        out.append(barrier(name, n, "after-flush", if_kept))
    out.append(barrier("tool", 2, "after-flush", ["UNKNOWN call_1_2", *STEP_CLOSED]))
    return out


COMMON_POINTS = [
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

JSONL_POINTS = [
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
    # "before-fsync" is after the write: a killed process (unlike a power cut)
    # leaves written bytes in the page cache, so either outcome is correct there.
    *barrier_points(lost=(), either=("before-fsync",), kept=("after-fsync",)),
    *COMMON_POINTS,
]

POSTGRES_POINTS = [
    # The first write (the pre-step #1 checkpoint) publishes the session: one
    # statement inserts the header and the first batch, turn/start. Until it
    # commits there is no session at all; after, the open turn is closed.
    point(
        "materialization", "insert 1 before-insert", NO_LOG, at="insert", n=1, phase="before-insert"
    ),
    point(
        "materialization",
        "insert 1 uncommitted (BEGIN, INSERT, no COMMIT)",
        NO_LOG,
        at="insert",
        n=1,
        phase="uncommitted",
    ),
    point(
        "materialization",
        "insert 1 in-flight",
        either=[NO_LOG, ["turn/end interrupted"]],
        at="insert",
        n=1,
        phase="in-flight",
    ),
    point(
        "materialization",
        "insert 1 after-commit (published)",
        ["turn/end interrupted"],
        at="insert",
        n=1,
        phase="after-commit",
    ),
    # An uncommitted batch is lost, a committed one kept; a request the server
    # still holds when its client dies is finished or not: either is correct
    # (child.py, INSERT_PHASES, says which happens where; the tally counts it).
    *barrier_points(
        lost=("before-insert", "uncommitted"), either=("in-flight",), kept=("after-commit",)
    ),
    *COMMON_POINTS,
]

#: SQLite's writes happen inside the library (no ``os.fsync`` to die around), so its
#: write-level points are tests/sqlite's (a process killed inside its transaction); here
#: each barrier is killed just before and just after its flush.
SQLITE_POINTS = [*barrier_points(lost=(), either=(), kept=()), *COMMON_POINTS]

#: the subset also run with the child (and the resumer) on asyncio
ASYNCIO_KEYS = {
    "jsonl": {
        "barrier: llm #1 after-flush",
        "barrier: tool #1 after-fsync",
        "tool-body: call_1_1 running",
        "between result and flush: after result 1",
        "materialization: link after (directory not synced)",
    },
    "sqlite": {
        "barrier: llm #1 after-flush",
        "barrier: tool #1 before-flush",
        "tool-body: call_1_1 running",
        "between result and flush: after result 1",
    },
    "postgres": {
        "barrier: llm #1 after-flush",
        "barrier: tool #1 in-flight",
        "tool-body: call_1_1 running",
        "between result and flush: after result 1",
        "materialization: insert 1 uncommitted (BEGIN, INSERT, no COMMIT)",
    },
}


@dataclass(frozen=True)
class Case:
    """One kill: a point, on a persistence backend, with the child on an async backend."""

    store: str
    backend: str
    point: Point

    @property
    def key(self) -> str:
        return f"{self.store}-{self.backend}-{self.point.key}"


def _cases() -> list[Case]:
    out: list[Case] = []
    for store, points in (
        ("jsonl", JSONL_POINTS),
        ("sqlite", SQLITE_POINTS),
        ("postgres", POSTGRES_POINTS),
    ):
        out += [Case(store, "trio", chosen) for chosen in points]
        out += [
            Case(store, "asyncio", chosen) for chosen in points if chosen.key in ASYNCIO_KEYS[store]
        ]
    return out


CASES = _cases()


@pytest.fixture(scope="module")
def runs(
    request: pytest.FixtureRequest,
    crash_pool: ThreadPoolExecutor,
    crash_stores: Stores,
    tmp_path_factory: pytest.TempPathFactory,
    sandbox: str,
) -> dict[str, Future[ChildRun]]:
    """Submit every selected case (whose store can run here) to the pool."""
    out: dict[str, Future[ChildRun]] = {}
    for case in selected_params(request, "case"):
        factory = crash_stores.get(case.store)
        if factory is None:
            continue
        directory = tmp_path_factory.mktemp("kill")
        spec = new_spec(
            directory,
            factory,
            kill=case.point.spec_kill(),
            backend=case.backend,
            sandbox=sandbox,
        )
        if case.point.idle is not None:
            spec["idle"] = case.point.idle
        out[case.key] = crash_pool.submit(run_child, case.point.key, spec, factory)
    return out


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.key)
def test_kill_point(case: Case, runs: dict[str, Future[ChildRun]], crash_stores: Stores) -> None:
    crash_stores.need(case.store)
    run = runs[case.key].result()
    chosen = case.point
    assert run.killed, f"the child was not killed at {chosen.key}\n{run.describe()}"
    assert run.kill_point is not None, run.describe()
    assert "never saw" not in run.kill_point, run.describe()
    problems, resumed = judge(run, backend=case.backend)
    assert problems == [], f"{problems}\n{run.describe()}"
    if chosen.expect is not None:
        got = tuple(NO_LOG) if resumed.no_log else tuple(resumed.closers)
        assert got in chosen.expect, f"{got} not in {chosen.expect}\n{run.describe()}"
        if len(chosen.expect) == 2:  # (lost, stored): count which one this run saw
            kept = "stored" if got == chosen.expect[1] else "lost"
            TALLY[case.store].either[f"{case.backend} {chosen.key}: batch {kept}"] += 1

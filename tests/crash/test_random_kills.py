"""SIGKILL from the parent at random moments of the same two turns (seeded, many runs).

Each persistence backend gets its own runs: ``DSH_CRASH_RUNS`` on JSONL
(default 50, what CI runs) and ``DSH_CRASH_RUNS_POSTGRES`` on PostgreSQL
(default 20: the write-level kill points already cover its commit protocol,
and this keeps the suite's time reasonable). ``DSH_CRASH_SEED`` sets the seed
(default 6), so a failing run can be replayed: run ``i`` sleeps
``Random(seed * 100003 + i).uniform(0, 1.15 * span)`` after the child's
``ready``, where ``span`` is the ready-to-done time of a clean run on the same
backend, measured first. A run the kill arrives too late for finishes cleanly;
it is judged the same way (its log must be balanced).
"""

from __future__ import annotations

import os
import random
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from .conftest import KINDS, Stores, selected_params
from .harness import ChildRun, judge, new_spec, run_child

pytestmark = pytest.mark.slow

RUNS = {
    "jsonl": int(os.environ.get("DSH_CRASH_RUNS", "50")),
    "sqlite": int(os.environ.get("DSH_CRASH_RUNS_SQLITE", "20")),
    "postgres": int(os.environ.get("DSH_CRASH_RUNS_POSTGRES", "20")),
}
SEED = int(os.environ.get("DSH_CRASH_SEED", "6"))
EXPECTED_LEDGER = ["call_1_1", "call_1_2", "call_2_1", "call_4_1"]


@pytest.fixture(scope="module")
def clean_runs(
    request: pytest.FixtureRequest,
    crash_pool: ThreadPoolExecutor,
    crash_stores: Stores,
    tmp_path_factory: pytest.TempPathFactory,
    sandbox: str,
) -> dict[str, Future[ChildRun]]:
    """A clean run per backend that a selected test needs (both tests below use it)."""
    kinds = {kind for kind in selected_params(request, "store")}
    kinds |= {kind for kind, _index in selected_params(request, "case")}
    out: dict[str, Future[ChildRun]] = {}
    for kind in KINDS:
        factory = crash_stores.get(kind)
        if kind in kinds and factory is not None:
            directory = tmp_path_factory.mktemp("clean")
            spec = new_spec(directory, factory, sandbox=sandbox)
            out[kind] = crash_pool.submit(run_child, "clean: no kill", spec, factory)
    return out


@pytest.mark.parametrize("store", KINDS)
def test_a_clean_run_is_balanced_and_resumable(
    store: str, clean_runs: dict[str, Future[ChildRun]], crash_stores: Stores, sandbox: str
) -> None:
    """The baseline: both turns complete, every call ran (confined) and is recorded."""
    crash_stores.need(store)
    run = clean_runs[store].result()
    assert run.finished and run.returncode == 0, run.describe()
    assert "turn 1 completed" in run.lines and "turn 2 completed" in run.lines
    assert run.ledger() == EXPECTED_LEDGER, run.describe()
    if sandbox == "workspace-write":  # the calls really ran confined
        (line,) = [line for line in run.lines if line.startswith("sandbox ")]
        assert line.split()[2] in ("bubblewrap", "landlock"), line
    assert {barrier for _seq, _kind, barrier in run.flushed} >= {"pre-step", "llm", "tool"}
    problems, resumed = judge(run)
    assert problems == [], problems
    assert resumed.closers == []


def delay_for(index: int, span: float) -> float:
    return random.Random(SEED * 100003 + index).uniform(0.0, 1.15 * span)


@pytest.fixture(scope="module")
def random_runs(
    request: pytest.FixtureRequest,
    crash_pool: ThreadPoolExecutor,
    crash_stores: Stores,
    tmp_path_factory: pytest.TempPathFactory,
    sandbox: str,
    clean_runs: dict[str, Future[ChildRun]],
) -> dict[tuple[str, int], Future[ChildRun]]:
    runs: dict[tuple[str, int], Future[ChildRun]] = {}
    for kind, index in selected_params(request, "case"):
        factory = crash_stores.get(kind)
        if factory is None:
            continue
        clean = clean_runs[kind].result()
        assert clean.span is not None, clean.describe()
        directory: Path = tmp_path_factory.mktemp("random")
        delay = delay_for(index, clean.span)
        label = f"random: #{index} at +{delay * 1000:.0f} ms"
        spec = new_spec(directory, factory, sandbox=sandbox)
        runs[kind, index] = crash_pool.submit(run_child, label, spec, factory, kill_after=delay)
    return runs


CASES = [(kind, index) for kind in KINDS for index in range(RUNS[kind])]


@pytest.mark.parametrize("case", CASES, ids=lambda case: f"{case[0]}-{case[1]}")
def test_random_kill(
    case: tuple[str, int],
    random_runs: dict[tuple[str, int], Future[ChildRun]],
    crash_stores: Stores,
) -> None:
    crash_stores.need(case[0])
    run = random_runs[case].result()
    assert run.killed or run.finished, run.describe()
    problems, _resumed = judge(run)
    assert problems == [], f"{problems}\n{run.describe()}"

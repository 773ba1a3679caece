"""SIGKILL from the parent at random moments of the same two turns (seeded, many runs).

``DSH_CRASH_RUNS`` sets the number of runs (default 50, what CI runs) and
``DSH_CRASH_SEED`` the seed (default 6), so a failing run can be replayed:
run ``i`` sleeps ``Random(seed * 100003 + i).uniform(0, 1.15 * span)`` after
the child's ``ready``, where ``span`` is the ready-to-done time of a clean run
measured first. A run the kill arrives too late for finishes cleanly; it is
judged the same way (its log must be balanced).
"""

from __future__ import annotations

import os
import random
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from .conftest import selected_params
from .harness import ChildRun, judge, new_spec, run_child

pytestmark = pytest.mark.slow

RUNS = int(os.environ.get("DSH_CRASH_RUNS", "50"))
SEED = int(os.environ.get("DSH_CRASH_SEED", "6"))
EXPECTED_LEDGER = ["call_1_1", "call_1_2", "call_2_1", "call_4_1"]


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory: pytest.TempPathFactory, sandbox: str) -> ChildRun:
    directory = tmp_path_factory.mktemp("clean")
    return run_child("clean: no kill", new_spec(directory, sandbox=sandbox))


def test_a_clean_run_is_balanced_and_resumable(clean_run: ChildRun, sandbox: str) -> None:
    """The baseline: both turns complete, every call ran (confined) and is recorded."""
    run = clean_run
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
    tmp_path_factory: pytest.TempPathFactory,
    sandbox: str,
    clean_run: ChildRun,
) -> dict[int, Future[ChildRun]]:
    assert clean_run.span is not None, clean_run.describe()
    runs: dict[int, Future[ChildRun]] = {}
    for index in selected_params(request, "index"):
        directory: Path = tmp_path_factory.mktemp("random")
        delay = delay_for(index, clean_run.span)
        label = f"random: #{index} at +{delay * 1000:.0f} ms"
        spec = new_spec(directory, sandbox=sandbox)
        runs[index] = crash_pool.submit(run_child, label, spec, kill_after=delay)
    return runs


@pytest.mark.parametrize("index", range(RUNS))
def test_random_kill(index: int, random_runs: dict[int, Future[ChildRun]]) -> None:
    run = random_runs[index].result()
    assert run.killed or run.finished, run.describe()
    problems, _resumed = judge(run)
    assert problems == [], f"{problems}\n{run.describe()}"

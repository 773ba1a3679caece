"""The suite can fail: without ``session-checkpoint-policy`` it catches the lost record.

The same child, the same kill point (inside the first tool body, as soon as its
call id is in the ledger), the composition minus the policy row, on each
persistence backend. Persistence alone only writes when its window fires, so
the command runs before its ``tool/call`` is stored: the ledger then holds a
side effect the log has no record of, and the harness must say so.

With the real 200 ms window that is a race the window sometimes wins (a slow
sandbox start on a loaded machine lets it fire between the append and the
command). The child is given a 60 s window instead, so the outcome does not
depend on the machine: only the policy's barrier could store the call in time.
"""

from __future__ import annotations

import pytest

from .conftest import KINDS, Stores
from .harness import check_crash, new_spec, read_log, run_child

pytestmark = pytest.mark.slow

#: seconds: longer than any run of the child, so the window never fires in it
WINDOW = 60.0


@pytest.mark.parametrize("store", KINDS)
def test_without_the_policy_a_side_effect_outruns_its_record(
    store: str, crash_stores: Stores, tmp_path_factory: pytest.TempPathFactory, sandbox: str
) -> None:
    factory = crash_stores.need(store)
    directory = tmp_path_factory.mktemp("nopolicy")
    kill = {"at": "tool-body", "n": 1}
    spec = new_spec(directory, factory, policy=False, sandbox=sandbox, kill=kill)
    spec["window"] = WINDOW
    run = run_child("without policy", spec, factory)
    assert run.killed and run.kill_point is not None, run.describe()
    assert run.ledger() == ["call_1_1"], run.describe()
    assert run.flushed == [], "nothing calls the barrier without the policy"
    settled = factory.settle(run.store)
    assert settled is None, settled
    problems = check_crash(run, read_log(factory, run.store))
    assert any("ledger entry call_1_1 has no durable tool/call" in p for p in problems), problems

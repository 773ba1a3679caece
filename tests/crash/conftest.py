"""Fixtures of the crash suite: the sandbox mode, a small pool of child runs, the closing tally.

Children run ``DSH_CRASH_JOBS`` at a time (default 2, the CI machine's cores);
kill points are instrumented inside each child, so overlapping runs do not
change where a child dies, only how long the suite takes. Each module submits
only the runs its *selected* tests need (``-k`` works as expected).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from .harness import TALLY, sandbox_mode


@pytest.fixture(scope="session")
def crash_pool() -> Iterator[ThreadPoolExecutor]:
    jobs = int(os.environ.get("DSH_CRASH_JOBS", "2"))
    with ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="crash-child") as pool:
        yield pool


@pytest.fixture(scope="session")
def sandbox() -> str:
    """``workspace-write`` (bubblewrap or Landlock confines bash) when a backend works here."""
    return sandbox_mode()


def selected_params(request: pytest.FixtureRequest, name: str) -> list[Any]:
    """The values of parameter ``name`` among the selected tests of the requesting module."""
    out: list[Any] = []
    for item in request.session.items:
        callspec = getattr(item, "callspec", None)
        if getattr(item, "module", None) is request.module and callspec is not None:
            if name in callspec.params and callspec.params[name] not in out:
                out.append(callspec.params[name])
    return out


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not TALLY.runs:
        return
    summary = TALLY.as_json()
    terminalreporter.write_sep("-", "crash suite")
    terminalreporter.write_line(json.dumps(summary, indent=2))
    report = os.environ.get("DSH_CRASH_REPORT")
    if report:
        with open(report, "w") as out:
            json.dump(summary, out, indent=2)
            out.write("\n")

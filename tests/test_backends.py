"""Guard of the anyio-backend rule in tests/conftest.py.

Pure-logic async tests run once (on trio); the core paths, whose behaviour differs per event
loop, must keep running on trio *and* asyncio (D2). This collects the core modules in
a fresh pytest process and checks each async test there is collected once per backend, and
that an unmarked module's tests are collected once.
"""

from __future__ import annotations

import functools
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: the core paths: the agent loop, cancellation, HTTP, subprocesses, timeouts, write-behind
CORE = (
    "tests/agent/test_cancel.py",
    "tests/agent/test_loop.py",
    "tests/llm/test_openai_http.py",
    "tests/persistence/test_write_behind.py",
    "tests/tools/test_runtime.py",
    "tests/tools/test_timeout_policy.py",
    "tests/sandbox/test_tool_processes.py",
    "tests/front/test_front_agent.py",
    "tests/checkpoint/test_loop.py",
)
#: pure logic: one run is enough
SINGLE = ("tests/host/test_loader.py", "tests/session/test_store.py")


@functools.cache
def _collected() -> tuple[str, ...]:
    """The test ids of CORE and SINGLE, collected once by a fresh pytest process."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:randomly",
         *CORE, *SINGLE],
        capture_output=True, text=True, cwd=REPO, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return tuple(line for line in done.stdout.splitlines() if "::" in line)


def _by_backend(paths: tuple[str, ...]) -> dict[str, set[str]]:
    """Each test id of ``paths`` without its backend part -> the backends it was collected on."""
    out: dict[str, set[str]] = defaultdict(set)
    for nodeid in _collected():
        if not nodeid.startswith(paths):
            continue
        match = re.search(r"(?<=[\[-])(trio|asyncio)(?=[\]-])", nodeid)
        if match:
            out[nodeid[: match.start()] + "*" + nodeid[match.end() :]].add(match.group(1))
    return out


def test_the_core_paths_run_on_both_backends() -> None:
    backends = _by_backend(CORE)
    for path in CORE:
        tests = {name: found for name, found in backends.items() if name.startswith(path)}
        assert tests, f"no async test collected from {path}"
        missing = {name: found for name, found in tests.items() if found != {"trio", "asyncio"}}
        assert not missing, f"{path}: collected on one backend only: {sorted(missing)[:5]}"


def test_pure_logic_async_tests_run_once_on_trio() -> None:
    backends = _by_backend(SINGLE)
    assert backends
    assert all(found == {"trio"} for found in backends.values()), backends

"""Confined ``bash`` calls live exactly as long as they should (issue 14, item 2).

``bwrap --die-with-parent`` (and the Landlock launcher's parent-death signal) is tied by the
kernel to the *thread* that forked the runner. Under trio that used to be a worker thread trio
retires after ~10 s idle, so every confined command longer than that was SIGKILLed. These tests
run a 25 s command through the real ``bash`` tool on both sandbox backends and both event loops,
and SIGKILL a real harness process to prove its confined children still die with it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest

from dsh_host import CancelToken, Row, open_host
from dsh_host._tools import ToolExecutionInput, ToolExecutionResult

from .sandbox_harness import BACKENDS, Scene, eventually, linux_only, provider_for, sleepers

pytestmark = [linux_only, pytest.mark.slow]

CHILD = Path(__file__).with_name("harness_child.py")
LONG_S = 25


async def _bash(backend: str, workspace: Path, command: str) -> ToolExecutionResult:
    provider_for(backend)  # fail (not skip) when the backend is unusable here
    rows = [
        Row(name="tools"),
        Row(name="sandbox-local", config={"backend": backend}),
        Row(
            name="builtin-tools", config={"workspace": str(workspace), "sandbox": "workspace-write"}
        ),
    ]
    async with open_host(rows) as host:
        result: ToolExecutionResult = await host.ctx.tools.execute(
            ToolExecutionInput(
                call_id=f"call-long-{backend}",
                name="bash",
                arguments={
                    "command": command,
                    "description": "sleep a while",
                    "timeoutMs": 120_000,
                },
                signal=CancelToken(),
            )
        )
        return result


def test_a_25s_command_completes_on_both_sandbox_backends_and_event_loops(scene: Scene) -> None:
    """Both sandbox backends, on both event loops, all at once: trio runs in this thread as
    usual, asyncio in a thread of its own that lives for the whole test (the forking thread
    that matters is the loop's worker, not the caller), so the suite waits 25 s, not 50."""
    results: dict[tuple[str, str], ToolExecutionResult] = {}

    async def both_sandboxes(loop: str) -> None:
        async def one(backend: str) -> None:
            command = f"sleep {LONG_S}; echo slept"
            results[loop, backend] = await _bash(backend, scene.ws, command)

        async with anyio.create_task_group() as tg:
            for backend in BACKENDS:
                tg.start_soon(one, backend)

    failures: list[BaseException] = []

    def asyncio_side() -> None:
        try:
            anyio.run(both_sandboxes, "asyncio", backend="asyncio")
        except BaseException as exc:  # reported below, in the test's own thread
            failures.append(exc)

    other = threading.Thread(target=asyncio_side, name="asyncio-loop")
    other.start()
    try:
        anyio.run(both_sandboxes, "trio", backend="trio")
    finally:
        other.join(timeout=300)
    assert not other.is_alive() and not failures, failures
    assert sorted(results) == sorted((loop, b) for loop in ("trio", "asyncio") for b in BACKENDS)
    for key, result in results.items():
        value: Any = result.value
        assert value is not None, (key, result)
        assert value["signal"] is None, (key, value)
        assert value["exitCode"] == 0, (key, value)
        assert value["timedOut"] is False
        assert value["stdout"]["text"] == "slept\n", (key, value)
        assert value["sandbox"]["mode"] == "workspace-write"


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_sigkilled_harness_takes_its_confined_children_with_it(
    scene: Scene, backend: str
) -> None:
    provider_for(backend)
    marker = f"1000.{os.getpid()}{abs(hash(scene.token)) % 10**6}"
    # A grandchild that leaves the call's process group and session, too.
    command = f"setsid sleep {marker} & sleep {marker}; wait"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.Popen(
        [sys.executable, str(CHILD), backend, "workspace-write", str(scene.ws), command],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=scene.ws,
    )  # fmt: skip
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "started\n", child.stderr
        assert eventually(lambda: len(sleepers(marker)) >= 2), "the confined sleeps never started"
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=60) == -signal.SIGKILL
        assert eventually(lambda: not sleepers(marker)), (
            f"confined processes outlived the harness: {sleepers(marker)}"
        )
    finally:
        for pid in sleepers(marker):  # only processes this test started
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            child.kill()
        child.wait()
        for stream in (child.stdout, child.stderr):
            if stream is not None:
                stream.close()

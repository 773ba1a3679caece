"""``bash`` output keeps its head (issue 42) and spill files have a per-run budget (issue 43).

A 300,000-line output used to keep its tail only (bash's own cut), and the generic bound then cut
that again: the first lines, where a command prints its own errors and headers, were gone. Now
there is one bound, head + tail, with the spill file holding every line; the generic bound has
nothing left to cut. Run on both sandbox backends in both confined modes and unconfined.

A dozen noisy calls used to write ~350 MiB of spill files; now the row's ``spillBudgetBytes``
bounds them all together, and the model reads when an output could not be saved whole.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from dsh_host import Row, open_host
from dsh_host._loader import PluginHost
from dsh_host._tools import ToolExecutionResult

from .tools_helpers import call, text_of

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]

GUARD_S = 120  # hang guard only
LINES = 300_000
EVERY_LINE = "".join(f"line {n}\n" for n in range(1, LINES + 1))


def slurp(path: str) -> str:
    return Path(path).read_text()


def size_of(path: str | Path) -> int:
    return Path(path).stat().st_size


@contextlib.contextmanager
def persistent_workspace() -> Iterator[Path]:
    """Off /tmp: Landlock grants host /tmp under workspace-write."""
    base = Path(tempfile.mkdtemp(prefix="dsh-bound-", dir="/var/tmp")).resolve()
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


@contextlib.asynccontextmanager
async def bash_host(ws: Path, backend: str | None, **config: Any) -> AsyncIterator[PluginHost]:
    rows = [Row(name="tools")]
    if backend is not None:
        rows.append(Row(name="sandbox-local", config={"backend": backend}))
    rows.append(Row(name="builtin-tools", config={"workspace": str(ws), **config}))
    async with open_host(rows) as host:
        yield host


async def bash(host: PluginHost, command: str, call_id: str = "call-1") -> ToolExecutionResult:
    with anyio.fail_after(GUARD_S):
        result: ToolExecutionResult = await host.ctx.tools.execute(
            call(
                name="bash",
                arguments={"command": command, "description": "print many lines"},
                call_id=call_id,
            )
        )
    return result


CASES = [
    (None, "danger-full-access"),
    ("bubblewrap", "read-only"),
    ("bubblewrap", "workspace-write"),
    ("landlock", "read-only"),
    ("landlock", "workspace-write"),
]


@pytest.mark.parametrize(("backend", "mode"), CASES, ids=[f"{b}-{m}" for b, m in CASES])
async def test_a_300k_line_output_shows_its_first_and_last_lines_and_spills_every_line(
    backend: str | None, mode: str
) -> None:
    with persistent_workspace() as ws:
        async with bash_host(ws, backend, sandbox=mode) as host:
            result = await bash(host, f"seq -f 'line %.0f' 1 {LINES}")
            stdout = result.value["stdout"]
            spilled = slurp(stdout["spillPath"])
    seen = text_of(result)
    lines = seen.splitlines()
    assert lines[:3] == ["line 1", "line 2", "line 3"], seen[:200]
    assert f"line {LINES}" in lines[-3:], seen[-300:]
    assert f"[output truncated; full output: {stdout['spillPath']}]" == lines[-1]
    assert f"[... {stdout['omittedBytes']} bytes omitted ...]" in lines
    # one bound: the result fits maxInlineBytes (50,000 by default), so the generic bound did not
    # cut it again (its notice would say "Full formatted result stored at")
    assert len(seen.encode()) <= 50_000
    assert "Full formatted result stored at" not in seen
    # what the model sees is the head and the tail of the real output, nothing else
    head, _marker, tail = stdout["text"].partition(f"\n[... {stdout['omittedBytes']} bytes")
    tail = tail.split("\n", 1)[1]
    assert EVERY_LINE.startswith(head + "\n") and EVERY_LINE.endswith(tail)
    assert len(head) + 1 + len(tail) + stdout["omittedBytes"] == len(EVERY_LINE)
    assert spilled == EVERY_LINE  # the spill holds every line


async def test_stderr_keeps_its_head_too(tmp_path: Path) -> None:
    async with bash_host(tmp_path, None, sandbox="danger-full-access") as host:
        result = await bash(host, "echo 'fatal: first error' >&2; seq 1 100000 >&2")
        stderr = result.value["stderr"]
        spilled = slurp(stderr["spillPath"])
    assert stderr["text"].startswith("fatal: first error\n1\n2\n")
    assert stderr["text"].endswith("99999\n100000\n")
    assert spilled.startswith("fatal: first error\n1\n") and spilled.endswith("\n100000\n")


NOISY = "head -c 80000 /dev/zero | tr '\\0' 'x'"


async def test_the_spill_budget_bounds_all_spill_files_of_a_run(tmp_path: Path) -> None:
    async with bash_host(
        tmp_path, None, sandbox="danger-full-access", spillBudgetBytes=100_000
    ) as host:
        results = [await bash(host, NOISY, call_id=f"c{n}") for n in range(1, 4)]
        area = Path(results[0].value["stdout"]["spillPath"]).parent
        sizes = sorted(size_of(area / name) for name in os.listdir(area))
        second = slurp(results[1].value["stdout"]["spillPath"])
    first, cut, unsaved = (r.value["stdout"] for r in results)
    assert "spillBudgetSpent" not in first and "spillCapped" not in first
    assert cut["spillBudgetSpent"] is True and cut["spillCapped"] is True
    assert second == "x" * 20_000 + (
        "\n[dsh: this run's spill budget of 100000 bytes is used up; the rest of this output "
        "was discarded]\n"
    )
    assert "this run's spill budget ran out" in text_of(results[1])
    assert unsaved["spillBudgetSpent"] is True and "spillPath" not in unsaved
    assert text_of(results[2]).endswith(
        "[output truncated; not saved: this run's spill budget is used up]"
    )
    assert sum(sizes) <= 100_000 + 200  # the budget, plus one marker
    # every call still shows its head and tail
    assert all(r.value["stdout"]["text"].startswith("xxxx") for r in results)


async def test_control_without_a_budget_every_output_is_spilled_whole(tmp_path: Path) -> None:
    async with bash_host(
        tmp_path, None, sandbox="danger-full-access", spillBudgetBytes=None
    ) as host:
        results = [await bash(host, NOISY, call_id=f"c{n}") for n in range(1, 4)]
        sizes = [size_of(r.value["stdout"]["spillPath"]) for r in results]
    assert sizes == [80_000] * 3

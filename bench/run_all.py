"""Run every benchmark script in ``bench/`` one after the other and summarize.

``python bench/run_all.py --small`` (what ``nox -s bench`` runs) gives each
script its small size. A script takes ``--small`` if its ``--help`` lists it;
otherwise the small flags it does have are taken from ``SMALL_FALLBACK``, and
a script with neither runs at its defaults (the summary says so). Scripts
that list ``--results-dir`` in their help get ``--results-dir`` when one is
given here. Each script prints its own tables (streamed through as it runs)
and writes its own JSON; this runner adds ``run_all.json`` with the exit
code, the flags used and the wall time of every script.

Every script runs in its own process (a fresh interpreter, no state shared
between benchmarks) with ``bench/`` as its directory on ``sys.path``. A failing
script does not stop the others; the exit code is 1 if any failed. A script
that cannot even start because an optional dependency is missing
(``ModuleNotFoundError``, e.g. ``psycopg`` of the ``postgres`` extra) is
reported as skipped, not failed, unless ``--strict``.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Final

from _common import BENCH_DIR, REPO_DIR, RESULTS_DIR, print_table, write_result

#: Small-size flags of scripts that have no ``--small`` (checked against their --help).
SMALL_FALLBACK: Final[dict[str, list[str]]] = {
    "session_append": ["--events", "12000", "--repeats", "2"],
    "postgres_vs_jsonl": ["--turns", "10", "--repeats", "3", "--single-flushes", "30"],
}


def discover() -> list[str]:
    """Benchmark names: every ``bench/*.py`` except helpers (``_*``) and this runner."""
    return sorted(
        p.stem for p in BENCH_DIR.glob("*.py") if not p.stem.startswith("_") and p.stem != "run_all"
    )


def script_help(name: str) -> tuple[str | None, str]:
    """The script's ``--help`` text, or (None, why) when it cannot even print that."""
    try:
        done = subprocess.run(
            [sys.executable, str(BENCH_DIR / f"{name}.py"), "--help"],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO_DIR,
        )
    except subprocess.TimeoutExpired:
        return None, "--help timed out"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return None, last
    return done.stdout, ""


def flags_for(
    name: str, help_text: str, small: bool, results_dir: Path | None
) -> tuple[list[str], str, bool]:
    """(flags, note, redirect) for one script; ``redirect``: move its JSON afterwards."""
    flags: list[str] = []
    note = ""
    redirect = False
    if small:
        if "--small" in help_text:
            flags.append("--small")
        elif name in SMALL_FALLBACK:
            fallback = SMALL_FALLBACK[name]
            missing = [f for f in fallback if f.startswith("--") and f not in help_text]
            if missing:
                note = f"small flags {missing} not accepted any more: ran at defaults"
            else:
                flags.extend(fallback)
                note = "no --small: ran with its own size flags"
        else:
            note = "no --small and no known size flags: ran at defaults"
    if results_dir is not None:
        if "--results-dir" in help_text:
            flags.extend(["--results-dir", str(results_dir)])
        else:
            redirect = True
            note = (note + "; " if note else "") + "no --results-dir: its JSON was moved there"
    return flags, note, redirect


def run_redirected(
    name: str, flags: list[str], timeout: float, results_dir: Path
) -> tuple[int | str, float]:
    """Run a script that always writes ``bench/results/<name>.json``; move that output to
    ``results_dir`` and put back whatever was there before (a committed full-size result
    must not be replaced by a smoke run)."""
    own = RESULTS_DIR / f"{name}.json"
    saved = own.read_bytes() if own.exists() else None
    try:
        code, seconds = run_one(name, flags, timeout)
        if own.exists() and own.resolve() != (results_dir / own.name).resolve():
            results_dir.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(own, results_dir / own.name)
    finally:
        if saved is not None:
            own.write_bytes(saved)
        elif own.resolve() != (results_dir / own.name).resolve():
            own.unlink(missing_ok=True)
    return code, seconds


def run_one(name: str, flags: list[str], timeout: float) -> tuple[int | str, float]:
    print(f"\n{'=' * 78}\n== {name} {' '.join(flags)}\n{'=' * 78}", flush=True)
    start = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, str(BENCH_DIR / f"{name}.py"), *flags],
            cwd=REPO_DIR,
            timeout=timeout,
        )
        code: int | str = done.returncode
    except subprocess.TimeoutExpired:
        code = f"timeout after {timeout:.0f} s"
    return code, time.perf_counter() - start


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--small", action="store_true", help="small N for every script")
    p.add_argument("--only", nargs="+", metavar="NAME", help="run only these benchmarks")
    p.add_argument("--skip", nargs="+", metavar="NAME", default=[], help="skip these")
    p.add_argument(
        "--results-dir",
        type=Path,
        default=None,
        help=f"passed to scripts that accept it; run_all.json goes there (default {RESULTS_DIR})",
    )
    p.add_argument("--timeout", type=float, help="seconds per script (default 300 small, 900)")
    p.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    p.add_argument(
        "--strict",
        action="store_true",
        help="a script that cannot import an optional dependency fails instead of being skipped",
    )
    args = p.parse_args()
    names = discover()
    if args.list:
        print("\n".join(names))
        return 0
    if args.only:
        unknown = sorted(set(args.only) - set(names))
        if unknown:
            p.error(f"unknown benchmark(s) {unknown}; known: {names}")
        names = [n for n in names if n in args.only]
    names = [n for n in names if n not in args.skip]
    timeout = args.timeout or (300.0 if args.small else 900.0)

    rows: list[list[Any]] = []
    report: list[dict[str, Any]] = []
    for name in names:
        help_text, why = script_help(name)
        if help_text is None:
            # A missing optional dependency (e.g. psycopg for postgres_vs_jsonl, the
            # `postgres` extra) skips the script; anything else is a failure.
            skipped = why.startswith("ModuleNotFoundError") and not args.strict
            status = "skipped" if skipped else "FAILED"
            note = f"cannot start: {why}" + ("; install the extra it needs" if skipped else "")
            rows.append([name, "-", status, 0.0, note])
            report.append(
                {"name": name, "flags": [], "exit": status, "seconds": 0, "note": note}
            )
            print(f"\n== {name}: {note}", flush=True)
            continue
        flags, note, redirect = flags_for(name, help_text, args.small, args.results_dir)
        if redirect and args.results_dir is not None:
            code, seconds = run_redirected(name, flags, timeout, args.results_dir)
        else:
            code, seconds = run_one(name, flags, timeout)
        status = "ok" if code == 0 else f"FAILED ({code})"
        rows.append([name, " ".join(flags) or "(defaults)", status, round(seconds, 1), note])
        report.append(
            {"name": name, "flags": flags, "exit": code, "seconds": round(seconds, 2), "note": note}
        )
    print_table(
        "run_all summary", ["benchmark", "flags", "result", "seconds", "note"], rows
    )
    write_result(
        "run_all",
        {"small": args.small, "scripts": report},
        args.results_dir or RESULTS_DIR,
    )
    return 0 if all(r["exit"] in (0, "skipped") for r in report) else 1


if __name__ == "__main__":
    sys.exit(main())

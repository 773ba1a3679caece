"""Benchmark: how long ``dsh`` takes to start, per command, against ``python -c pass``.

A person types ``dsh --help`` or ``dsh sessions list`` and waits; most of that
wait is importing what the command does not need. Each contender is a fresh
process of this interpreter (``python -m dsh_host ...``, stdin ``/dev/null``,
stdout a pipe), timed wall-clock from spawn to exit. The floor is the same
interpreter starting and doing nothing (``python -c pass``, with this venv's
site packages, so the editable install's ``.pth`` cost is in the floor too).
Bytecode is cached as an installed package's is (``PYTHONDONTWRITEBYTECODE``
is dropped for the children; one untimed warm-up run writes the caches).

Rounds interleave every contender (floor, help, list, ... then again) so the
machine's load hits all alike; the figure is the ratio of medians. Targets
(issue 25): ``dsh --help`` <= 5x, ``dsh sessions list`` <= 8x the floor. The
``sessions list`` case lists a small session root (3 sessions, made once with
``dsh run`` on the scripted model before timing). ``-X importtime`` of each
command is summarised (the heaviest top-level imports) to say where the time
goes.

Writes ``bench/results/startup.json``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Final

from _common import (
    REPO_DIR,
    command_env,
    machine_info,
    median,
    parser,
    print_table,
    ratio,
    scratch_dir,
    time_command,
    verdict,
    write_result,
)

#: Command -> its target ratio against the floor (None: shown, no target).
COMMANDS: Final[dict[str, tuple[list[str], float | None]]] = {
    "dsh --help": (["--help"], 5.0),
    "dsh --version": (["--version"], None),
    "dsh sessions list": (["sessions", "list"], 8.0),
    "dsh run --help": (["run", "--help"], None),
    "dsh plugins": (["plugins"], None),
}


def _seed(root: Path, work: Path, env: dict[str, str]) -> None:
    script = work / "script.json"
    script.write_text(json.dumps({"responses": [{"text": "ok"}]}))
    for n in range(3):
        subprocess.run(
            [sys.executable, "-m", "dsh_host", "run", "--model", f"scripted:{script}",
             "--workspace", str(work), "--json", f"prompt {n}"],
            env=env, cwd=work, stdin=subprocess.DEVNULL, capture_output=True, timeout=300,
            check=True,
        )


def _heaviest_imports(args: list[str], env: dict[str, str], cwd: Path) -> list[list[Any]]:
    """The five slowest top-level imports of one run (``-X importtime``, cumulative us)."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "dsh_host", *args], env=env, cwd=cwd,
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300, check=False,
    )
    rows = []
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _, cumulative, name = (part.strip() for part in line[len("import time:"):].split("|"))
        if cumulative.isdigit() and not name.startswith(" ") and "." not in name.strip():
            rows.append([name.strip(), int(cumulative)])
    rows.sort(key=lambda r: r[1], reverse=True)
    return rows[:5]


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=15, help="interleaved rounds (default 15)")
    args = p.parse_args()
    rounds = 5 if args.small else args.rounds
    with scratch_dir(args.scratch, "startup") as scratch:
        root, work = scratch / "sessions", scratch / "work"
        work.mkdir()
        env = command_env(root, scratch / "cache")
        _seed(root, work, env)
        contenders = {"python -c pass": [sys.executable, "-c", "pass"]}
        for name, (argv, _) in COMMANDS.items():
            contenders[name] = [sys.executable, "-m", "dsh_host", *argv]
        samples: dict[str, list[int]] = {name: [] for name in contenders}
        for argv in contenders.values():  # warm the page cache and bytecode once, untimed
            time_command(argv, env, work)
        for _ in range(rounds):
            for name, argv in contenders.items():
                samples[name].append(time_command(argv, env, work))
        floor = median(samples["python -c pass"])
        rows = []
        results: dict[str, Any] = {}
        for name, values in samples.items():
            ms = median(values) / 1e6
            r = ratio(median(values), floor)
            target = COMMANDS[name][1] if name in COMMANDS else None
            rows.append([name, round(ms, 1), r, target, verdict(r, target) if target else "-"])
            results[name] = {"median_ms": round(ms, 2), "ratio": r, "target": target}
        print_table(
            f"start-up, median of {rounds} interleaved rounds (floor: python -c pass)",
            ["command", "ms", "x floor", "target", "verdict"],
            rows,
        )
        imports = {
            name: _heaviest_imports(argv, env, work) for name, (argv, _) in COMMANDS.items()
            if name in ("dsh --help", "dsh sessions list")
        }
        for name, heavy in imports.items():
            print_table(f"heaviest top-level imports of {name} (-X importtime)",
                        ["module", "cumulative us"], heavy)
    write_result(
        "startup",
        {"small": args.small, "rounds": rounds, "results": results,
         "heaviest_imports": imports, "repo": str(REPO_DIR), "machine": machine_info()},
        args.results_dir,
    )


if __name__ == "__main__":
    main()

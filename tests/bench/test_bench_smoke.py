"""Smoke tests of ``bench/``: every script runs with ``--small`` and writes well-formed JSON.

No timing is asserted (these machines are shared; benchmarks are scripts, read
by people). What is asserted is what a benchmark must get right to mean
anything: it exits 0, its JSON has the figures the README explains, and the
structural facts behind them hold -- the checkpoint policy really fsyncs on
every step, a barrier's bytes really reach the log, the resume read really
sees every event. Each script runs on both anyio backends (the test ids carry
the backend, so ``-k trio`` / ``-k asyncio`` select one).
"""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"
BACKENDS = [pytest.param("trio", id="trio"), pytest.param("asyncio", id="asyncio")]

pytestmark = pytest.mark.slow


def run_bench(name: str, tmp_path: Path, *extra: str) -> dict[str, Any]:
    results = tmp_path / "results"
    done = subprocess.run(
        [
            sys.executable,
            str(BENCH / f"{name}.py"),
            "--small",
            "--results-dir",
            str(results),
            "--scratch",
            str(tmp_path / "scratch"),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert done.returncode == 0, f"{name} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert "Traceback" not in done.stderr, done.stderr
    out = results / f"{name}.json"
    assert out.is_file(), f"{name} wrote no {out}"
    data: dict[str, Any] = json.loads(out.read_text())
    assert data["benchmark"] == name
    assert data["small"] is True
    assert {"python", "cpus", "load_average_1_5_15"} <= set(data["machine"])
    # the scratch directory is removed afterwards
    assert not any((tmp_path / "scratch").iterdir())
    return data


def assert_verdict(verdict: str, value: float, target: float, *, at_most: bool = True) -> None:
    """The verdict a script prints is the one its own figure and target give (either way)."""
    met = value <= target if at_most else value >= target
    assert verdict == ("met" if met else "NOT met"), (verdict, value, target, at_most)


def test_the_verdict_helper_compares_in_the_stated_direction() -> None:
    spec = importlib.util.spec_from_file_location("bench_common", BENCH / "_common.py")
    assert spec is not None and spec.loader is not None
    common = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = common  # its dataclasses look their module up while defined
    spec.loader.exec_module(common)
    verdict: Callable[..., str] = common.verdict
    assert [verdict(v, 1.15) for v in (1.0, 1.15, 1.2)] == ["met", "met", "NOT met"]
    assert [verdict(v, 100, at_most=False) for v in (99, 100, 101)] == ["NOT met", "met", "met"]


def assert_summary(summary: dict[str, Any]) -> None:
    assert {"n", "median_us", "p10_us", "p90_us", "min_us"} <= set(summary)
    assert summary["n"] > 0
    assert 0 < summary["min_us"] <= summary["median_us"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_barrier(tmp_path: Path, backend: str) -> None:
    data = run_bench("barrier", tmp_path, "--backend", backend)
    assert data["backend"] == backend
    assert set(data["batches"]) == {"1", "3", "12", "120"}
    sizes = []
    for key, batch in data["batches"].items():
        assert batch["events_per_batch"] == int(key)
        for part in (
            "flush",
            "raw_write_fsync",
            "raw_open_write_fsync_close",
            "raw_write_fsync_on_worker_thread",
            "raw_write_fsync_on_anyio_thread",
            "compress",
            "flush_before_fsync",
            "flush_fsync",
            "flush_after_fsync",
        ):
            assert_summary(batch[part])
        assert batch["ratio"] > 0 and batch["ratio_median_of_pairs"] > 0
        # the raw baseline wrote the very frame the barrier appended: a real zstd frame
        assert batch["frame_bytes_median"] > 0
        assert batch["plaintext_bytes_median"] > batch["frame_bytes_median"] / 2
        sizes.append(batch["plaintext_bytes_median"])
    assert sizes == sorted(sizes)  # more events per batch, more bytes
    assert_summary(data["fixed_costs"]["empty_flush"])
    assert_summary(data["fixed_costs"]["thread_hop"])
    targets = data["targets"]
    assert targets["ratio_at_most"] == 1.5
    assert (
        targets["primary_ratio"] == data["batches"][str(targets["primary_batch_events"])]["ratio"]
    )
    assert_verdict(targets["verdict"], targets["primary_ratio"], 1.5)
    assert set(targets["every_batch"]) == set(data["batches"])
    for key, batch in data["batches"].items():
        assert_verdict(targets["every_batch"][key], batch["ratio"], 1.5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_loop_step(tmp_path: Path, backend: str) -> None:
    data = run_bench("loop_step", tmp_path, "--backend", backend, "--words", "2")
    runs = data["runs"]
    assert [r["steps"] for r in runs] == [10, 50, 150]
    assert {r["more_words_a_reply"] for r in runs} == {2}
    assert data["cpu_breakdown"]["more_words_a_reply"] == 2
    for run in runs:
        for key in (
            "ms_per_step_start",
            "ms_per_step_end",
            "growth_ratio",
            "cpu_growth_ratio",
            "bytes_per_step",
            "raw_fsync_ms_median",
            "ratio_to_one_raw_fsync",
        ):
            assert run[key] > 0, key
        # The checkpoint policy is on: every tool step makes its log durable before the
        # request and before the tool body, so it cannot cost fewer than two fsyncs.
        assert run["fsyncs_per_step"] >= 2
        assert run["fsyncs_total"] >= 2 * run["steps"]
        # one turn: turn/start, user/message, request header/context, then 5+ events a step
        assert run["events"] >= 5 * run["steps"]
        assert run["log_bytes"] >= run["bytes_per_step"] * (run["steps"] - 1)
    targets, largest = data["targets"], runs[-1]
    limit = targets["growth_ratio_at_most"]
    assert limit == 1.15
    assert targets["growth_ratio_largest_n"] == largest["growth_ratio"]
    assert_verdict(targets["growth_verdict"], largest["growth_ratio"], limit)
    assert_verdict(
        targets["growth_without_fsync_verdict"], largest["growth_ratio_without_fsync"], limit
    )
    assert_verdict(targets["cpu_growth_verdict"], largest["cpu_growth_ratio"], limit)
    # The CPU breakdown: four runs of the largest N whose shares add up to the durable run.
    breakdown = data["cpu_breakdown"]
    assert breakdown["steps"] == largest["steps"]
    assert breakdown["sleep_per_fsync_ms"] > 0
    cpu, share = breakdown["cpu_ms_per_step"], breakdown["share_ms"]
    assert cpu["in_memory"] > 0 and cpu["durable"] > 0
    assert breakdown["rounds"] == 1  # --small
    for mode, values in breakdown["cpu_ms_per_step_rounds"].items():
        assert values == [cpu[mode]], mode  # one round: its median is the round's value
    assert sum(share.values()) == pytest.approx(cpu["durable"], abs=0.005)
    checks = breakdown["targets"]
    assert_verdict(checks["durable_verdict"], cpu["durable"], checks["durable_cpu_ms_at_most"])
    assert_verdict(
        checks["in_memory_verdict"], cpu["in_memory"], checks["in_memory_cpu_ms_at_most"]
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_default_composition(tmp_path: Path, backend: str) -> None:
    """The shipped composition ran every step (approval, compaction and the rest mounted), the
    checkpoint policy fsynced each one, and each figure the table shows is there."""
    data = run_bench("default_composition", tmp_path, "--backend", backend)
    runs = data["runs"]
    assert [r["steps"] for r in runs] == [100, 300]
    for run in runs:
        assert run["tenth_steps"] == run["steps"] // 10
        # turn/start, user/message, then at least five events a read_file step
        assert run["events"] >= 5 * run["steps"]
        assert run["fsyncs_per_step"] >= 3  # request, tool body, next step
        assert run["raw_fsync_samples"] >= run["steps"] // 3 - 1
        assert run["three_fsync_floor_ms"] == pytest.approx(3 * run["raw_fsync_ms_median"], abs=0.002)
        for key in (
            "ms_per_step_median",
            "last_over_first",
            "last_over_first_without_fsync",
            "cpu_ms_per_step_median",
            "cpu_last_over_first",
            "step_over_floor",
            "live_blocks_per_step_last_tenth",
            "rss_mib_end",
        ):
            assert run[key] > 0, key
    targets, largest = data["targets"], runs[-1]
    assert_verdict(targets["flat_verdict"], largest["last_over_first"], 1.15)
    assert_verdict(targets["floor_verdict"], largest["step_over_floor"], 4.0)
    assert_verdict(targets["cpu_verdict"], largest["cpu_ms_per_step_median"], 1.0)
    assert len(data["machine"]["load_average_1_5_15_end"]) == 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_streaming(tmp_path: Path, backend: str) -> None:
    """Both contenders streamed the whole answer through the adapter (the bench checks each
    turn's text length), and the per-chunk figures are the contenders' difference."""
    data = run_bench("streaming", tmp_path, "--backend", backend)
    assert data["answer_bytes"] == 1 << 16
    many, few = data["contenders"]["4096"], data["contenders"]["20"]
    assert (many["chunks"], few["chunks"]) == (4096, 20)
    assert len(many["wall_ms_rounds"]) == len(few["wall_ms_rounds"]) == data["repeats"] == 2
    per = data["per_chunk"]
    extra = 4096 - 20
    assert per["wall_us"] == pytest.approx(
        (many["wall_ms_median"] - few["wall_ms_median"]) * 1e3 / extra, abs=0.01
    )
    assert per["cpu_us"] == pytest.approx(
        (many["cpu_ms_median"] - few["cpu_ms_median"]) * 1e3 / extra, abs=0.01
    )
    # the answer itself is traced in both: a peak below it means nothing was traced
    assert few["peak_traced_mib"] * 2**20 >= data["answer_bytes"]
    targets = data["targets"]
    assert_verdict(targets["wall_verdict"], per["wall_us"], targets["per_chunk_us_at_most"])
    assert_verdict(targets["cpu_verdict"], per["cpu_us"], targets["per_chunk_us_at_most"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_concurrency(tmp_path: Path, backend: str) -> None:
    data = run_bench("concurrency", tmp_path, "--backend", backend)
    agents, per_agent = data["agents"], data["steps_per_agent"]
    assert (agents, per_agent) == (10, 8)
    for run in [*data["single"], *data["single_always_hop"], *data["many"], data["stall_run"]]:
        assert run["tool_steps"] == agents * per_agent
        assert run["steps_per_second"] > 0 and run["cpu_ms_per_step"] > 0
        # the checkpoint policy makes every step durable three times (plus each publish),
        # and every one of those barriers went through the JSONL storage's lane
        assert run["fsyncs_per_step"] >= 3
        assert run["inline_barriers"] + run["hopped_barriers"] >= 3 * run["tool_steps"]
    # inline_barrier_ms: 0 reached the storage: nothing ran on the event loop
    assert all(r["inline_barriers"] == 0 for r in data["single_always_hop"])
    assert all(r["agents"] == 1 for r in data["single"])
    assert all(r["agents"] == agents for r in data["many"])
    stall = data["stall"]
    # agent 0's barriers really were held up inside fsync...
    assert stall["stalled_fsyncs"] >= 1
    assert stall["stalled_ms_total"] >= data["stall_ms"] * stall["stalled_fsyncs"]
    # ...and the other agents kept stepping meanwhile: a barrier that blocked the event
    # loop (an fsync run inline) would leave this at zero.
    assert stall["other_agents_steps_during_stalls"] >= 1
    # One agent alone under the same stall: the lane learns from the first slow barrier and
    # hops from then on (every later call is slow too, so its estimate never falls back);
    # asyncio always hops.
    lone = data["lone_stall"]
    assert lone["stalled_fsyncs"] >= 3
    assert lone["stalled_fsyncs_on_event_loop"] <= (1 if backend == "trio" else 0)
    assert lone["ticks"] >= 1
    targets = data["targets"]
    assert targets["speedup_at_least"] == 3.0
    one = statistics.median(r["steps_per_second"] for r in data["single"])
    many = statistics.median(r["steps_per_second"] for r in data["many"])
    assert targets["speedup"] == pytest.approx(many / one, rel=0.01)  # the figure it summarizes
    cpu_many = statistics.median(r["cpu_ms_per_step"] for r in data["many"])
    assert targets["cpu_bound_ceiling"] == pytest.approx(1000 / cpu_many / one, rel=0.01)
    assert_verdict(targets["verdict"], targets["speedup"], 3.0, at_most=False)


@pytest.mark.parametrize("backend", BACKENDS)
def test_resume(tmp_path: Path, backend: str) -> None:
    data = run_bench("resume", tmp_path, "--backend", backend)
    assert data["steps"] == 300
    assert data["events"] >= 5 * data["steps"]
    assert data["messages"] >= 2 * data["steps"]  # an assistant message + a tool result a step
    for key in (
        "read",
        "raw_zstd_msgspec",
        "raw_zstd_stdlib_json",
        "resume",
        "resume_to_first_derive",
        "restore_and_derive_in_memory",
    ):
        assert_summary(data[key])
        assert data[key]["n"] == data["repeats"]
    assert data["ratio_read_over_raw"] > 0
    targets = data["targets"]
    assert targets["ratio_at_most"] == 1.5
    assert targets["ratio"] == data["ratio_read_over_raw"]
    assert_verdict(targets["verdict"], data["ratio_read_over_raw"], 1.5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_host(tmp_path: Path, backend: str) -> None:
    data = run_bench("host", tmp_path, "--backend", backend)
    assert set(data["dispatch"]) == {"trio", "asyncio"}
    for measured in data["dispatch"].values():
        by_hooks = measured["us_per_dispatch_by_hooks"]
        assert list(by_hooks) == ["0", "1", "2", "4", "8", "16"]
        assert all(v > 0 for v in by_hooks.values())
        assert measured["us_per_hook"] != 0
    assert data["append_detached"]["events"] > 0
    assert data["append_detached"]["events_per_second_median"] > 0
    assert data["append_live_jsonl"]["events"] > 0
    targets = data["targets"]
    worst_hook = max(m["us_per_hook"] for m in data["dispatch"].values())
    assert targets["us_per_hook_worst_backend"] == worst_hook
    assert_verdict(targets["hook_verdict"], worst_hook, targets["us_per_hook_at_most"])
    rate = data["append_detached"]["events_per_second_median"]
    assert targets["append_events_per_second_median"] == rate
    floor = targets["append_events_per_second_at_least"]
    assert_verdict(targets["append_verdict"], rate, floor, at_most=False)
    assert_verdict(
        targets["append_cpu_verdict"],
        data["append_detached"]["events_per_cpu_second_median"],
        floor,
        at_most=False,
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_search(tmp_path: Path, backend: str) -> None:
    data = run_bench("search", tmp_path, "--backend", backend)
    assert data["tree"]["kept_files"] == 401
    assert set(data["figures"]) == {"floor", "ripgrep", "walk", "glob_ripgrep", "glob_walk"}
    assert all(f["median_us"] > 0 for f in data["figures"].values())
    assert set(data["ratios"]) == {
        "ripgrep_vs_floor",
        "walk_vs_floor",
        "walk_vs_ripgrep",
        "glob_walk_vs_glob_ripgrep",
    }


def test_serve_load(tmp_path: Path) -> None:
    pytest.importorskip("procrastinate")
    pytest.importorskip("starlette")
    data = run_bench("serve_load", tmp_path, "--only", "jsonl-1", "queue-3")
    assert set(data["results"]) == {"jsonl-1", "queue-3"}
    for result in data["results"].values():
        assert result["turns"] == data["sessions"] * data["turns"]
        assert result["delivery_ms"]["events"] > result["turns"]
        assert 0 <= result["delivery_ms"]["p50"] <= result["delivery_ms"]["p99"]
        assert result["healthz_ms_p50"] > 0
        cpu = result["cpu_ms_per_turn"]  # where a turn's CPU went, by part
        assert cpu["sum"] > 0 and cpu["driver"] >= 0
        assert len(cpu["servers"]) == (1 if result is data["results"]["jsonl-1"] else 3)
    # where a queued turn's job waited, from procrastinate's event rows (D48)
    jobs = data["results"]["queue-3"]["job_phases"]
    assert jobs["jobs"] == data["sessions"] * data["turns"]
    for phase in ("pickup_ms", "held_ms"):
        assert 0 <= jobs[phase]["p50"] <= jobs[phase]["p99"], jobs
    assert data["results"]["jsonl-1"]["job_phases"] == {}


def test_serve_load_counts_a_logged_statement_by_its_kind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--pg-log`` reads PostgreSQL's log: a statement's next lines (a tab first) are part of
    it, and its kind is named by what it runs (D48's table), not by its first word only."""
    pytest.importorskip("httpx")
    monkeypatch.syspath_prepend(str(BENCH))  # serve_load imports its siblings by name
    spec = importlib.util.spec_from_file_location("bench_serve_load", BENCH / "serve_load.py")
    assert spec is not None and spec.loader is not None
    serve_load = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, serve_load)
    spec.loader.exec_module(serve_load)
    at = "2026-12-06 02:47:10.881 UTC [26731] r@test"
    log = tmp_path / "postgresql.log"
    log.write_text(
        f"{at} LOG:  statement: SELECT id, status, task_name\n"
        "\t    FROM procrastinate_fetch_job_v2(NULL::varchar[], 3);\n"
        f'{at} LOG:  execute <unnamed>: INSERT INTO "s".events (session_id, seq, event)\n'
        f"{at} DETAIL:  parameters: $1 = 'x'\n"
        f"{at} LOG:  statement: SELECT pg_notify('c', s) FROM unnest('{{a}}'::text[]) AS s\n"
        f"{at} LOG:  statement: BEGIN\n"
        f"{at} LOG:  statement: \n"
        f"{at} LOG:  statement: SELECT 42\n"
    )
    per = serve_load.statements_per_turn(log, 0, log.stat().st_size, 2)
    assert per == {"(empty)": 0.5, "BEGIN": 0.5, "fetch": 0.5, "insert": 0.5, "notify": 0.5,
                   "other": 0.5, "all": 3.0}


def test_run_all_runs_selected_scripts_and_summarizes(tmp_path: Path) -> None:
    results = tmp_path / "results"
    done = subprocess.run(
        [
            sys.executable,
            str(BENCH / "run_all.py"),
            "--small",
            "--only",
            "host",
            "--results-dir",
            str(results),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((results / "run_all.json").read_text())
    assert [(s["name"], s["exit"], s["flags"][0]) for s in summary["scripts"]] == [
        ("host", 0, "--small")
    ]
    assert json.loads((results / "host.json").read_text())["small"] is True


def test_run_all_lists_every_script_and_rejects_unknown_names() -> None:
    listed = subprocess.run(
        [sys.executable, str(BENCH / "run_all.py"), "--list"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert listed.returncode == 0
    names = listed.stdout.split()
    assert {
        "barrier",
        "loop_step",
        "resume",
        "host",
        "session_append",
        "startup",
        "concurrency",
        "default_composition",
        "streaming",
    } <= set(names)
    assert "run_all" not in names and "_common" not in names
    bad = subprocess.run(
        [sys.executable, str(BENCH / "run_all.py"), "--only", "no_such_bench"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert bad.returncode == 2
    assert "no_such_bench" in bad.stderr


def test_startup(tmp_path: Path) -> None:
    """Every command of the start-up bench ran and has a ratio against the floor."""
    data = run_bench("startup", tmp_path)
    results = data["results"]
    assert {"python -c pass", "dsh --help", "dsh sessions list"} <= set(results)
    assert results["dsh --help"]["target"] == 5.0
    assert results["dsh sessions list"]["target"] == 8.0
    assert all(r["median_ms"] > 0 and r["ratio"] > 0 for r in results.values())


def test_sessions_list(tmp_path: Path) -> None:
    """Every contender ran over a root of real logs; the summary figures are the ones its own
    medians give, and the listing's cache went to the bench's scratch, not the user's."""
    data = run_bench("sessions_list", tmp_path)
    assert (data["sessions"], data["steps"], data["rounds"]) == (5, 50, 3)
    results = data["results"]
    assert set(results) == {"python -c pass", "list --fresh", "list", "list, one log changed"}
    assert all(r["median_ms"] > 0 and r["x_floor"] > 0 for r in results.values())
    assert data["log_bytes"] > 0 and data["cache_bytes"] > 0
    fresh, remembered = results["list --fresh"]["median_ms"], results["list"]["median_ms"]
    assert data["fresh_over_remembered"] == pytest.approx(fresh / remembered, rel=0.01)
    assert not (Path(os.environ["XDG_CACHE_HOME"]) / "dsh").exists()


@pytest.mark.parametrize("backend", BACKENDS)
def test_checkpoint_overhead(tmp_path: Path, backend: str) -> None:
    """With the policy every tool step makes exactly three fsyncs, one per barrier, and every
    barrier really was seen; without it a step waits for none."""
    data = run_bench(
        "checkpoint_overhead", tmp_path, "--steps", "6", "--repeats", "1", "--backend", backend
    )
    assert data["backend"] == backend
    assert data["with_policy"]["fsyncs_per_step_median"] == 3
    assert data["without_policy"]["fsyncs_per_step_median"] == 0
    for barrier in ("pre-step", "llm", "tool"):
        entry = data["barriers"][barrier]
        assert entry["flush"]["n"] == 5  # steps 2..6, one checkpoint each
        assert entry["fsyncs_per_call_median"] == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_sqlite_vs_jsonl(tmp_path: Path, backend: str) -> None:
    data = run_bench("sqlite_vs_jsonl", tmp_path, "--backend", backend)
    assert data["backend"] == backend and data["session"]["events"] == 120
    assert len(data["flush"]) == 2 and len(data["resume"]) == 2
    for figures in data["flush"].values():
        assert figures["one_event"]["n"] == 30 and figures["one_turn_12_events"]["n"] == 10
    assert all(value > 0 for value in data["ratio_sqlite_over_jsonl"].values())


@pytest.mark.parametrize("backend", BACKENDS)
def test_telemetry_overhead(tmp_path: Path, backend: str) -> None:
    """Both variants ran every step; the row really exported spans (one turn, a chat and a
    tool span per tool step, the closing chat), and the tracer was timed with and without
    metrics."""
    data = run_bench("telemetry_overhead", tmp_path, "--backend", backend)
    assert data["backend"] == backend
    steps = data["steps"]
    runs = data["repeats"] * (steps - 1)  # step 1 of each turn is left out
    assert data["step_without_row_us"]["n"] == data["step_with_row_us"]["n"] == runs
    assert data["spans_per_turn"] == 1 + 2 * steps + 1
    assert data["tracer_per_step_us"]["spans"]["n"] > 0
    assert data["tracer_per_step_us"]["spans_and_metrics"]["n"] > 0



def test_big_sessions(tmp_path: Path) -> None:
    """Every read path ran in its own child on each small log of JSONL and SQLite, with a wall
    time, a peak RSS of its own, and the per-event figures its own numbers give."""
    data = run_bench("big_sessions", tmp_path)
    assert data["sizes"] == [1000, 5000]
    assert set(data["results"]) == {"jsonl", "sqlite"}
    reads = {"show (transcript)", "show --view model", "show --view events", "verify",
             "resume (no prompt)", "server summary", "export --attest", "audit verify"}
    for kind, figures in data["results"].items():
        assert set(figures) == {"floor", *reads}, kind
        floor = figures["floor"]
        assert floor["wall_ms"] > 0 and floor["peak_rss_mib"] > 10
        for read in reads:
            for size in ("1000", "5000"):
                entry = figures[read][size]
                assert entry["wall_ms"] > 0 and entry["peak_rss_mib"] > 10, (kind, read)
                # from the MiB figures, rounded to 0.1: within 0.1 MiB of the exact one
                grown = max(entry["peak_rss_mib"] - floor["peak_rss_mib"], 0) * 2**20
                slack = 0.1 * 2**20 / int(size) + 1
                assert abs(entry["bytes_per_event"] - grown / int(size)) <= slack, (kind, read)

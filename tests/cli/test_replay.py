"""``dsh replay``: a recorded session's prompts against another (scripted) model in a new forked
session; nothing with side effects runs again; divergences are found where planted and only
there (D28). Real ``dsh`` processes over the JSONL store and SQLite.
"""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from .cli_helpers import REPO, dsh, priced_composition
from .fork_helpers import WRITE_A, WRITE_B_READ_A, Store, two_turns

SAME = [WRITE_A, {"text": "wrote a"}, WRITE_B_READ_A, {"text": "wrote b"}]
EXTRA = {"tool_calls": [
    {"name": "write_file", "arguments": {"path": "b.txt", "content": "two"}, "id": "x2"},
    {"name": "read_file", "arguments": {"path": "a.txt"}, "id": "x3"},
    {"name": "write_file", "arguments": {"path": "c.txt", "content": "new"}, "id": "x4"},
]}  # fmt: skip
PLANTED = [WRITE_A, {"text": "wrote a"}, EXTRA, {"text": "wrote b and c"}]


def replay(store: Store, responses: list[Any], *extra: str) -> Any:
    model = store.script("replay.json", responses)
    return dsh("replay", "src", "--model", model, "--json", *extra, *store.flags, cwd=store.tmp)


@pytest.mark.parametrize("kind", ["jsonl", "sqlite"])
def test_an_identical_replay_finds_no_divergence_and_runs_no_effect(
    tmp_path: Path, kind: str
) -> None:
    store = Store(tmp_path, kind)
    two_turns(store)
    source = store.events("src")
    for name in ("a.txt", "b.txt"):
        (store.workspace / name).unlink()  # a re-run write would bring them back
    done = replay(store, SAME, "--id", "again", "--fail-on-divergence")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["firstDivergence"] is None
    assert [row["divergence"] for row in report["turns"]] == [None, None]
    assert [row["replay"]["finalText"] for row in report["turns"]] == ["wrote a", "wrote b"]
    assert sorted(p.name for p in store.workspace.iterdir()) == []  # no write ran again
    assert store.events("src") == source
    child = store.events("again")
    (ledger,) = [e for e in child if e["type"] == "fork/effects"]
    assert ledger["data"]["origin"] == "replay" and ledger["data"]["parentSession"] == "src"
    assert [e["tool"] for e in ledger["data"]["effects"]] == ["write_file", "write_file",
                                                               "read_file"]  # fmt: skip
    results = [e["data"]["message"]["content"][0] for e in child if e["type"] == "tool/result"]
    texts = [r["content"][0]["text"] for r in results]
    assert texts[0].startswith("Error: not run again: this exact call already took effect")
    assert "Wrote 3 bytes to a.txt" in texts[0]
    # the model is asked what the source's model was asked: the ledger answers calls, unseen
    assert "This session was forked" not in json.dumps(child)


@pytest.mark.parametrize("kind", ["jsonl", "sqlite"])
def test_a_planted_divergence_is_found_and_the_unmatched_call_is_refused(
    tmp_path: Path, kind: str
) -> None:
    store = Store(tmp_path, kind)
    two_turns(store)
    done = replay(store, PLANTED)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    first = report["firstDivergence"]
    assert (first["turn"], first["kind"], first["call"]) == (2, "extra-call", 3)
    assert first["replay"][0] == "write_file" and first["source"] is None
    one, two = report["turns"]
    assert one["divergence"] is None and two["divergence"] == first
    assert "-wrote b\n+wrote b and c" in two["finalTextDiff"]
    assert not (store.workspace / "c.txt").exists()  # the unmatched write never ran
    child = store.events(report["replay"])
    refused = [e["data"]["message"]["content"][0]["content"][0]["text"] for e in child
               if e["type"] == "tool/result"
               and e["data"]["message"]["source"]["callId"] == "x4"]  # fmt: skip
    assert refused and "no recorded match (unmatched call; nearest recorded call: write_file" in (
        refused[0]
    )
    failing = replay(store, PLANTED, "--fail-on-divergence")
    assert failing.returncode == 1, failing.stderr


def test_replay_of_an_unknown_session_is_one_error_line(tmp_path: Path) -> None:
    store = Store(tmp_path, "jsonl")
    done = replay(store, SAME)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert 'session "src" not found' in done.stderr


def test_replay_from_a_later_turn_keeps_the_earlier_ones(tmp_path: Path) -> None:
    store = Store(tmp_path, "jsonl")
    two_turns(store)
    source = store.events("src")
    done = replay(store, [WRITE_B_READ_A, {"text": "wrote b"}], "--from", "2", "--id", "later")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert [row["turn"] for row in report["turns"]] == [2]
    assert report["firstDivergence"] is None
    child = store.events("later")
    turn_one_end = next(e["seq"] for e in source if e["type"] == "turn/end")
    assert child[: turn_one_end + 1] == source[: turn_one_end + 1]  # turn 1 kept as recorded
    (ledger,) = [e for e in child if e["type"] == "fork/effects"]
    assert [e["tool"] for e in ledger["data"]["effects"]] == ["write_file", "read_file"]
    bad = replay(store, SAME, "--from", "0")
    assert bad.returncode == 2 and "--from 0: turns are numbered from 1" in bad.stderr


def test_the_human_report_gives_each_turns_cost_delta(tmp_path: Path) -> None:
    priced = priced_composition(tmp_path)  # $2 per million input tokens, $10 per million output
    (tmp_path / "ws").mkdir()
    flags = ["--config", str(priced), "--root", str(tmp_path / "store")]

    def script(name: str, output_tokens: int) -> str:
        path = tmp_path / name
        path.write_text(json.dumps({"responses": [
            {"text": "Done.", "usage": {"input_tokens": 1000, "output_tokens": output_tokens}}]}))
        return f"scripted:{path}"

    done = dsh("run", "go", "--session", "src", "--new", "--model", script("s.json", 200),
               "--workspace", str(tmp_path / "ws"), *flags, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    # 1000 in + 200 out = $0.004; 1000 in + 400 out = $0.006
    again = dsh("replay", "src", "--model", script("r.json", 400), *flags, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "  cost: $0.004 -> $0.006 (+$0.002)" in again.stdout
    payload = dsh("replay", "src", "--model", script("r2.json", 100), "--json", *flags,
                  cwd=tmp_path)  # fmt: skip
    (row,) = json.loads(payload.stdout)["turns"]
    assert Decimal(row["costUsdDelta"]) == Decimal("-0.001")
    unpriced = dsh("replay", "src", "--model", script("r3.json", 100), "--root",
                   str(tmp_path / "store"), "--config", str(REPO / "configs" / "default.yml"),
                   cwd=tmp_path)  # fmt: skip
    assert unpriced.returncode == 0, unpriced.stderr
    assert "  cost: unknown (a model without a price)" in unpriced.stdout

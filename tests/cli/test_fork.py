"""``dsh sessions fork``: a child at a turn boundary, linked to its source, with the effects
ledger of the turns it leaves out; a continued child never repeats a recorded effect (D27).

Real ``dsh`` processes, scripted models, the built-in tools in a real workspace, over the
JSONL store and over SQLite (configs/sqlite.yml).
"""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from .fork_helpers import WRITE_B_READ_A, Store, stored_header, two_turns


@pytest.mark.parametrize("kind", ["jsonl", "sqlite"])
def test_fork_carries_the_ledger_and_the_child_never_repeats_an_effect(
    tmp_path: Path, kind: str
) -> None:
    store = Store(tmp_path, kind)
    two_turns(store)
    source = store.events("src")
    forked = store.fork("src", "--turn", "1", "--id", "kid", "--json")
    assert forked.returncode == 0, forked.stderr
    result = json.loads(forked.stdout)
    turn_one_end = next(e["seq"] for e in source if e["type"] == "turn/end")
    assert (result["sessionId"], result["boundary"]) == ("kid", turn_one_end)
    ledger = [(e["tool"], json.loads(e["arguments"]), e["status"]) for e in result["effects"]]
    assert ledger == [("write_file", {"path": "b.txt", "content": "two"}, "done"),
                      ("read_file", {"path": "a.txt"}, "done")]  # fmt: skip
    assert store.events("src") == source  # the source is never changed
    child = store.events("kid")
    assert child[: turn_one_end + 1] == source[: turn_one_end + 1]
    assert [e["type"] for e in child[turn_one_end + 1 :]] == ["session/end-seed", "fork/effects"]
    assert child[turn_one_end + 1]["data"] == {"inherited": True}
    assert child[-1]["ignorable"] is True and child[-1]["data"]["parentSession"] == "src"
    header = anyio.run(stored_header, kind, tmp_path / "store", "kid")
    assert (header["parentSession"], header["isSeeded"]) == ("src", True)
    assert header["cwd"] == str(store.workspace)
    # the child continues: the same calls again; the write is answered from the record, the
    # read-only read runs, and the model is told what the world already saw
    (store.workspace / "b.txt").unlink()
    store.run("write b again", "kid", store.script("s3.json", [WRITE_B_READ_A, {"text": "ok"}]))
    assert not (store.workspace / "b.txt").exists()  # the effect was not repeated
    after = store.events("kid")
    results = {e["data"]["message"]["source"]["callId"]: e["data"]["message"]["content"][0]
               for e in after[len(child):] if e["type"] == "tool/result"}  # fmt: skip
    assert results["w2"]["isError"] is True
    assert "not run again: this exact call already took effect" in results["w2"]["content"][0]["text"]
    assert "Wrote 3 bytes to b.txt" in results["w2"]["content"][0]["text"]
    assert results["r1"].get("isError") is not True
    context = json.dumps([e for e in after if e["type"] == "user/message"])
    assert "This session was forked" in context and "b.txt" in context


def test_fork_refuses_a_seq_inside_a_turn_and_names_the_boundaries(tmp_path: Path) -> None:
    store = Store(tmp_path, "jsonl")
    two_turns(store)
    source = store.events("src")
    inside = next(e["seq"] for e in source if e["type"] == "tool/call")
    refused = store.fork("src", "--at", str(inside))
    assert refused.returncode != 0
    assert f"seq {inside} of session \"src\" is inside a turn" in refused.stderr
    assert "Traceback" not in refused.stderr
    missing = store.fork("src", "--turn", "7")
    assert missing.returncode != 0 and "turn 7" in missing.stderr
    whole = store.fork("src", "--json")  # default: the last turn boundary, all of it here
    assert whole.returncode == 0, whole.stderr
    payload = json.loads(whole.stdout)
    assert payload["boundary"] == source[-1]["seq"] and payload["effects"] == []
    assert store.events("src") == source

"""``dsh sessions fork``: a child at a turn boundary, linked to its source, with the effects
ledger of the turns it leaves out; a continued child never repeats a recorded effect (D23).

Real ``dsh`` processes, scripted models, the built-in tools in a real workspace, over the
JSONL store and over SQLite (configs/sqlite.yml).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from cli.cli_helpers import dsh, json_lines

from dsh_host import Row, open_host
from dsh_host.session.events import to_builtins

REPO = Path(__file__).resolve().parents[2]
SQLITE = str(REPO / "configs" / "sqlite.yml")

WRITE_A = {"tool_calls": [{"name": "write_file", "arguments": {"path": "a.txt", "content": "one"},
                           "id": "w1"}]}  # fmt: skip
WRITE_B_READ_A = {"tool_calls": [
    {"name": "write_file", "arguments": {"path": "b.txt", "content": "two"}, "id": "w2"},
    {"name": "read_file", "arguments": {"path": "a.txt"}, "id": "r1"},
]}  # fmt: skip


class Store:
    def __init__(self, tmp_path: Path, kind: str) -> None:
        self.tmp = tmp_path
        self.flags = ["--root", str(tmp_path / "store")]
        if kind == "sqlite":
            self.flags += ["--config", SQLITE]
        self.workspace = tmp_path / "ws"
        self.workspace.mkdir()

    def script(self, name: str, responses: list[Any]) -> str:
        path = self.tmp / name
        path.write_text(json.dumps({"responses": responses}))
        return f"scripted:{path}"

    def run(self, prompt: str, session: str, model: str, *extra: str) -> dict[str, Any]:
        done = dsh("run", prompt, "--session", session, *extra, "--model", model,
                   "--workspace", str(self.workspace), "--json", *self.flags, cwd=self.tmp)  # fmt: skip
        assert done.returncode == 0, done.stderr
        payload: dict[str, Any] = json.loads(done.stdout)
        return payload

    def events(self, session: str) -> list[dict[str, Any]]:
        shown = dsh("sessions", "show", session, "--view", "events", "--json", *self.flags,
                    cwd=self.tmp)  # fmt: skip
        assert shown.returncode == 0, shown.stderr
        return json_lines(shown.stdout)

    def fork(self, *args: str) -> Any:
        return dsh("sessions", "fork", *args, *self.flags, cwd=self.tmp)


async def stored_header(kind: str, root: Path, session_id: str) -> dict[str, Any]:
    """The header as a fresh backend reads it from the store (the link DSH's fork writes)."""
    name = f"session-persistence-{kind}"
    async with open_host([Row(name="sessions"), Row(name=name, config={"root": str(root)})]) as host:
        load = await host.ctx.sessionPersistence.inspect(session_id)
    header: dict[str, Any] = to_builtins(load.header)
    return header


def two_turns(store: Store) -> None:
    store.run("write a", "src", store.script("s1.json", [WRITE_A, {"text": "wrote a"}]), "--new")
    store.run("write b", "src", store.script("s2.json", [WRITE_B_READ_A, {"text": "wrote b"}]))


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

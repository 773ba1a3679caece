"""Shared by the fork and replay CLI tests: a store (JSONL or SQLite), a two-turn source."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dsh_host import Row, open_host
from dsh_host._session.events import to_builtins

from .cli_helpers import dsh, json_lines

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
        events: list[dict[str, Any]] = json_lines(shown.stdout)
        return events

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



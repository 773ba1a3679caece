"""``POST /sessions/{id}/fork`` over real HTTP on loopback: the child at a turn boundary, linked
to its source, with the effects ledger; a turn in the child does not repeat a recorded effect
(D27)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .harness import running_server

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]

WRITE = {"tool_calls": [{"id": "w1", "name": "write_file",
                         "arguments": {"path": "out.txt", "content": "paid"}}]}  # fmt: skip


async def test_fork_over_http(tmp_path: Path) -> None:
    responses = [{"text": "hello"}, WRITE, {"text": "written"}, WRITE, {"text": "again"}]
    async with running_server(tmp_path, responses) as server:
        source = await server.create()
        await server.turn(source, "say hello")
        await server.wait_turn_end(source, 1)
        await server.turn(source, "write it")
        await server.wait_turn_end(source, 2)
        before = await server.events(source)
        turn_one = next(e["seq"] for e in before if e["type"] == "turn/end")
        inside = next(e["seq"] for e in before if e["type"] == "tool/call")

        refused = await server.client.post(f"/sessions/{source}/fork", json={"at": inside})
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["code"] == "NOT_A_TURN_BOUNDARY"
        missing = await server.client.post("/sessions/nope/fork", json={})
        assert missing.status_code == 404

        forked = await server.client.post(f"/sessions/{source}/fork",
                                          json={"turn": 1, "id": "child-1"})  # fmt: skip
        assert forked.status_code == 201, forked.text
        body = forked.json()
        assert body["id"] == "child-1" and body["fork"]["boundary"] == turn_one
        assert [(e["tool"], e["status"]) for e in body["fork"]["effects"]] == [
            ("write_file", "done")
        ]
        shown = (await server.client.get("/sessions/child-1")).json()
        assert shown["header"]["parentSession"] == source and shown["header"]["isSeeded"] is True
        assert await server.events(source) == before  # the source is not changed
        taken = await server.client.post(f"/sessions/{source}/fork", json={"id": "child-1"})
        assert taken.status_code == 409

        (server.workspace / "out.txt").unlink()
        await server.turn("child-1", "write it")
        await server.wait_turn_end("child-1", 2)
        assert not (server.workspace / "out.txt").exists()  # not repeated
        results = [e for e in await server.events("child-1") if e["type"] == "tool/result"]
        text = results[-1]["data"]["message"]["content"][0]["content"][0]["text"]
        assert text.startswith("Error: not run again: this exact call already took effect")

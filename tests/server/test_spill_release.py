"""A tool call's spill files leave with its session, not with the server.

``dsh serve`` keeps one ``builtin-tools`` row for its whole life, and that row's spill area used
to keep every file a noisy call saved until the server stopped. Now each file belongs to the
session whose call wrote it and is deleted when the session leaves the process
(``session/disposed``: the end of each turn here). Real Hypercorn on loopback, the real
``grep`` tool, real files; the test enumerates what is left in the spill directory."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from .harness import running_server

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]

#: The spill path a capped ``grep`` names in its footer.
SPILLED = re.compile(r"(/\S*dsh-tool-output-[^/\s]+)/([^\s)]+)")


def grep_call(call_id: str) -> dict[str, object]:
    return {"tool_calls": [{"id": call_id, "name": "grep", "arguments": {"pattern": "needle"}}]}


async def test_a_turns_spill_files_are_gone_when_its_session_is_released(
    tmp_path: Path,
) -> None:
    responses = [grep_call("call-1"), {"text": "one"}, grep_call("call-2"), {"text": "two"}]
    async with running_server(tmp_path, responses) as server:
        (server.workspace / "hay.txt").write_text(
            "".join(f"needle {n}\n" for n in range(5000))
        )
        first = await server.create()
        second = await server.create()
        spilled: list[tuple[str, str]] = []
        for session_id in (first, second):
            turn = await server.turn(session_id, "search")
            end = await server.wait_turn_end(session_id, turn)
            assert end["lastTurnEnd"]["kind"] == "completed", end
            results = [
                e for e in await server.events(session_id) if e["type"] == "tool/result"
            ]
            text = "".join(
                block.get("text", "")
                for e in results
                for block in e["data"]["message"]["content"]
                for block in ([block] if "text" in block else block.get("content", []))
            )
            found = SPILLED.search(text)
            assert found is not None, text[-2000:]
            spilled.append((found.group(1), found.group(2)))
            directory, name = spilled[-1]
            # The model was shown the call's file; it is gone now that the turn ended and the
            # session was released, and nothing else is left in the area.
            assert not (Path(directory) / name).exists()
            assert os.listdir(directory) == []
        assert spilled[0][0] == spilled[1][0]  # one area for the server's row, kept empty

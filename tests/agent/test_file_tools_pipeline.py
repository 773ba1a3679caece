"""The new file tools go through the same pipeline as every tool (issue 23): the durable
``tool/call`` first, ``tools/pre-execute`` (a ``tool-rules`` deny stops ``list_dir`` before its
body), then the ``tool/result`` paired by call id; a capped ``glob`` result the model sees names
its spill file, and the durable result is exactly what the model saw."""

from __future__ import annotations

from pathlib import Path

import pytest

from dsh_host import Row

from .agent_helpers import agent_service, scripted_host

pytestmark = pytest.mark.anyio


async def test_list_dir_denied_by_tool_rules_glob_runs_both_logged_in_order(
    tmp_path: Path,
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    for name in ("a.py", "b.py", "c.py"):
        (ws / name).write_text("x\n")
    responses = [
        {"tool_calls": [{"name": "list_dir", "arguments": {}, "id": "call-ls"}]},
        {"tool_calls": [{"name": "glob", "arguments": {"pattern": "*.py"}, "id": "call-glob"}]},
        {"text": "done"},
    ]
    rows = (
        Row(name="builtin-tools", config={"workspace": str(ws), "maxSearchResults": 2}),
        Row(name="tool-rules", config={"rules": [{"tool": "list_dir", "decision": "deny"}]}),
    )
    async with scripted_host(responses, *rows) as host:
        agent = agent_service(host).create(cwd=str(ws))
        await agent.run_turn("look around")
        events = [(e.type, e.data) for e in agent.session.events]
    tool_events = [(kind, data) for kind, data in events if kind in ("tool/call", "tool/result")]
    kinds = [kind for kind, _ in tool_events]
    assert kinds == ["tool/call", "tool/result", "tool/call", "tool/result"]
    (_, ls_call), (_, ls_result), (_, glob_call), (_, glob_result) = tool_events
    assert (ls_call.name, ls_call.call_id) == ("list_dir", "call-ls")
    assert (glob_call.name, glob_call.call_id) == ("glob", "call-glob")
    ls_block = ls_result.message.content[0]
    glob_block = glob_result.message.content[0]
    assert ls_block.tool_call_id == "call-ls" and ls_block.is_error is True
    assert ls_block.content[0].text == 'Error: tool "list_dir" is denied by tool-rules'
    assert glob_block.tool_call_id == "call-glob" and glob_block.is_error is not True
    shown = glob_block.content[0].text
    assert shown.startswith("a.py\nb.py\n(1 more files not shown. Full glob result stored at: ")
    assert shown.endswith(". Use read_file with offset/limit to page through it.)")

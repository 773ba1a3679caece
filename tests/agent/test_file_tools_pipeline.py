"""The new file tools go through the same pipeline as every tool (issue 23): the durable
``tool/call`` first, ``tools/pre-execute`` (a ``tool-rules`` deny stops ``list_dir`` before its
body), then the ``tool/result`` paired by call id; a capped ``glob`` result the model sees names
its spill file, and the durable result is exactly what the model saw."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from dsh_host import Row, open_host
from dsh_host._session import ImageBlock, TextBlock, ToolResultBlock
from dsh_host._session.events import turn_end_kind

from .agent_helpers import agent_service, model_requests, scripted_host, scripted_rows

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


@pytest.mark.parametrize("vision", [True, False])
async def test_read_file_on_an_image_reaches_the_next_request(
    tmp_path: Path, vision: bool
) -> None:
    """The loop end to end (D31): ``read_file`` on a PNG logs a tool result holding the image;
    the next request carries it to a model that reads images, and a text note in its place to
    one that does not (the turn goes on; the log keeps the image either way)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    picture = bytes.fromhex(  # a 1x1 PNG
        "89504e470d0a1a0a0000000d4948445200000001000000010802000000907753de0000000c4944415478"
        "9c63f8cfc000000301010000c9fe92ef0000000049454e44ae426082"
    )
    (ws / "shot.png").write_bytes(picture)
    responses = [
        {"tool_calls": [{"name": "read_file", "arguments": {"path": "shot.png"}, "id": "c1"}]},
        {"text": "a dot"},
    ]
    rows = [row for row in scripted_rows(responses) if row.name != "llm-scripted"]
    rows.append(Row(id="model", name="llm-scripted",
                    config={"responses": responses, "vision": vision}))
    rows.append(Row(name="builtin-tools", config={"workspace": str(ws)}))
    async with open_host(rows) as host:
        agent = agent_service(host).create(cwd=str(ws))
        reason = await agent.run_turn("what is in shot.png?")
        [logged] = [e.data.message for e in agent.session.events if e.type == "tool/result"]
        second = model_requests(host)[1]
    assert turn_end_kind(reason) == "completed"
    envelope, image = logged.content[0].content
    assert isinstance(image, ImageBlock)
    assert image.attachment["data"] == base64.b64encode(picture).decode()
    [sent] = [m.content[0] for m in second.messages if m.id == logged.id]
    assert isinstance(sent, ToolResultBlock)
    sent_envelope, sent_image = sent.content
    assert sent_envelope == envelope
    if vision:
        assert sent_image == image
    else:
        assert isinstance(sent_image, TextBlock)
        assert sent_image.text.startswith(
            f'[image not shown: shot.png (image/png, {len(picture)} bytes); model "scripted" '
            "takes no images or documents."
        )

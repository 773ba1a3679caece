"""``POST /sessions/{id}/turns`` with ``attachments``: an image sent with the prompt is logged
as DSH's block and reaches the model in its provider's form (LLMock's Anthropic endpoint keeps
the request); a file that is not an image or PDF, or not base64, is a 400 naming it, and
nothing is logged."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from dsh_host._server.command import build_compositions
from dsh_host._server.runtime import ServeOptions
from dsh_host._server.serve import bind_socket, serve

from .harness import Server, running_server, write_composition

PNG = (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x02\x00\x00"
       b"\x00\x90wS\xde\x00\x00\x00\x0cIDATx\x9cc\xf8\xcf\xc0\x00\x00\x03\x01\x01\x00\xc9\xfe"
       b"\x92\xef\x00\x00\x00\x00IEND\xaeB`\x82")


@pytest.mark.anyio
async def test_a_turn_with_an_image_logs_it_and_sends_it(llmock: Any, tmp_path: Path) -> None:
    llmock.reply("A red dot.")
    workspace, root = tmp_path / "ws", tmp_path / "sessions"
    workspace.mkdir()
    options = ServeOptions(
        compositions=build_compositions(
            str(write_composition(tmp_path)), [], "anthropic:claude-haiku-4-5", str(root)
        ),
        default_workspace=str(workspace.resolve()),
    )
    sock = bind_socket("127.0.0.1", 0)
    stop = anyio.Event()
    data = base64.b64encode(PNG).decode()
    try:
        async with anyio.create_task_group() as group:
            await group.start(lambda task_status: serve(
                options, sock, shutdown=stop.wait, task_status=task_status))
            url = f"http://127.0.0.1:{sock.getsockname()[1]}"
            async with httpx.AsyncClient(base_url=url, timeout=60) as client:
                server = Server(url, client, workspace, root)
                try:
                    session_id = await server.create()
                    refused = await client.post(f"/sessions/{session_id}/turns", json={
                        "prompt": "look", "attachments": [{"name": "notes.txt",
                                                           "data": "cGxhaW4="}]})
                    not_b64 = await client.post(f"/sessions/{session_id}/turns", json={
                        "prompt": "look", "attachments": [{"name": "x.png", "data": "%%%"}]})
                    response = await client.post(f"/sessions/{session_id}/turns", json={
                        "prompt": "what is this?",
                        "attachments": [{"name": "dot.png", "data": data}]})
                    assert response.status_code == 202, response.text
                    turn = int(response.json()["turn"])
                    session = await server.wait_turn_end(session_id, turn)
                    events = await server.events(session_id)
                finally:
                    stop.set()
    finally:
        sock.close()
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "INVALID_ATTACHMENT"
    assert "'notes.txt': not an accepted type" in refused.json()["error"]["message"]
    assert not_b64.status_code == 400 and "not base64" in not_b64.json()["error"]["message"]
    assert session["lastTurnEnd"]["kind"] == "completed", session
    assert turn == 1  # the refused turns logged nothing
    [prompt] = [e["data"] for e in events if e["type"] == "user/message"
                and e["data"]["source"]["kind"] == "user"]
    assert prompt["content"][0] == {"type": "text", "text": "what is this?"}
    image = prompt["content"][1]
    assert (image["type"], image["attachment"]["name"], image["attachment"]["data"]) == (
        "image", "dot.png", data
    )
    sent = llmock.last_request.body["messages"]
    parts = [part for message in sent for part in message["content"]
             if isinstance(message["content"], list)]
    assert {"type": "base64", "media_type": "image/png", "data": data} in [
        part.get("source") for part in parts
    ]


@pytest.mark.anyio
async def test_a_model_that_takes_no_images_refuses_the_turn_before_logging(
    llmock: Any, tmp_path: Path
) -> None:
    """Claude 2 reads no images (its family's default, D31): the turn is a 400 naming the
    model and what to do; nothing is logged and the model is never asked."""
    llmock.reply("never")
    async with running_server(tmp_path, [], model="anthropic:claude-2.1") as server:
        session_id = await server.create()
        refused = await server.client.post(f"/sessions/{session_id}/turns", json={
            "prompt": "what is this?",
            "attachments": [{"name": "dot.png", "data": base64.b64encode(PNG).decode()}]})
        events = await server.events(session_id)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["code"] == "IMAGES_UNSUPPORTED"
    assert 'model "claude-2.1" (provider "anthropic") takes no images' in error["message"]
    assert "dot.png (image/png, " in error["message"]
    assert [e for e in events if e["type"] == "user/message"] == []
    assert llmock.requests == []

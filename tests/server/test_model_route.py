"""``dsh serve --model anthropic:MODEL``: the route a plugin declares works behind the HTTP API
too (in-process server on a loopback socket, LLMock's Anthropic endpoint as the model)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from dsh_host._server.command import build_compositions
from dsh_host._server.runtime import ServeOptions
from dsh_host._server.serve import bind_socket, serve

from .harness import Server, write_composition

MODEL = "claude-haiku-4-5-20251001"


@pytest.mark.anyio
async def test_serve_runs_a_turn_on_an_anthropic_model(llmock: Any, tmp_path: Path) -> None:
    llmock.reply("Served by Claude.")
    workspace, root = tmp_path / "ws", tmp_path / "sessions"
    workspace.mkdir()
    options = ServeOptions(
        compositions=build_compositions(
            str(write_composition(tmp_path)), [], f"anthropic:{MODEL}", str(root)
        ),
        default_workspace=str(workspace.resolve()),
    )
    sock = bind_socket("127.0.0.1", 0)
    stop = anyio.Event()
    try:
        async with anyio.create_task_group() as group:
            await group.start(lambda task_status: serve(
                options, sock, shutdown=stop.wait, task_status=task_status))
            url = f"http://127.0.0.1:{sock.getsockname()[1]}"
            async with httpx.AsyncClient(base_url=url, timeout=60) as client:
                server = Server(url, client, workspace, root)
                try:
                    session_id = await server.create()
                    turn = await server.turn(session_id, "hello")
                    session = await server.wait_turn_end(session_id, turn)
                    events = await server.events(session_id)
                finally:
                    stop.set()
    finally:
        sock.close()
    assert session["lastTurnEnd"]["kind"] == "completed", session
    [message] = [e for e in events if e["type"] == "assistant/message"]
    assert message["data"]["message"]["content"] == [{"type": "text", "text": "Served by Claude."}]
    assert message["data"]["message"]["source"]["provider"] == "anthropic"
    assert (llmock.last_request.model, llmock.last_request.path) == (
        MODEL, "/anthropic/v1/messages"
    )


@pytest.mark.anyio
async def test_serve_runs_a_turn_on_a_litellm_model(llmock: Any, tmp_path: Path) -> None:
    """``dsh serve --model litellm:openai/MODEL``: LiteLLM's own asyncio loop behind the API."""
    llmock.reply("Served through LiteLLM.")
    workspace, root = tmp_path / "ws", tmp_path / "sessions"
    workspace.mkdir()
    options = ServeOptions(
        compositions=build_compositions(
            str(write_composition(tmp_path)), [], "litellm:openai/gpt-4o-mini", str(root)
        ),
        default_workspace=str(workspace.resolve()),
    )
    sock = bind_socket("127.0.0.1", 0)
    stop = anyio.Event()
    try:
        async with anyio.create_task_group() as group:
            await group.start(lambda task_status: serve(
                options, sock, shutdown=stop.wait, task_status=task_status))
            url = f"http://127.0.0.1:{sock.getsockname()[1]}"
            async with httpx.AsyncClient(base_url=url, timeout=60) as client:
                server = Server(url, client, workspace, root)
                try:
                    session_id = await server.create()
                    turn = await server.turn(session_id, "hello")
                    session = await server.wait_turn_end(session_id, turn)
                    events = await server.events(session_id)
                finally:
                    stop.set()
    finally:
        sock.close()
    assert session["lastTurnEnd"]["kind"] == "completed", session
    [message] = [e for e in events if e["type"] == "assistant/message"]
    assert message["data"]["message"]["content"] == [
        {"type": "text", "text": "Served through LiteLLM."}
    ]
    assert message["data"]["message"]["source"]["provider"] == "litellm"
    assert llmock.last_request.path == "/v1/chat/completions"


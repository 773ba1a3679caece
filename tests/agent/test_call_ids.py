"""The agent loop owns call identity: every call of a session gets a unique, non-empty id.

In process, with the scripted model (and an ``llm/stream`` listener standing in for a provider
that sends no id): the provider's id is kept when it is new in the session, replaced by a
minted one otherwise (kept as ``providerId``); the tool, its ``tool/call`` and ``tool/result``,
and the next model request all use the harness's id; each call's idempotency key differs.
"""

from __future__ import annotations

from typing import Any

import pytest
from msgspec import UNSET

from dsh_host._session.events import CompletedReason
from dsh_host._session.messages import (
    BlockEndChunk,
    BlockStartChunk,
    FinishChunk,
    ToolCallBlock,
    ToolCallDeltaChunk,
    ToolCallsFinish,
    ToolResultBlock,
)
from dsh_host._tools import ToolExecution

from .agent_helpers import agent_service, model_requests, register_tool, scripted_host

pytestmark = pytest.mark.anyio


def calls(*ids: str) -> dict[str, Any]:
    return {"tool_calls": [{"id": call_id, "name": "echo"} for call_id in ids]}


async def test_repeated_ids_are_replaced_and_the_provider_id_is_kept() -> None:
    seen: list[tuple[str, str]] = []

    async def echo(args: Any, exec: ToolExecution) -> Any:
        seen.append((exec.call_id, exec.idempotency_key))
        return "ok"

    script = [calls("call_0", "call_0"), calls("call_0"), {"text": "done"}]
    async with scripted_host(script) as host:
        register_tool(host, "echo", echo)
        agent = agent_service(host).create()
        await agent.run_turn("go")
        events = list(agent.session.events)
        last_request = model_requests(host)[-1]
    blocks = [
        block
        for event in events
        if event.type == "assistant/message"
        for block in event.data.message.content
        if isinstance(block, ToolCallBlock)
    ]
    ids = [block.id for block in blocks]
    assert ids[0] == "call_0" and blocks[0].provider_id is UNSET  # a new id is kept as sent
    assert len(set(ids)) == 3 and all(i.startswith("call_") for i in ids)
    assert [block.provider_id for block in blocks[1:]] == ["call_0", "call_0"]
    assert [call_id for call_id, _ in seen] == ids  # the tool saw the harness's id
    assert len({key for _, key in seen}) == 3
    assert [e.data.call_id for e in events if e.type == "tool/call"] == ids
    assert [e.data.message.source.call_id for e in events if e.type == "tool/result"] == ids
    # What goes back to the model: each call and its result under the same (harness) id.
    sent_calls = [
        block.id
        for message in last_request.messages
        for block in message.content
        if isinstance(block, ToolCallBlock)
    ]
    sent_results = [
        block.tool_call_id
        for message in last_request.messages
        for block in message.content
        if isinstance(block, ToolResultBlock)
    ]
    assert sent_calls == ids and sent_results == ids


async def test_a_call_without_an_id_runs_once_and_is_answered() -> None:
    ran: list[str] = []

    async def echo(args: Any, exec: ToolExecution) -> Any:
        ran.append(exec.call_id)
        return "ok"

    sent: list[bool] = []

    def no_id(request: Any, next: Any) -> Any:
        if sent:  # the follow-up request: answer as scripted
            return next()
        sent.append(True)

        async def chunks() -> Any:
            yield BlockStartChunk(index=0, block_type="tool-call")
            yield ToolCallDeltaChunk(index=0, id="", name="echo", arguments_delta="{}")
            yield BlockEndChunk(index=0, block=ToolCallBlock(id="", name="echo", arguments="{}"))
            yield FinishChunk(reason=ToolCallsFinish())

        return chunks()

    async with scripted_host([{"text": "done"}]) as host:
        register_tool(host, "echo", echo)
        host.ctx.on("llm/stream", no_id)
        agent = agent_service(host).create()
        reason = await agent.run_turn("go")
        events = list(agent.session.events)
    assert reason == CompletedReason()
    [minted] = ran
    assert minted.startswith("call_")
    [result] = [e.data for e in events if e.type == "tool/result"]
    assert result.message.source.call_id == minted and result.error is UNSET
    [message] = [e.data.message for e in events if e.type == "assistant/message"][:1]
    assert message.content[0].provider_id == ""  # the wire said: no id

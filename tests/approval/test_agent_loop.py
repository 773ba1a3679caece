"""Approval inside the real agent loop: durable order, the policy snapshot, the live switch."""

from __future__ import annotations

from typing import Any

import pytest
from dsh_user_approval import ASK_POLICY_SENTENCE, NEVER_POLICY_SENTENCE

from dsh_host import Row, open_host
from dsh_host._session import CompletedReason, PluginSource, TextBlock, UserMessage
from dsh_host._tools import ToolDefinition, ToolExecution, text_output

# both backends: the agent loop
pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]

SNAPSHOT_HEADER = "Current runtime context. This snapshot supersedes earlier runtime-context snapshots."


def rows(responses: list[Any]) -> list[Row]:
    return [
        Row(name="sessions"),
        Row(name="llm"),
        Row(name="tools"),
        Row(id="rules", name="tool-rules", config={"rules": [{"tool": "probe", "decision": "ask"}]}),
        Row(id="approval", name="user-approval"),
        Row(id="model", name="llm-scripted", config={"responses": responses}),
        Row(name="agent", config={"provider": "scripted", "model": "scripted"}),
    ]


def call(call_id: str) -> dict[str, Any]:
    return {"tool_calls": [{"id": call_id, "name": "probe", "arguments": {"x": 1}}]}


def user_texts(events: Any) -> list[str]:
    out: list[str] = []
    for event in events:
        if event.type == "user/message":
            out.extend(b.text for b in event.data.content if isinstance(b, TextBlock))
    return out


def tool_result_text(event: Any) -> str:
    (block,) = event.data.message.content
    (inner,) = block.content
    return str(inner.text)


async def test_turn_with_ask_policy_snapshot_and_live_switch() -> None:
    ran: list[Any] = []
    asked: list[Any] = []

    async def body(args: Any, exec_: ToolExecution) -> str:
        ran.append(exec_.call_id)
        return "probed"

    async def grant(req: Any, next_: Any) -> Any:
        asked.append(req.call_id)
        return "allowed-once"

    responses = [call("c1"), {"text": "done one"}, call("c2"), {"text": "done two"}]
    async with open_host(rows(responses)) as host:
        host.ctx.tools.register(
            ToolDefinition(
                name="probe", description="probe", parameters={"type": "object"},
                execute=body, output=text_output(),
            )
        )
        host.ctx.on("approval/request", grant)
        agent = host.ctx.agent.create(session_id="loop-1")
        reason = await agent.run_turn("first")
        assert isinstance(reason, CompletedReason)
        events = list(agent.session.events)
        kinds = [e.type for e in events]
        i = kinds.index("tool/call")
        assert kinds[i : i + 4] == ["tool/call", "approval/asked", "approval/decided", "tool/result"]
        assert events[i + 2].data.outcome == "allowed-once"
        assert tool_result_text(events[i + 3]) == "probed"
        assert ran == ["c1"] and asked == ["c1"]
        snapshots = [t for t in user_texts(events) if t.startswith(SNAPSHOT_HEADER)]
        assert snapshots == [f"{SNAPSHOT_HEADER}\n\n{ASK_POLICY_SENTENCE}"]

        # The live switch: one event, and the notice enters the next step as a user message.
        host.ctx.approval.set_policy(agent, "never")
        reason = await agent.run_turn("second")
        assert isinstance(reason, CompletedReason)
        events = list(agent.session.events)[len(events):]
        texts = user_texts(events)
        notice = 'The approval policy changed from "ask" to "never" (changed by the user).'
        assert notice in texts
        notice_event = next(
            e for e in events
            if e.type == "user/message" and isinstance(e.data, UserMessage)
            and e.data.content == (TextBlock(text=notice),)
        )
        assert notice_event.data.source == PluginSource(plugin="user-approval")
        assert f"{SNAPSHOT_HEADER}\n\n{NEVER_POLICY_SENTENCE}" in texts
        # Under never the second call is rejected without asking, audited, body not run.
        kinds = [e.type for e in events]
        i = kinds.index("tool/call")
        assert kinds[i : i + 4] == ["tool/call", "approval/asked", "approval/decided", "tool/result"]
        assert events[i + 2].data.outcome == "rejected"
        assert tool_result_text(events[i + 3]) == 'Error: the user rejected tool "probe"'
        assert ran == ["c1"] and asked == ["c1"]
        await agent.aclose()

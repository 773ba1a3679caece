"""A tool body that waits on another session's approvals (D36), without sub-agents.

A ``@tool`` whose body raises ``ToolCallWaits`` the first time: under ``approval="defer"`` its
call gets no result, a ``tool/waits`` record names what it waits on, and the turn ends
``awaiting-approval``; ``continue_turn`` dispatches it again (this time it answers), then the
model goes on. Without deferral (a whole-pipeline ``tools.execute``) the same body is an
ordinary error result coded ``CALL_WAITS``. A real JSONL store; no mocks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from dsh_host._cancel import CancelToken
from dsh_host._front import Agent, tool
from dsh_host._session.approvals import WAITS_EVENT, deferred_calls
from dsh_host._tools import CALL_WAITS, ToolCallWaits, ToolExecutionInput
from dsh_host._tools.keys import TOOLS

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "trio"


def _waiting_tool(calls: list[str]) -> Any:
    @tool
    def fetch() -> str:
        """Fetch what another session decides."""
        calls.append("fetch")
        if len(calls) == 1:
            raise ToolCallWaits(
                "waits on session other (call(s) c9)", session_id="other", call_ids=["c9"]
            )
        return "fetched"

    return fetch


async def test_a_waiting_body_ends_the_turn_awaiting_and_continue_dispatches_it_again(
    tmp_path: Path,
) -> None:
    script = tmp_path / "model.yml"
    script.write_text(
        yaml.safe_dump(
            {"responses": [{"tool_calls": [{"name": "fetch", "id": "f1"}]}, {"text": "done"}]}
        )
    )
    calls: list[str] = []
    async with Agent(
        model=f"scripted:{script}",
        tools=[_waiting_tool(calls)],
        approval="defer",
        store=tmp_path / "s",
    ) as agent:
        first = await agent.run("go")
        assert type(first.turn_end).__name__ == "AwaitingApprovalReason"
        events = agent.session.events
        assert not [e for e in events if e.type == "tool/result"]
        (waits,) = [e for e in events if e.type == WAITS_EVENT]
        assert waits.ignorable
        assert dict(waits.data) == {
            "turn": 1, "step": 1, "callId": "f1", "sessionId": "other", "callIds": ("c9",)
        }  # fmt: skip
        (waiting,) = deferred_calls(events)
        assert (waiting.call_id, waiting.waits_on, waiting.decision) == (
            "f1",
            ("other", ("c9",)),
            None,
        )
        assert agent.pending_approvals() == []
        second = await agent.continue_turn()
        assert second.output == "done"
        results = [e for e in agent.session.events if e.type == "tool/result"]
        assert [r.data.message.source.call_id for r in results] == ["f1"]
        assert results[0].data.message.content[0].is_error is False
    assert calls == ["fetch", "fetch"]


async def test_without_deferral_a_waiting_body_is_an_error_result(tmp_path: Path) -> None:
    calls: list[str] = []
    script = tmp_path / "model.yml"
    script.write_text(yaml.safe_dump({"responses": [{"text": "x"}]}))
    async with Agent(
        model=f"scripted:{script}", tools=[_waiting_tool(calls)], store=tmp_path / "s"
    ) as agent:
        result = await agent.host.ctx.service(TOOLS).execute(
            ToolExecutionInput(
                call_id="f1", name="fetch", arguments={}, signal=CancelToken(), deferrable=True
            )
        )
    assert result.is_error
    assert result.error is not None and result.error.info is not None
    assert result.error.info.code == CALL_WAITS
    assert "waits on session other" in str(result.content)

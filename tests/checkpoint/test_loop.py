"""The policy under the real agent loop: where each barrier falls in a turn, and fail-closed turns."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from dsh_llm_scripted import ScriptedResponse, ScriptedToolCall

from dsh_host import Row
from dsh_host._session.events import SessionEvent, ToolCallData, ToolResultData
from dsh_host._session.messages import ToolResultBlock
from dsh_host._tools import ToolDefinition, ToolExecution, text_output

from .helpers import DiskUnavailableError, Probe, ProbeAdapter, booted, durable_events

# both backends: the agent loop's barriers
pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]

AGENT_ROW = Row(name="agent", config={"provider": "probe", "model": "probe"})


def tool_turn(*names: str, text: str = "done") -> list[ScriptedResponse]:
    """One response calling ``names`` (in one assistant message), then a text answer."""
    return [
        ScriptedResponse(tool_calls=[ScriptedToolCall(name=name) for name in names]),
        ScriptedResponse(text=text),
    ]


class LoopTool:
    """A tool whose body records the durable ``tool/call`` ids at entry."""

    def __init__(self, host: Any, probe: Probe, root: Path, *, parallel: bool) -> None:
        self.probe = probe
        self.root = root
        self.durable_at_entry: dict[str, set[str]] = {}
        self.running = 0
        self.max_running = 0
        host.ctx.tools.register(
            ToolDefinition(
                name="probe",
                description="probe",
                parameters={"type": "object", "properties": {}},
                execute=self._body,
                output=text_output(),
                is_concurrency_safe=(lambda args: True) if parallel else None,
            )
        )

    async def _body(self, args: Any, exec_: ToolExecution) -> str:
        self.probe.journal.add("body")
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        try:
            assert exec_.agent is not None
            durable = await durable_events(self.root, exec_.agent.session.id)
            self.durable_at_entry[exec_.call_id] = {
                e.data.call_id for e in durable if isinstance(e.data, ToolCallData)
            }
            await anyio.sleep(0.01)
            return f"ran {exec_.call_id}"
        finally:
            self.running -= 1


def kinds(events: tuple[SessionEvent, ...] | list[SessionEvent]) -> list[str]:
    return [event.type for event in events]


def reason_of(events: Any) -> dict[str, Any]:
    last = events[-1]
    assert last.type == "turn/end"
    reason: dict[str, Any] = msgspec.to_builtins(last.data.reason)
    return reason


async def test_a_tool_turn_crosses_every_barrier_in_order(tmp_path: Path) -> None:
    async with booted(tmp_path, extra=[AGENT_ROW]) as (host, probe):
        probe.install_flush_listener()
        adapter = ProbeAdapter(probe.journal, tool_turn("probe"), root=tmp_path)
        host.ctx.llm.register_adapter(["probe"], adapter)
        tool = LoopTool(host, probe, tmp_path, parallel=False)
        agent = host.ctx.agent.create(session_id="s1", cwd=str(tmp_path))

        reason = await agent.run_turn("go")

        assert msgspec.to_builtins(reason) == {"kind": "completed"}
        flush = ["flush:start", "flush:end"]
        # pre-step 1, request 1, the tool call, pre-step 2, request 2
        assert probe.journal.entries == [
            *flush,
            *flush,
            "adapter",
            *flush,
            "body",
            *flush,
            *flush,
            "adapter",
        ]
        # Both requests found everything appended before them already on disk.
        assert [live == durable for live, durable in adapter.seen] == [True, True]
        (call_id,) = tool.durable_at_entry
        assert call_id in tool.durable_at_entry[call_id]
        await agent.aclose()
    on_disk = await durable_events(tmp_path, "s1")
    assert kinds(on_disk)[-1] == "turn/end"
    assert [e.seq for e in on_disk] == list(range(len(on_disk)))


async def test_a_failed_pre_step_flush_ends_the_turn_before_another_request(
    tmp_path: Path,
) -> None:
    async with booted(tmp_path, extra=[AGENT_ROW]) as (host, probe):
        probe.install_flush_listener()
        adapter = ProbeAdapter(probe.journal, tool_turn("probe"), root=tmp_path)
        host.ctx.llm.register_adapter(["probe"], adapter)
        LoopTool(host, probe, tmp_path, parallel=False)
        # Only the step boundary after the tool results fails (last event: step/end).
        probe.reject_when = lambda session: (
            DiskUnavailableError("disk unavailable")
            if session.events[-1].type == "step/end"
            else None
        )
        agent = host.ctx.agent.create(session_id="s1", cwd=str(tmp_path))

        reason = await agent.run_turn("go")

        assert msgspec.to_builtins(reason) == {
            "kind": "error",
            "error": {"message": "disk unavailable", "code": "DISK_UNAVAILABLE"},  # its own code
        }
        assert len(adapter.requests) == 1, "no second request after the failed checkpoint"
        events = agent.session.events
        assert kinds(events).count("step/start") == 1
        assert kinds(events)[-2:] == ["step/end", "turn/end"]
        await agent.aclose()


async def test_a_failed_first_pre_step_flush_makes_no_request_at_all(tmp_path: Path) -> None:
    async with booted(tmp_path, extra=[AGENT_ROW]) as (host, probe):
        probe.install_flush_listener()
        adapter = ProbeAdapter(probe.journal, [ScriptedResponse(text="hi")], root=tmp_path)
        host.ctx.llm.register_adapter(["probe"], adapter)
        probe.reject = DiskUnavailableError("disk unavailable")
        agent = host.ctx.agent.create(session_id="s1", cwd=str(tmp_path))

        reason = await agent.run_turn("go")

        assert msgspec.to_builtins(reason)["kind"] == "error"
        assert adapter.requests == []
        assert kinds(agent.session.events) == ["turn/start", "turn/end"]
        probe.reject = None
        await agent.aclose()


async def test_a_failed_tool_checkpoint_answers_the_call_without_running_it(
    tmp_path: Path,
) -> None:
    async with booted(tmp_path, extra=[AGENT_ROW]) as (host, probe):
        probe.install_flush_listener()
        adapter = ProbeAdapter(probe.journal, tool_turn("probe"), root=tmp_path)
        host.ctx.llm.register_adapter(["probe"], adapter)
        tool = LoopTool(host, probe, tmp_path, parallel=False)
        probe.reject_when = lambda session: (
            DiskUnavailableError("disk unavailable")
            if session.events[-1].type == "tool/call"
            else None
        )
        agent = host.ctx.agent.create(session_id="s1", cwd=str(tmp_path))

        reason = await agent.run_turn("go")

        assert msgspec.to_builtins(reason) == {"kind": "completed"}
        assert tool.durable_at_entry == {}, "the body must never run"
        (result,) = [e.data for e in agent.session.events if isinstance(e.data, ToolResultData)]
        block = result.message.content[0]
        assert isinstance(block, ToolResultBlock)
        assert block.is_error is True
        assert [getattr(part, "text", None) for part in block.content] == [
            "Error: disk unavailable"
        ]
        # The model saw the failure on its second request.
        assert len(adapter.requests) == 2
        await agent.aclose()


async def test_parallel_tool_checkpoints_share_the_drain(tmp_path: Path) -> None:
    names = ["probe"] * 6
    async with booted(tmp_path, extra=[AGENT_ROW]) as (host, probe):
        probe.install_flush_listener()
        adapter = ProbeAdapter(probe.journal, tool_turn(*names), root=tmp_path)
        host.ctx.llm.register_adapter(["probe"], adapter)
        tool = LoopTool(host, probe, tmp_path, parallel=True)
        agent = host.ctx.agent.create(session_id="s1", cwd=str(tmp_path))

        reason = await agent.run_turn("go")

        assert msgspec.to_builtins(reason) == {"kind": "completed"}
        assert tool.max_running > 1, "the calls must really overlap for this test to mean much"
        assert len(tool.durable_at_entry) == len(names)
        for call_id, durable in tool.durable_at_entry.items():
            assert call_id in durable, f"{call_id} ran before its tool/call was durable"
        live = agent.session.events
        await agent.aclose()
    on_disk = await durable_events(tmp_path, "s1")
    assert [e.seq for e in on_disk] == list(range(len(on_disk)))
    assert kinds(on_disk) == kinds(live)

"""The three barriers of ``session-checkpoint-policy``, each driven through its real seam.

``llm/stream`` through ``ctx.llm.stream``, ``tools/execute`` through
``ctx.tools.execute`` and ``agent/pre-step`` through the host's waterfall, on a
host whose sessions are persisted by the real JSONL backend. The loop-level
behaviour (a whole turn) is in ``test_loop.py``.
"""

from __future__ import annotations

import errno
import os
from contextlib import aclosing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from dsh_llm_scripted import ScriptedResponse

from dsh_host import CancelToken, Row, open_host
from dsh_host._agent import AGENT_PRE_STEP
from dsh_host._agent.types import Enter, PreStepContext
from dsh_host._llm import LlmRequest
from dsh_host._persistence.persistence import SessionWriteError
from dsh_host._session import (
    LlmCallConfig,
    Session,
    StreamChunk,
    TextBlock,
    TurnStart,
    UserMessage,
    UserSource,
)
from dsh_host._session.events import StepStart, ToolCallData
from dsh_host._tools import (
    ToolDefinition,
    ToolExecution,
    ToolExecutionInput,
    ToolExecutionResult,
    text_output,
)

from .helpers import POLICY_ROW, DiskUnavailableError, Probe, ProbeAdapter, booted, durable_events

pytestmark = pytest.mark.anyio


@dataclass(frozen=True)
class LoopAgent:
    """What ``exec.agent`` / ``payload.agent`` must offer the policy: an id and a session."""

    id: str
    session: Session


def open_step(host: Any, tmp_path: Path, session_id: str = "s1") -> Session:
    """A live session inside step 1 of turn 1, with the user's message appended."""
    session: Session = host.ctx.sessions.create(session_id, meta={"cwd": str(tmp_path)})
    session.append("turn/start", TurnStart(turn=1))
    session.append("step/start", StepStart(turn=1, step=1))
    session.append(
        "user/message",
        UserMessage(id="u1", content=(TextBlock(text="hi"),), source=UserSource()),
        surface_op="append",
    )
    return session


def request_for(session: Session | None = None, **extra: Any) -> LlmRequest:
    return LlmRequest(
        config=LlmCallConfig(provider="probe", model="probe"),
        messages=(UserMessage(id="m", content=(TextBlock(text="hi"),), source=UserSource()),),
        session=session,
        **extra,
    )


async def drain(stream: Any) -> list[StreamChunk]:
    async with aclosing(stream) as chunks:
        return [chunk async for chunk in chunks]


def with_adapter(host: Any, probe: Probe, root: Path) -> ProbeAdapter:
    adapter = ProbeAdapter(probe.journal, [ScriptedResponse(text="hello there")], root=root)
    host.ctx.llm.register_adapter(["probe"], adapter)
    return adapter


# --------------------------------------------------------------------------- llm/stream


async def test_request_is_durable_before_the_adapter_is_constructed(tmp_path: Path) -> None:
    async with booted(tmp_path) as (host, probe):
        probe.install_flush_listener()
        probe.install_downstream_probe()
        adapter = with_adapter(host, probe, tmp_path)
        session = open_step(host, tmp_path)

        stream = host.ctx.llm.stream(request_for(session))
        await anyio.sleep(0.01)
        assert probe.journal.entries == [], "the policy must not flush before first consumption"

        chunks = await drain(stream)

        assert chunks, "the adapter's chunks are relayed"
        assert probe.journal.entries == ["flush:start", "flush:end", "downstream", "adapter"]
        assert probe.flushes == 1
        # Read back from disk by a separate reader when the adapter started:
        # every event appended before the request was already durable.
        assert adapter.seen == [(len(session.events), len(session.events))]
        assert len(session.events) == 3


async def test_a_stream_closed_before_consumption_never_flushes(tmp_path: Path) -> None:
    async with booted(tmp_path) as (host, probe):
        probe.install_flush_listener()
        with_adapter(host, probe, tmp_path)
        session = open_step(host, tmp_path)
        stream = host.ctx.llm.stream(request_for(session))
        await stream.aclose()
        assert probe.journal.entries == []


async def test_a_request_by_session_id_alone_is_checkpointed(tmp_path: Path) -> None:
    async with booted(tmp_path) as (host, probe):
        probe.install_flush_listener()
        with_adapter(host, probe, tmp_path)
        open_step(host, tmp_path)
        await drain(host.ctx.llm.stream(request_for(session_id="s1")))
        assert probe.journal.entries == ["flush:start", "flush:end", "adapter"]


@pytest.mark.parametrize("which", ["no-session", "unknown-id", "detached", "other-object"])
async def test_requests_without_a_live_session_are_not_checkpointed(
    tmp_path: Path, which: str
) -> None:
    async with booted(tmp_path) as (host, probe):
        probe.install_flush_listener()
        probe.install_downstream_probe()
        with_adapter(host, probe, tmp_path)
        live = open_step(host, tmp_path)
        if which == "no-session":
            request = request_for()
        elif which == "unknown-id":
            request = request_for(session_id="nobody")
        elif which == "detached":
            request = request_for(Session.create("detached"))
        else:  # a different object that claims the live session's id
            request = request_for(Session.create(live.id))
        await drain(host.ctx.llm.stream(request))
        assert probe.journal.entries == ["downstream", "adapter"]
        assert probe.flushes == 0


async def test_a_rejected_request_flush_means_the_adapter_never_runs(tmp_path: Path) -> None:
    async with booted(tmp_path) as (host, probe):
        probe.install_flush_listener()
        probe.install_downstream_probe()
        adapter = with_adapter(host, probe, tmp_path)
        session = open_step(host, tmp_path)
        probe.reject = DiskUnavailableError("disk unavailable")

        with pytest.raises(DiskUnavailableError, match="disk unavailable"):
            await drain(host.ctx.llm.stream(request_for(session)))

        assert probe.journal.entries == ["flush:start", "flush:rejected"]
        assert adapter.requests == []


@pytest.mark.parametrize("stage", ["publication", "append"])
async def test_a_failing_fsync_stops_the_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stage: str
) -> None:
    """The real backend's fsync fails: the barrier raises and no request is made.

    ``publication`` breaks the very first flush (the log is not on disk yet);
    ``append`` breaks a later batch of an already published log.
    """
    async with booted(tmp_path) as (host, probe):
        probe.install_downstream_probe()
        adapter = with_adapter(host, probe, tmp_path)
        session = open_step(host, tmp_path)
        if stage == "append":
            await host.ctx.sessions.flush(session)
            session.append(
                "user/message",
                UserMessage(id="u2", content=(TextBlock(text="more"),), source=UserSource()),
                surface_op="append",
            )
        before = await durable_events(tmp_path, session.id)

        def broken_fsync(fd: int) -> None:
            raise OSError(errno.EIO, "disk unavailable")

        monkeypatch.setattr(os, "fsync", broken_fsync)
        try:
            # both are the typed persistence error (publication's directory fsyncs included)
            with pytest.raises(SessionWriteError, match="disk unavailable"):
                await drain(host.ctx.llm.stream(request_for(session)))
        finally:
            monkeypatch.undo()
        assert adapter.requests == []
        assert "downstream" not in probe.journal.entries
        assert await durable_events(tmp_path, session.id) == before
        assert len(before) == (0 if stage == "publication" else 3)


# --------------------------------------------------------------------------- tools/execute


class ProbeTool:
    """A registered tool whose body records what was durable when it got control."""

    def __init__(self, host: Any, probe: Probe, root: Path, name: str = "probe") -> None:
        self.probe = probe
        self.root = root
        self.entered: list[str] = []
        #: call id -> durable tool/call ids at body entry
        self.durable_calls: dict[str, set[str]] = {}
        self.nested: ToolExecutionInput | None = None
        self.hold: float = 0.0
        host.ctx.tools.register(
            ToolDefinition(
                name=name,
                description="probe",
                parameters={"type": "object", "properties": {}},
                execute=self._body,
                output=text_output(),
                is_concurrency_safe=lambda args: True,
            )
        )
        self._tools = host.ctx.tools

    async def _body(self, args: Any, exec_: ToolExecution) -> str:
        self.probe.journal.add("body")
        self.entered.append(exec_.call_id)
        session = exec_.agent.session if exec_.agent is not None else None
        if session is not None:
            durable = await durable_events(self.root, session.id)
            self.durable_calls[exec_.call_id] = {
                e.data.call_id for e in durable if isinstance(e.data, ToolCallData)
            }
        if self.hold:
            await anyio.sleep(self.hold)
        if self.nested is not None and exec_.parent is None:
            nested = ToolExecutionInput(
                call_id=f"{exec_.call_id}.inner",
                name="probe",
                arguments={},
                signal=exec_.signal,
                agent=exec_.agent,
                parent=exec_.token,
                root_call_id=exec_.root_call_id,
            )
            inner = await self._tools.execute(nested)
            assert not inner.is_error, inner
        return f"ran {exec_.call_id}"


def record_call(session: Session, call_id: str) -> None:
    """What the loop does before dispatch: the call's ``tool/call`` event."""
    session.append(
        "tool/call",
        ToolCallData(turn=1, step=1, call_id=call_id, name="probe", arguments="{}"),
    )


def call_input(
    session: Session | None, call_id: str = "c1", signal: CancelToken | None = None
) -> ToolExecutionInput:
    return ToolExecutionInput(
        call_id=call_id,
        name="probe",
        arguments={},
        signal=signal or CancelToken(),
        agent=LoopAgent(session.id, session) if session is not None else None,
    )


async def test_a_top_level_body_runs_only_after_its_call_is_durable(tmp_path: Path) -> None:
    async with booted(tmp_path) as (host, probe):
        probe.install_flush_listener()
        tool = ProbeTool(host, probe, tmp_path)
        session = open_step(host, tmp_path)
        record_call(session, "c1")

        result = await host.ctx.tools.execute(call_input(session))

        assert not result.is_error, result
        assert probe.journal.entries == ["flush:start", "flush:end", "body"]
        assert tool.durable_calls == {"c1": {"c1"}}


async def test_nested_dispatch_shares_the_outer_checkpoint(tmp_path: Path) -> None:
    async with booted(tmp_path) as (host, probe):
        probe.install_flush_listener()
        tool = ProbeTool(host, probe, tmp_path)
        tool.nested = call_input(None)  # enables the nested call in the body
        session = open_step(host, tmp_path)
        record_call(session, "c1")

        result = await host.ctx.tools.execute(call_input(session))

        assert not result.is_error, result
        assert tool.entered == ["c1", "c1.inner"]
        assert probe.flushes == 1, "the nested call must not flush again"
        assert probe.journal.entries == ["flush:start", "flush:end", "body", "body"]


async def test_calls_without_an_agent_are_not_checkpointed(tmp_path: Path) -> None:
    async with booted(tmp_path) as (host, probe):
        probe.install_flush_listener()
        tool = ProbeTool(host, probe, tmp_path)
        result = await host.ctx.tools.execute(call_input(None))
        assert not result.is_error
        assert tool.entered == ["c1"]
        assert probe.flushes == 0


async def test_cancel_while_the_flush_is_pending_never_enters_the_body(tmp_path: Path) -> None:
    async with booted(tmp_path) as (host, probe):
        probe.install_flush_listener()
        tool = ProbeTool(host, probe, tmp_path)
        session = open_step(host, tmp_path)
        record_call(session, "c1")
        probe.gate = anyio.Event()
        token = CancelToken()
        results: list[ToolExecutionResult] = []

        async def run() -> None:
            results.append(await host.ctx.tools.execute(call_input(session, signal=token)))

        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            with anyio.fail_after(30):  # a missing checkpoint must fail, not hang
                await probe.flush_started.wait()
            token.abort("user")
            probe.gate.set()

        (result,) = results
        assert tool.entered == []
        assert result.is_error
        assert [getattr(block, "text", None) for block in result.content] == [
            "Error: tool call aborted before dispatch"
        ]
        assert result.error is not None
        assert result.error.message == "tool call aborted before dispatch"
        assert result.error.info is not None
        assert (result.error.info.name, result.error.info.code) == (
            "AbortError",
            "ABORTED_BEFORE_DISPATCH",
        )
        # The flush itself completed: the call is on record although it never ran.
        durable = await durable_events(tmp_path, session.id)
        assert [e.type for e in durable][-1] == "tool/call"


async def test_a_rejected_tool_flush_fails_closed(tmp_path: Path) -> None:
    async with booted(tmp_path) as (host, probe):
        probe.install_flush_listener()
        tool = ProbeTool(host, probe, tmp_path)
        session = open_step(host, tmp_path)
        record_call(session, "c1")
        probe.reject = DiskUnavailableError("disk unavailable")

        result = await host.ctx.tools.execute(call_input(session))

        assert tool.entered == []
        assert result.is_error
        assert [getattr(block, "text", None) for block in result.content] == [
            "Error: disk unavailable"
        ]


async def test_concurrent_tool_checkpoints_never_duplicate_seqs(tmp_path: Path) -> None:
    async with booted(tmp_path) as (host, probe):
        probe.install_flush_listener()
        tool = ProbeTool(host, probe, tmp_path)
        tool.hold = 0.005
        session = open_step(host, tmp_path)
        ids = [f"c{i}" for i in range(12)]

        async def one(call_id: str) -> None:
            record_call(session, call_id)
            result = await host.ctx.tools.execute(call_input(session, call_id))
            assert not result.is_error, result

        async with anyio.create_task_group() as tg:
            for call_id in ids:
                tg.start_soon(one, call_id)
                await anyio.lowlevel.checkpoint()  # interleave appends with running checkpoints

        assert sorted(tool.entered) == sorted(ids)
        assert probe.flushes == len(ids)
        for call_id in ids:
            assert call_id in tool.durable_calls[call_id], f"{call_id} ran before it was durable"
        durable = await durable_events(tmp_path, session.id)
        assert [e.seq for e in durable] == list(range(len(durable)))
        assert [e.seq for e in durable] == [e.seq for e in session.events]
        assert sorted(
            e.data.call_id for e in durable if isinstance(e.data, ToolCallData)
        ) == sorted(ids)


# --------------------------------------------------------------------------- agent/pre-step


def pre_step_payload(session: Session, step: int = 2) -> PreStepContext:
    return PreStepContext(
        agent=LoopAgent(session.id, session),  # type: ignore[arg-type]
        turn=1,
        step=step,
        messages=(),
        signal=CancelToken(),
    )


async def test_pre_step_flushes_once_before_the_step_is_entered(tmp_path: Path) -> None:
    async with booted(tmp_path) as (host, probe):
        probe.install_flush_listener()
        session = open_step(host, tmp_path)

        async def enter() -> Enter:
            probe.journal.add("enter")
            durable = await durable_events(tmp_path, session.id)
            assert len(durable) == len(session.events)
            return Enter(())

        decision = await host.ctx.waterfall(AGENT_PRE_STEP, pre_step_payload(session), enter)

        assert isinstance(decision, Enter)
        assert probe.journal.entries == ["flush:start", "flush:end", "enter"]


async def test_a_rejected_pre_step_flush_stops_the_step(tmp_path: Path) -> None:
    async with booted(tmp_path) as (host, probe):
        probe.install_flush_listener()
        session = open_step(host, tmp_path)
        probe.reject = DiskUnavailableError("disk unavailable")

        async def enter() -> Enter:
            probe.journal.add("enter")
            return Enter(())

        with pytest.raises(DiskUnavailableError):
            await host.ctx.waterfall(AGENT_PRE_STEP, pre_step_payload(session), enter)
        assert "enter" not in probe.journal.entries


# --------------------------------------------------------------------------- lifecycle


def policy_listeners(host: Any) -> dict[str, int]:
    return {
        name: sum(
            1
            for listener in host.bus.listeners(name)
            if listener.fiber is not None and listener.fiber.id == POLICY_ROW
        )
        for name in ("agent/pre-step", "llm/stream", "tools/execute")
    }


async def test_disposing_the_plugin_removes_every_wrapper(tmp_path: Path) -> None:
    async with booted(tmp_path) as (host, probe):
        probe.install_flush_listener()
        with_adapter(host, probe, tmp_path)
        tool = ProbeTool(host, probe, tmp_path)
        session = open_step(host, tmp_path)
        assert policy_listeners(host) == {"agent/pre-step": 1, "llm/stream": 1, "tools/execute": 1}

        await host.unload(POLICY_ROW)

        assert policy_listeners(host) == {"agent/pre-step": 0, "llm/stream": 0, "tools/execute": 0}
        await drain(host.ctx.llm.stream(request_for(session)))
        record_call(session, "c1")
        await host.ctx.tools.execute(call_input(session))

        async def enter() -> Enter:
            return Enter(())

        await host.ctx.waterfall(AGENT_PRE_STEP, pre_step_payload(session), enter)
        assert probe.flushes == 0
        assert tool.entered == ["c1"]
        assert probe.journal.entries == ["adapter", "body"]


async def test_the_policy_waits_for_a_persistence_backend(tmp_path: Path) -> None:
    """Without ``sessionPersistence`` the policy never applies (a flush would protect nothing)."""
    composition = [
        Row(name="sessions"),
        Row(id=POLICY_ROW, name="session-checkpoint-policy"),
        Row(name="llm"),
        Row(name="tools"),
    ]
    async with open_host(composition, strict=False) as host:
        (row,) = [status for status in host.status() if status["id"] == POLICY_ROW]
        assert row["state"] == "pending"
        assert "sessionPersistence" in row["detail"]
        assert policy_listeners(host) == {"agent/pre-step": 0, "llm/stream": 0, "tools/execute": 0}

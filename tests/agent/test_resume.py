"""Resume: open the stored log for write, append the closers durably, continue (D7)."""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from crash.tool_body import kill_inside_tool_body

from dsh_host import Row, open_host
from dsh_host._agent import RESUME_WITHOUT_PERSISTENCE, ResumeError
from dsh_host._loader import PluginHost
from dsh_host._persistence.persistence import SessionAlreadyOwnedError
from dsh_host._session.events import (
    CompletedReason,
    InterruptedReason,
    RequestHeaderData,
    ToolErrorData,
    ToolResultData,
    TurnEnd,
    event_to_builtins,
)
from dsh_host._session.messages import TextBlock, ToolResultBlock, ToolResultMessage
from dsh_host._session.repair import TOOL_OUTCOME_UNKNOWN_TEXT

from .agent_helpers import agent_service, model_requests, scripted_rows

# both backends: the agent loop resuming (and a killed child process)
pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "dsh-reference"


@asynccontextmanager
async def persisted_host(root: Path, responses: list[Any]) -> AsyncIterator[PluginHost]:
    rows = [
        *scripted_rows(responses),
        Row(name="session-persistence-jsonl", config={"root": str(root)}),
    ]
    async with open_host(rows) as host:
        yield host


async def stored_events(root: Path, session_id: str, compression: str = "zstd") -> list[Any]:
    """What is on disk, read by a fresh backend instance."""
    config = {"root": str(root), "compression": compression}
    async with open_host(
        [Row(name="sessions"), Row(name="session-persistence-jsonl", config=config)]
    ) as host:
        handle = await host.ctx.sessionPersistence.open(session_id, "read")
        load = await handle.read()
        await handle.close()
    return list(load.events)


def copy_fixture(tmp_path: Path, encoding: str = "root-zstd") -> Path:
    root = tmp_path / "sessions"
    shutil.copytree(FIXTURES / encoding, root)
    return root


@pytest.mark.parametrize(
    ("encoding", "session_id"),
    [("root-zstd", "tool-missing-result"), ("root-none", "raw-tool-missing-result")],
)
async def test_resume_dsh_fixture_appends_the_reference_closers(
    tmp_path: Path, encoding: str, session_id: str
) -> None:
    root = copy_fixture(tmp_path, encoding)
    if encoding == "root-none":
        rows_root = {"root": str(root), "compression": "none"}
    else:
        rows_root = {"root": str(root)}
    expected = json.loads((FIXTURES / "expected.json").read_text())
    key = next(k for k in expected if f"/{session_id}/" in k)
    reference_closers = expected[key]["closers"]
    rows = [
        *scripted_rows([{"text": "I will check the payment before retrying."}]),
        Row(name="session-persistence-jsonl", config=rows_root),
    ]
    async with open_host(rows) as host:
        agent = await agent_service(host).resume(session_id)
        repaired = list(agent.session.events)
        reason = await agent.run_turn("what happened to the payment?")
        [request] = model_requests(host)
        await agent.aclose()
    assert reason == CompletedReason()
    closers = [event_to_builtins(e) for e in repaired[5:9]]
    assert closers == reference_closers
    assert repaired[9].type == "session/end-seed"
    # the model sees both synthetic results, in transcript order
    tool_texts = [
        m.content[0].content[0].text
        for m in request.messages
        if isinstance(m, ToolResultMessage)
        and isinstance(m.content[0], ToolResultBlock)
        and isinstance(m.content[0].content[0], TextBlock)
    ]
    assert tool_texts[0] == TOOL_OUTCOME_UNKNOWN_TEXT
    # durable: a fresh reader sees the closers, the seed marker and the whole second turn
    on_disk = await stored_events(root, session_id, "none" if encoding == "root-none" else "zstd")
    assert [e.seq for e in on_disk] == list(range(len(on_disk)))
    assert [event_to_builtins(e) for e in on_disk[5:9]] == reference_closers
    kinds = [e.type for e in on_disk[9:]]
    assert kinds[0] == "session/end-seed"
    assert kinds[1] == "turn/start" and on_disk[10].data.turn == 2
    assert kinds[-1] == "turn/end"
    header = next(e.data for e in on_disk if e.type == "request/header")
    assert isinstance(header, RequestHeaderData) and header.reason == "initial"


async def test_resume_is_flushed_before_the_agent_is_returned(tmp_path: Path) -> None:
    root = copy_fixture(tmp_path)
    async with persisted_host(root, [{"text": "unused"}]) as host:
        agent = await agent_service(host).resume("tool-missing-result")
        # still live and owned here; a fresh reader already sees the repair
        on_disk = await stored_events(root, "tool-missing-result")
        await agent.aclose()
    assert [e.type for e in on_disk[5:9]] == ["tool/result", "tool/result", "step/end", "turn/end"]


async def test_resume_refuses_a_second_writer(tmp_path: Path) -> None:
    root = copy_fixture(tmp_path)
    async with persisted_host(root, [{"text": "unused"}]) as first:
        agent = await agent_service(first).resume("tool-missing-result")
        async with persisted_host(root, [{"text": "unused"}]) as second:
            with pytest.raises(SessionAlreadyOwnedError):
                await agent_service(second).resume("tool-missing-result")
            assert second.ctx.sessions.list() == []
        await agent.aclose()


async def test_resume_without_persistence() -> None:
    async with open_host(scripted_rows([{"text": "x"}])) as host:
        with pytest.raises(ResumeError) as info:
            await agent_service(host).resume("anything")
    assert str(info.value) == RESUME_WITHOUT_PERSISTENCE
    assert str(info.value) == (
        "cannot resume: session persistence is not configured (load a dsh-session-persistence "
        "backend)"
    )


async def test_resume_of_a_balanced_log_adds_no_closer_and_logs_resume_header(
    tmp_path: Path,
) -> None:
    root = tmp_path / "sessions"
    async with persisted_host(root, [{"text": "first answer"}]) as host:
        agent = agent_service(host).create(session_id="calm", cwd=str(tmp_path))
        await agent.run_turn("hello")
        await agent.aclose()
    async with persisted_host(root, [{"text": "second answer"}]) as host:
        agent = await agent_service(host).resume("calm")
        before = len(agent.session.events)
        await agent.run_turn("again")
        events = list(agent.session.events)
        await agent.aclose()
    kinds = [e.type for e in events]
    assert "tool/result" not in kinds
    assert kinds[before - 1] == "session/end-seed"
    headers = [e.data.reason for e in events if isinstance(e.data, RequestHeaderData)]
    assert headers == ["initial", "resume"]
    turns = [e.data.turn for e in events if e.type == "turn/start"]
    assert turns == [1, 2]
    assert [e.seq for e in events] == list(range(len(events)))


async def test_sigkill_during_a_tool_body_then_resume(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    calls = [{"name": "charge", "arguments": {"customer": "cus_1", "cents": 4200}, "id": "call-pay"}]
    responses = [{"text": "paying now", "tool_calls": calls}]
    killed = await anyio.to_thread.run_sync(
        lambda: kill_inside_tool_body(
            tmp_path, "host", responses, root=root, session="crashy", prompt="pay invoice 42"
        )
    )
    assert killed.ledger == ["call-pay cus_1 4200"]  # the body ran, with its call id

    async with persisted_host(
        root, [{"text": "I will check whether invoice 42 was paid."}]
    ) as host:
        agent = await agent_service(host).resume("crashy")
        events = list(agent.session.events)
        reason = await agent.run_turn("did the payment go through?")
        [request] = model_requests(host)
        await agent.aclose()
    kinds = [e.type for e in events]
    call_index = kinds.index("tool/call")
    assert kinds[call_index:] == [
        "tool/call",
        "tool/result",
        "step/end",
        "turn/end",
        "session/end-seed",
    ]
    closer = events[call_index + 1]
    assert isinstance(closer.data, ToolResultData)
    assert closer.source_event_seqs == (events[call_index].seq,)
    assert isinstance(closer.data.error, ToolErrorData)
    assert closer.data.error.code == "TOOL_OUTCOME_UNKNOWN"
    end = events[call_index + 3].data
    assert isinstance(end, TurnEnd) and end.reason == InterruptedReason()
    assert reason == CompletedReason()
    last = request.messages[-1]
    assert last.content[0].text == "did the payment go through?"  # type: ignore[union-attr]
    on_disk = await stored_events(root, "crashy")
    assert [e.seq for e in on_disk] == list(range(len(on_disk)))
    assert [e.type for e in on_disk].count("turn/end") == 2

"""Turn-end kinds beyond DSH's seven survive PostgreSQL (issue 14 item 4): the loop guard's
``max-turn-requests`` and a plugin-added kind the reader does not know read back verbatim, and
repair sees a closed turn."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from dsh_host import Row, open_host
from dsh_host._session.events import (
    MaxTurnRequestsReason,
    TurnEnd,
    UnknownTurnEndReason,
    event_to_builtins,
    register_turn_end_reason,
)
from dsh_host._session.repair import interrupted_turn_closers
from dsh_host._tools import ToolDefinition, ToolExecution, text_output

from .helpers import backend, stored_rows

pytestmark = pytest.mark.anyio


async def poll(args: Any, exec: ToolExecution) -> Any:
    return "still running"


async def read_back(dsn: str, schema: str, session_id: str) -> list[Any]:
    async with backend(dsn, schema) as fresh:
        handle = await fresh.open(session_id, "read")
        load = await handle.read()
        await handle.close()
    return list(load.events)


async def test_a_step_limited_turn_is_stored_and_read_back(pg_dsn: str, pg_schema: str) -> None:
    looping = [{"tool_calls": [{"name": "poll", "arguments": {}}]}] * 10
    rows = [
        Row(name="sessions"),
        Row(name="session-persistence-postgres", config={"dsn": pg_dsn, "schema": pg_schema}),
        Row(name="llm"),
        Row(name="tools"),
        Row(id="model", name="llm-scripted", config={"responses": looping}),
        Row(
            name="agent", config={"provider": "scripted", "model": "scripted", "maxStepsPerTurn": 3}
        ),
    ]
    async with open_host(rows) as host:
        host.ctx.tools.register(
            ToolDefinition(
                name="poll",
                description="poll",
                parameters={"type": "object"},
                execute=poll,
                output=text_output(),
            )
        )
        agent = host.ctx.agent.create(session_id="pg-limit")
        reason = await agent.run_turn("wait")
        await agent.aclose()
    assert reason == MaxTurnRequestsReason(limit=3)
    events = await read_back(pg_dsn, pg_schema, "pg-limit")
    assert len(stored_rows(pg_dsn, pg_schema, "pg-limit")) == len(events)
    end = events[-1]
    assert isinstance(end.data, TurnEnd) and end.data.reason == MaxTurnRequestsReason(limit=3)
    assert [e.type for e in events].count("tool/result") == 3
    assert interrupted_turn_closers(events) == []


class _PluginKind(
    msgspec.Struct, frozen=True, kw_only=True, tag="awaiting-approval", tag_field="kind"
):
    pending: tuple[str, ...]


async def test_an_unregistered_kind_reads_back_verbatim(pg_dsn: str, pg_schema: str) -> None:
    rows = [
        Row(name="sessions"),
        Row(name="session-persistence-postgres", config={"dsn": pg_dsn, "schema": pg_schema}),
    ]
    dispose = register_turn_end_reason(_PluginKind)
    try:
        async with open_host(rows) as host:
            session = host.ctx.sessions.create("pg-kind", meta={"cwd": "/p"})
            session.append("turn/start", {"turn": 1})
            session.append(
                "turn/end", {"turn": 1, "reason": {"kind": "awaiting-approval", "pending": ["c1"]}}
            )
            await host.ctx.sessions.flush(session)
    finally:
        dispose()
    [_, end] = await read_back(pg_dsn, pg_schema, "pg-kind")
    assert isinstance(end.data.reason, UnknownTurnEndReason)
    assert event_to_builtins(end)["data"]["reason"] == {
        "kind": "awaiting-approval",
        "pending": ["c1"],
    }
    assert interrupted_turn_closers([_, end]) == []

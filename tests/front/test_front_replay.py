"""``dsh_host.replay(agent, id)``: the harness replay from Python (D32). A session recorded by an
``Agent`` over the JSONL store is derived again by an agent composed the same way (identical) and
by agents whose instructions or tools changed (the part that differs is named)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import dsh_host
from dsh_host import Agent, tool

from .front_helpers import script


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool(name="add")
def add_three(a: int, b: int, c: int = 0) -> int:
    """Add two integers."""
    return a + b + c


ADDING: list[dict[str, Any]] = [
    {"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}}]},
    {"text": "It is 5."},
]


@pytest.mark.anyio
async def test_replay_names_what_the_current_agent_derives_differently(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    model = script(tmp_path, ADDING)
    async with Agent(model, tools=[add], instructions="Be exact.", store=root) as agent:
        session_id = (await agent.run("What is 2+3?")).session_id
    async with Agent(model, tools=[add], instructions="Be exact.", store=root) as same:
        report = await dsh_host.replay(same, session_id)
    assert report.identical, report
    assert [(s["turn"], s["step"]) for s in report.steps] == [(1, 1), (1, 2)]
    async with Agent(model, tools=[add], instructions="Be vague.", store=root) as other:
        report = await dsh_host.replay(other, session_id)
    assert not report.identical
    assert {d.part for d in report.differences} == {"system prompt"}
    assert "+Be vague." in str(report) and "-Be exact." in str(report)
    async with Agent(model, tools=[add_three], instructions="Be exact.", store=root) as wider:
        report = await dsh_host.replay(wider, session_id)
    assert [(d.turn, d.step, d.part, d.detail) for d in report.differences] == [
        (1, 1, "tool schemas", "tool add: its schema differs"),
        (1, 2, "tool schemas", "tool add: its schema differs"),
    ]

"""Handoff: the rest of a turn goes to another declared agent, in the same session (D34).

In process, on a real JSONL store, with scripted models on two routes: who answers after the
handoff (its route, its instructions, its tools), what the log records, and that the next turn
is the calling agent's again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from dsh_subagents import HANDOFF_EVENT

from dsh_host import Row
from dsh_host._front import Agent, tool
from dsh_host.errors import ConfigError

from .test_crash import (
    BACKENDS,
    _dsh,
    _events,
    _is_error,
    _run_parent,
    _store_rows,
    _text,
    _tool_rows,
    _turn_end,
)
from .test_crash import _results as _balanced
from .test_delegation import _model_row, _results, _script


@pytest.fixture
def anyio_backend() -> str:
    return "trio"


def _handoff(call_id: str, agent: str) -> dict[str, Any]:
    return {"name": "handoff", "id": call_id, "arguments": {"agent": agent, "reason": "billing"}}


def _rows(tmp: Path, billing: list[dict[str, Any]], **extra: Any) -> list[Row]:
    return [
        _model_row(tmp, "scripted-b", billing),
        Row(
            id="subagents",
            name="subagents",
            config={
                "agents": [
                    {
                        "name": "billing",
                        "description": "answers billing questions",
                        "instructions": "You are the billing desk.",
                        "provider": "scripted-b",
                        "model": "scripted",
                        "tools": [],
                    }
                ],
                "handoffs": ["billing"],
                **extra,
            },
        ),
    ]


@pytest.mark.anyio
async def test_the_target_answers_the_rest_of_the_turn(tmp_path: Path) -> None:
    @tool
    def lookup(key: str) -> str:
        """Look a key up."""
        return key

    parent = _script(
        tmp_path / "parent.yml",
        [{"tool_calls": [_handoff("h1", "billing")]}, {"text": "triage again"}],
    )
    rows = _rows(tmp_path, [{"text": "your invoice is paid"}])
    async with Agent(
        model=f"scripted:{parent}",
        instructions="You are triage.",
        tools=[lookup],
        store=tmp_path / "s",
        rows=rows,
    ) as agent:
        first = await agent.run("is my invoice paid?")
        assert first.output == "your invoice is paid"
        second = await agent.run("thanks")
        assert second.output == "triage again"
        events = list(agent.session.events)
    assert _results(agent.session)["h1"] == (
        False,
        'Transferred to agent "billing": it answers the rest of this turn with its own '
        "instructions and tools.",
    )
    (record,) = [e for e in events if e.type == "dsh-subagents/handoff"]
    assert record.ignorable
    assert dict(record.data) == {
        "turn": 1,
        "callId": "h1",
        "from": None,
        "to": "billing",
        "reason": "billing",
    }
    headers = [e.data.header for e in events if e.type == "request/header"]
    routes = [(h.config.provider, h.config.model) for h in headers]
    assert routes[0] != ("scripted-b", "scripted")
    assert ("scripted-b", "scripted") in routes, "the target's requests use its route"
    assert routes[-1] == routes[0], "the next turn is the calling agent's again"
    billing = [h for h in headers if h.config.provider == "scripted-b"]
    assert all(not h.tools for h in billing), "billing declares no tools"
    prompts = [
        "".join(getattr(block, "text", "") for block in e.data.message.content)
        for e in events
        if e.type == "system/message"
    ]
    assert len(prompts) == 3, "a prompt for each agent change: triage, billing, triage"
    assert "You are triage." in prompts[0] and "billing desk" not in prompts[0]
    assert "You are the billing desk." in prompts[1] and "You are triage." not in prompts[1]
    assert prompts[2] == prompts[0]
    ends = [type(e.data.reason).__name__ for e in events if e.type == "turn/end"]
    assert ends == ["CompletedReason", "CompletedReason"]


@pytest.mark.anyio
async def test_a_handoff_to_an_undeclared_agent_is_refused_at_load(tmp_path: Path) -> None:
    parent = _script(tmp_path / "parent.yml", [{"text": "x"}])
    rows = _rows(tmp_path, [{"text": "y"}])
    rows[1] = Row(
        id="subagents",
        name="subagents",
        config={**(rows[1].config or {}), "handoffs": ["billing", "refunds"]},
    )
    with pytest.raises(ConfigError) as raised:
        async with Agent(model=f"scripted:{parent}", store=tmp_path / "s", rows=rows):
            pass
    assert "handoffs[1] 'refunds' is not a declared agent" in str(raised.value)


HANDOFF_SCRIPT = {"responses": [{"tool_calls": [_handoff("h1", "billing")]}, {"text": "x"}]}


def _handoff_composition(tmp: Path, backend: str, point: str, schema: str | None) -> Path:
    (tmp / "parent.yml").write_text(yaml.safe_dump(HANDOFF_SCRIPT))
    (tmp / "billing.yml").write_text(yaml.safe_dump({"responses": [{"text": "paid"}]}))
    rows = [
        *_store_rows(tmp, backend, schema),
        {
            "id": "model-b",
            "name": "llm-scripted",
            "config": {"provider": "scripted-b", "path": str(tmp / "billing.yml")},
        },
        *_tool_rows(point),
        {
            "id": "subagents",
            "name": "subagents",
            "config": {
                "agents": [
                    {
                        "name": "billing",
                        "description": "answers billing questions",
                        "provider": "scripted-b",
                        "model": "scripted",
                    }
                ],
                "handoffs": ["billing"],
            },
        },
        {"id": "agent", "name": "agent"},
    ]
    path = tmp / "dsh.yml"
    path.write_text(yaml.safe_dump(rows, sort_keys=False))
    return path


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("point", ["handoff-started", "handoff-recorded"])
def test_resume_after_a_kill_in_a_handoff_is_honest(
    tmp_path: Path, backend: str, point: str, pg_schema: str | None
) -> None:
    config = _handoff_composition(tmp_path, backend, point, pg_schema)
    crashed = _run_parent(tmp_path, config, "p1")
    assert crashed.returncode == -9, (crashed.returncode, crashed.stdout, crashed.stderr)
    assert f"kill {point}" in crashed.stdout
    before = _events(tmp_path, config, "p1")
    assert before is not None
    records = [e for e in before if e["type"] == HANDOFF_EVENT]
    assert len(records) == (1 if point == "handoff-recorded" else 0)
    assert not [e for e in before if e["type"] == "tool/result"]

    resumed = _dsh(tmp_path, "resume", "p1", "--config", str(config))
    assert resumed.returncode == 0, (resumed.stdout, resumed.stderr)
    after = _events(tmp_path, config, "p1")
    assert after is not None
    (result,) = _balanced(after)["h1"]  # exactly one result; every turn closed
    assert _turn_end(after) == "interrupted"
    if point == "handoff-recorded":
        assert not _is_error(result) and "error" not in result, result
        assert _text(result).startswith('Transferred to agent "billing"')
        assert records[0]["ignorable"] is True
        assert records[0]["data"]["callId"] == "h1" and records[0]["data"]["to"] == "billing"
    else:
        assert result["error"]["code"] == "TOOL_NOT_STARTED", result
        assert 'the handoff to "billing" was never recorded' in _text(result)

"""``Agent(...)``: composition, stores (JSONL, PostgreSQL, memory, the CLI's), resume, run_sync."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path
from typing import Any

import anyio
import msgspec
import psycopg
import pytest
from psycopg import sql

from dsh_host import Agent, RunResult, tool
from dsh_host._session.events import CompletedReason
from dsh_host._tools import ToolRegistrationError
from dsh_host.errors import ConfigError

from .front_helpers import events_of, script

# both backends: the agent loop through the front door
pytestmark = pytest.mark.both_backends

PG_DSN = "postgresql://postgres@127.0.0.1:5432/test"


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


ADDING: list[dict[str, Any]] = [
    {"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}}],
     "usage": {"input_tokens": 7, "output_tokens": 3}},
    {"text": "It is 5.", "usage": {"input_tokens": 11, "output_tokens": 4}},
]


def stored(root: Path) -> list[Path]:
    return sorted(root.rglob("session.v3.jsonl.zstd"))


@pytest.mark.anyio
async def test_run_returns_the_answer_the_turn_end_and_the_summed_usage(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    async with Agent(script(tmp_path, ADDING), tools=[add], store=root) as agent:
        result = await agent.run("What is 2+3?")
        session_id = agent.session_id
    assert isinstance(result, RunResult)
    assert result.output == "It is 5."
    assert result.session_id == session_id and result.turn == 1
    assert result.turn_end == CompletedReason() and result.completed
    assert result.usage is not None
    assert (result.usage.input_tokens, result.usage.output_tokens) == (18, 7)
    assert result.usage.requests == 2
    (path,) = stored(root)
    assert session_id in str(path)


@pytest.mark.anyio
async def test_resume_continues_a_stored_session_in_a_new_agent(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    model = script(tmp_path, [*ADDING, {"text": "Still 5."}])
    async with Agent(model, tools=[add], store=root) as agent:
        first = await agent.run("What is 2+3?")
    again = script(tmp_path, [{"text": "Still 5."}], "again.json")
    async with Agent(again, tools=[add], store=root) as agent:
        await agent.resume(first.session_id)
        second = await agent.run("And now?")
        history = [e.type for e in events_of(agent, "turn/start")]
    assert second.session_id == first.session_id
    assert second.turn == 2 and second.output == "Still 5."
    assert history == ["turn/start", "turn/start"]
    assert len(stored(root)) == 1


@pytest.mark.anyio
async def test_fork_continues_on_a_copy_and_leaves_the_parent_as_it_was(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    model = script(tmp_path, [*ADDING, {"text": "Forked answer."}])
    async with Agent(model, tools=[add], store=root) as agent:
        first = await agent.run("What is 2+3?")
        child_id = await agent.fork()
        forked = await agent.run("And in the fork?")
        assert agent.session.header.parent_session == first.session_id
    assert child_id != first.session_id
    assert (forked.session_id, forked.turn, forked.output) == (child_id, 2, "Forked answer.")
    assert len(stored(root)) == 2
    resumed = script(tmp_path, [{"text": "Back in the parent."}], "parent.json")
    async with Agent(resumed, tools=[add], store=root) as agent:
        await agent.resume(first.session_id)
        assert [e.data.turn for e in events_of(agent, "turn/start")] == [1]  # untouched
        back = await agent.run("Back?")
        await agent.resume(child_id)
        child_turns = [e.data.turn for e in events_of(agent, "turn/start")]
    assert (back.session_id, back.turn) == (first.session_id, 2)
    assert child_turns == [1, 2]


@pytest.mark.anyio
async def test_store_none_keeps_everything_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    async with Agent(script(tmp_path, ADDING), tools=[add], store=None) as agent:
        result = await agent.run("What is 2+3?")
        assert agent.host.ctx.get("sessionPersistence") is None
    assert result.output == "It is 5."
    assert stored(tmp_path) == []
    names = [row.name for row in Agent("demo", store=None).rows()]
    assert names[0] == "llm-scripted" and names[-1] == "agent"
    assert {"sessions", "llm", "tools", "user-approval"} <= set(names)
    assert not any(n.startswith("session-persistence") for n in names)
    assert "builtin-tools" not in names and "sandbox-local" not in names
    # skills' scripts need bash and hooks run confined: kept only with a sandbox mode
    assert "skills" not in names and "hooks" not in names
    sandboxed = [row.name for row in Agent("demo", store=None, sandbox="read-only").rows()]
    assert {"builtin-tools", "sandbox-local", "skills", "hooks"} <= set(sandboxed)


@pytest.mark.anyio
async def test_the_default_store_is_the_one_the_cli_uses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DSH_SESSION_ROOT", raising=False)
    async with Agent(script(tmp_path, ADDING), tools=[add]) as agent:
        result = await agent.run("What is 2+3?")
    with anyio.fail_after(120):
        shown = await anyio.run_process(
            [sys.executable, "-m", "dsh_host", "sessions", "show", result.session_id],
            cwd=tmp_path, check=False,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
    assert shown.returncode == 0, shown.stderr.decode()  # the CLI finds the library's session
    assert "What is 2+3?" in shown.stdout.decode()
    persistence = next(r for r in Agent("demo").rows() if r.id == "session-persistence")
    assert persistence.name == "session-persistence-jsonl"

    # A composition named by $DSH_CONFIG is what the CLI reads first (D16: a ./dsh.yml only
    # when trusted), so it is what the default store follows too.
    (tmp_path / "team.yml").write_text(
        "- name: sessions\n- name: session-persistence-jsonl\n  config: {root: ./elsewhere}\n"
    )
    monkeypatch.setenv("DSH_CONFIG", str(tmp_path / "team.yml"))
    async with Agent(script(tmp_path, ADDING, "b.json"), tools=[add]) as agent:
        moved = await agent.run("What is 2+3?")
    assert any(moved.session_id in str(p) for p in stored(tmp_path / "elsewhere"))


@pytest.mark.anyio
async def test_the_composition_s_other_rows_apply_to_the_library(tmp_path: Path) -> None:
    composition = tmp_path / "team.yml"
    composition.write_text(
        "- name: sessions\n- name: llm\n- name: tools\n"
        "- id: no-adding\n  name: tool-rules\n"
        "  config: {rules: [{tool: add, decision: deny, reason: adding is off today}]}\n"
        "- name: agent\n  config: {persona: From the YAML.}\n"
    )
    async with Agent(
        script(tmp_path, ADDING), tools=[add], store=None, composition=composition
    ) as agent:
        await agent.run("What is 2+3?")
        (system,) = events_of(agent, "system/message")
        (result,) = events_of(agent, "tool/result")
    assert "From the YAML." in system.data.message.content[0].text
    assert result.data.message.content[0].content[0].text == "Error: adding is off today"
    assert [r.id for r in agent.rows()].count("no-adding") == 1


@pytest.mark.anyio
async def test_a_postgresql_dsn_stores_sessions_in_postgresql(tmp_path: Path) -> None:
    try:
        with psycopg.connect(PG_DSN, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as error:
        pytest.skip(f"no PostgreSQL at {PG_DSN}: {error}")
    schema = f"dsh_front_{uuid.uuid4().hex[:10]}"
    overrides = {"session-persistence": {"schema": schema}}
    try:
        async with Agent(
            script(tmp_path, ADDING), tools=[add], store=PG_DSN, config=overrides
        ) as agent:
            first = await agent.run("What is 2+3?")
        async with Agent(
            script(tmp_path, [{"text": "Still 5."}], "b.json"), store=PG_DSN, config=overrides
        ) as agent:
            await agent.resume(first.session_id)
            second = await agent.run("And now?")
        assert (second.session_id, second.turn, second.output) == (first.session_id, 2, "Still 5.")
        with psycopg.connect(PG_DSN) as conn:
            tables = conn.execute(
                "SELECT count(*) FROM information_schema.tables WHERE table_schema = %s", (schema,)
            ).fetchone()
        assert tables is not None and tables[0] > 0
    finally:
        with psycopg.connect(PG_DSN, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


@pytest.mark.anyio
async def test_instructions_are_the_system_prompts_persona(tmp_path: Path) -> None:
    model = script(tmp_path, [{"text": "ok"}])
    async with Agent(model, instructions="You are terse. Model: {{model}}.", store=None) as agent:
        await agent.run("hi")
        (system,) = events_of(agent, "system/message")
    text = "".join(block.text for block in system.data.message.content)
    assert "You are terse. Model: scripted." in text
    # The caller's instructions are the agent's identity: no harness identity line above them.
    assert "DeepSeek Harness" not in text, text


@pytest.mark.anyio
async def test_without_instructions_the_harness_identity_stays(tmp_path: Path) -> None:
    model = script(tmp_path, [{"text": "ok"}])
    async with Agent(model, store=None) as agent:
        await agent.run("hi")
        (system,) = events_of(agent, "system/message")
    text = "".join(block.text for block in system.data.message.content)
    assert text.startswith("You are an AI agent powered by DeepSeek Harness."), text


@pytest.mark.anyio
async def test_sandbox_adds_the_confined_builtin_tools(tmp_path: Path) -> None:
    (tmp_path / "hello.txt").write_text("hi there\n")
    model = script(tmp_path, [
        {"tool_calls": [{"name": "read_file", "arguments": {"path": "hello.txt"}}]},
        {"text": "read it"},
    ])
    async with Agent(model, store=None, sandbox="read-only", workspace=tmp_path) as agent:
        await agent.run("read hello.txt")
        assert "read_file" in agent.host.ctx.tools.names()
        (result,) = events_of(agent, "tool/result")
    assert "hi there" in result.data.message.content[0].content[0].text


def test_run_sync_runs_a_turn_and_continues_the_session(tmp_path: Path) -> None:
    agent = Agent(script(tmp_path, ADDING), tools=[add], store=tmp_path / "s")
    first = agent.run_sync("What is 2+3?")
    second = agent.run_sync("Once more?", backend="asyncio")  # a new host: the script restarts
    assert (first.output, first.turn) == ("It is 5.", 1)
    assert (second.output, second.turn, second.session_id) == ("It is 5.", 2, first.session_id)
    assert len(stored(tmp_path / "s")) == 1


def test_bad_arguments_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"Agent\(model=\.\.\.\) 'gpt' is not a model spec; use"):
        Agent("gpt")
    with pytest.raises(ConfigError, match=r"script file nope\.yml does not exist"):
        Agent("scripted:nope.yml")
    with pytest.raises(ConfigError, match=r"no row has id 'agnet'; the rows are .*agent"):
        Agent("demo", config={"agnet": {"persona": "x"}})
    with pytest.raises(ConfigError, match=r"Agent.sandbox='none'."):
        Agent("demo", sandbox="none")  # type: ignore[arg-type]
    with pytest.raises(ToolRegistrationError, match='names tool "add" twice'):
        Agent("demo", tools=[add, add])
    with pytest.raises(ToolRegistrationError, match="takes @tool functions"):
        Agent("demo", tools=[len])  # type: ignore[list-item]
    agent: Any = Agent("demo", store=None)
    with pytest.raises(Exception, match="the Agent is not open"):
        _ = agent.host


@pytest.mark.anyio
async def test_approvals_that_wait_through_the_front_door(tmp_path: Path) -> None:
    """``approval="defer"``: the turn ends awaiting approval, a later (here: resumed) agent
    lists the call, decides it, and continue_turn() runs it exactly once (D19)."""
    charges: list[str] = []

    @tool(approval="ask")
    def charge(customer: str) -> str:
        """Charge a customer."""
        charges.append(customer)
        return f"charged {customer}"

    root = tmp_path / "sessions"
    first = [{"tool_calls": [{"name": "charge", "arguments": {"customer": "cus_1"}}]}]
    async with Agent(
        script(tmp_path, first), tools=[charge], store=root, approval="defer"
    ) as agent:
        waiting = await agent.run("Charge cus_1")
        session_id = agent.session_id
    assert msgspec.to_builtins(waiting.turn_end)["kind"] == "awaiting-approval"
    assert charges == []
    later = script(tmp_path, [{"text": "Charged."}], "later.json")
    async with Agent(later, tools=[charge], store=root, approval="defer") as agent:
        await agent.resume(session_id)
        [pending] = agent.pending_approvals()
        assert pending.tool_name == "charge"
        await agent.decide(pending.call_id, "allow", reason="looks right")
        done = await agent.continue_turn()
    assert done.completed and done.output == "Charged."
    assert charges == ["cus_1"]

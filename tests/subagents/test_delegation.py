"""Delegation through the front door, in process, on a real JSONL store (D24).

What a child may see and do (its tools, its depth), who answers its approvals, what cancelling the
parent does to it, what a wider sandbox does at load, and the host's check on a repair refiner.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml

from dsh_host import Row
from dsh_host._agent import AGENT, ApprovalDecisionError, ResumeError
from dsh_host._agent.service import AgentService
from dsh_host._front import Agent, tool
from dsh_host._session.events import SessionEvent, decode_event
from dsh_host._tools import ApprovalRequest
from dsh_host.errors import BootError

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "trio"


def _script(path: Path, responses: list[dict[str, Any]]) -> str:
    path.write_text(yaml.safe_dump({"responses": responses}))
    return str(path)


def _delegate(call_id: str, agent: str, prompt: str = "go") -> dict[str, Any]:
    return {
        "name": "subagent",
        "id": call_id,
        "arguments": {"agent": agent, "description": f"task {call_id}", "prompt": prompt},
    }


def _model_row(tmp: Path, provider: str, responses: list[dict[str, Any]]) -> Row:
    path = _script(tmp / f"{provider}.yml", responses)
    return Row(
        id=f"model-{provider}", name="llm-scripted", config={"provider": provider, "path": path}
    )


def _agents(*agents: dict[str, Any], max_depth: int = 2) -> Row:
    return Row(
        id="subagents", name="subagents", config={"agents": list(agents), "max_depth": max_depth}
    )


def _child(name: str, provider: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "description": f"the {name} agent",
        "provider": provider,
        "model": "scripted",
        **extra,
    }


def _results(session: Any) -> dict[str, tuple[bool, str]]:
    out: dict[str, tuple[bool, str]] = {}
    for event in session.events:
        if event.type == "tool/result":
            block = event.data.message.content[0]
            text = "".join(getattr(part, "text", "") for part in block.content)
            out[event.data.message.source.call_id] = (bool(block.is_error), text)
    return out


async def _stored(agent: Agent, session_id: str) -> list[SessionEvent]:
    store = agent.host.ctx.get("sessionPersistence")
    assert store is not None
    return list((await store.inspect(session_id)).events)


def _texts(events: list[SessionEvent]) -> dict[str, tuple[bool, str]]:
    out: dict[str, tuple[bool, str]] = {}
    for event in events:
        if event.type == "tool/result":
            block = event.data.message.content[0]
            text = "".join(getattr(part, "text", "") for part in block.content)
            out[event.data.message.source.call_id] = (bool(block.is_error), text)
    return out


async def test_a_child_sees_and_calls_only_its_tools(tmp_path: Path) -> None:
    @tool
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    parent = _script(
        tmp_path / "parent.yml",
        [
            {"tool_calls": [_delegate("d1", "alpha"), _delegate("d2", "beta")]},
            {"text": "done"},
        ],
    )
    call_add = {"tool_calls": [{"name": "add", "id": "x1", "arguments": {"a": 2, "b": 3}}]}
    rows = [
        _model_row(tmp_path, "scripted-a", [call_add, {"text": "five"}]),
        _model_row(tmp_path, "scripted-b", [call_add, {"text": "no add"}]),
        _agents(
            _child("alpha", "scripted-a", tools=["add"]), _child("beta", "scripted-b", tools=[])
        ),
    ]
    async with Agent(
        model=f"scripted:{parent}", tools=[add], store=tmp_path / "s", rows=rows
    ) as agent:
        result = await agent.run("go")
        sid = agent.session_id
        assert result.output == "done"
        assert _results(agent.session) == {"d1": (False, "five"), "d2": (False, "no add")}
        alpha = await _stored(agent, f"{sid}--d1")
        beta = await _stored(agent, f"{sid}--d2")
    assert _texts(alpha)["x1"] == (False, "5")
    refused = _texts(beta)["x1"]
    assert refused[0] and 'tool "add" is not available to sub-agent "beta"' in refused[1]
    offered = [e.data for e in beta if e.type == "request/header"]
    assert all(not header.header.tools for header in offered), "beta is offered no tool"


async def test_depth_is_recorded_and_limited(tmp_path: Path) -> None:
    parent = _script(
        tmp_path / "parent.yml",
        [
            {"tool_calls": [_delegate("d1", "alpha")]},
            {"text": "top"},
        ],
    )
    rows = [
        # alpha (depth 1) delegates to beta (depth 2); beta tries to delegate once more
        _model_row(
            tmp_path,
            "scripted-a",
            [
                {"tool_calls": [_delegate("g1", "beta")]},
                {"text": "alpha done"},
            ],
        ),
        _model_row(
            tmp_path,
            "scripted-b",
            [
                {"tool_calls": [_delegate("h1", "alpha")]},
                {"text": "beta done"},
            ],
        ),
        _agents(
            _child("alpha", "scripted-a", tools=["subagent"]),
            _child("beta", "scripted-b", tools=["subagent"]),
            max_depth=2,
        ),
    ]
    async with Agent(model=f"scripted:{parent}", store=tmp_path / "s", rows=rows) as agent:
        await agent.run("go")
        sid = agent.session_id
        alpha_id, beta_id = f"{sid}--d1", f"{sid}--d1--g1"
        store = agent.host.ctx.get("sessionPersistence")
        assert store is not None
        beta_load = await store.inspect(beta_id)
        alpha_load = await store.inspect(alpha_id)
    assert alpha_load.header.delegation_depth == 1
    assert beta_load.header.delegation_depth == 2
    assert beta_load.header.parent_session == alpha_id
    assert beta_load.header.origin == "subagent"
    error, text = _texts(list(beta_load.events))["h1"]
    assert error and "not available" in text, "at max_depth the tool is refused"
    headers = [e.data for e in beta_load.events if e.type == "request/header"]
    assert all(not h.header.tools for h in headers), "and not offered"
    assert _texts(list(alpha_load.events))["g1"] == (False, "beta done")


async def test_approvals_of_a_child_go_to_the_parents_answerer(tmp_path: Path) -> None:
    @tool(approval="ask")
    def deploy() -> str:
        """Deploy."""
        return "deployed"

    asked: list[str] = []

    def answer(request: ApprovalRequest) -> bool:
        session = getattr(request.agent, "session", None)
        asked.append(f"{request.tool_name}@{getattr(session, 'id', None)}")
        return True

    parent = _script(
        tmp_path / "parent.yml",
        [
            {"tool_calls": [_delegate("d1", "alpha")]},
            {"text": "ok"},
        ],
    )
    rows = [
        _model_row(
            tmp_path,
            "scripted-a",
            [
                {"tool_calls": [{"name": "deploy", "id": "y1"}]},
                {"text": "alpha deployed"},
            ],
        ),
        _agents(_child("alpha", "scripted-a", tools=["deploy"])),
    ]
    async with Agent(
        model=f"scripted:{parent}", tools=[deploy], approval=answer, store=tmp_path / "s", rows=rows
    ) as agent:
        await agent.run("go")
        sid = agent.session_id
        child = await _stored(agent, f"{sid}--d1")
    assert asked == [f"deploy@{sid}--d1"]
    kinds = [e.type for e in child]
    assert "approval/asked" in kinds and "approval/decided" in kinds, "recorded in the child"
    assert _texts(child)["y1"] == (False, "deployed")


async def test_cancelling_the_parent_cancels_the_child(tmp_path: Path) -> None:
    started = anyio.Event()

    @tool
    async def ready() -> str:  # async: it runs on the event loop, where the Event lives
        """Say the child is running."""
        started.set()
        return "ok"

    parent = _script(tmp_path / "parent.yml", [{"tool_calls": [_delegate("d1", "alpha")]}])
    rows = [
        # the child calls `ready`, then its next request hangs until it is cancelled
        _model_row(
            tmp_path,
            "scripted-a",
            [
                {"tool_calls": [{"name": "ready", "id": "r1"}]},
                {"text": "thinking", "hang": True},
            ],
        ),
        _agents(_child("alpha", "scripted-a", tools=["ready"])),
    ]
    async with Agent(
        model=f"scripted:{parent}", tools=[ready], store=tmp_path / "s", rows=rows
    ) as agent:
        stream = agent.stream("go")
        async with stream:
            async with anyio.create_task_group() as group:

                async def cancel_once_the_child_runs() -> None:
                    await started.wait()
                    stream.cancel()

                group.start_soon(cancel_once_the_child_runs)
                async for _event in stream:
                    pass
        sid = agent.session_id
        child = await _stored(agent, f"{sid}--d1")
        parent_events = await _stored(agent, sid)
    ends = [e.data for e in child if e.type == "turn/end"]
    assert len(ends) == 1 and type(ends[0].reason).__name__ == "AbortedReason", ends
    (result,) = [e for e in parent_events if e.type == "tool/result"]
    assert result.data.message.content[0].is_error
    (end,) = [e.data.reason for e in parent_events if e.type == "turn/end"]
    assert type(end).__name__ == "AbortedReason"


async def test_a_child_wider_than_its_parent_is_refused_at_load(tmp_path: Path) -> None:
    parent = _script(tmp_path / "parent.yml", [{"text": "hi"}])
    (tmp_path / "w").mkdir()
    rows = [_agents(_child("alpha", "scripted", sandbox="workspace-write"))]
    agent = Agent(
        model=f"scripted:{parent}",
        store=tmp_path / "s",
        sandbox="read-only",
        workspace=tmp_path / "w",
        rows=rows,
    )
    with pytest.raises(BootError) as caught:
        async with agent:
            pass
    message = str(caught.value)
    assert (
        "agent \"alpha\" asks for sandbox 'workspace-write', wider than the parent's "
        "'read-only'" in message
    )


async def test_a_narrower_child_loads(tmp_path: Path) -> None:
    parent = _script(tmp_path / "parent.yml", [{"text": "hi"}])
    (tmp_path / "w").mkdir()
    rows = [_agents(_child("alpha", "scripted", sandbox="read-only"))]
    async with Agent(
        model=f"scripted:{parent}",
        store=tmp_path / "s",
        sandbox="workspace-write",
        workspace=tmp_path / "w",
        rows=rows,
    ) as agent:
        assert (await agent.run("hi")).output == "hi"


def _closer(seq: int, call_id: str, text: str) -> SessionEvent:
    return decode_event({
        "type": "tool/result", "seq": seq, "time": 1, "surfaceOp": "append",
        "data": {"turn": 1, "step": 1, "message": {
            "id": f"m{seq}", "role": "user", "source": {"kind": "tool", "callId": call_id},
            "content": [{"type": "tool-result", "toolCallId": call_id, "isError": True,
                         "content": [{"type": "text", "text": text}]}]}},
    }, where="test")  # fmt: skip


async def test_a_refiner_may_only_replace_a_result_in_place(tmp_path: Path) -> None:
    parent = _script(tmp_path / "parent.yml", [{"text": "hi"}])
    async with Agent(model=f"scripted:{parent}", store=tmp_path / "s") as agent:
        service: AgentService = agent.host.ctx.agent
        closers = [_closer(5, "c1", "unknown")]

        async def same_call(sid: str, events: Any, found: list[SessionEvent]) -> Any:
            return [_closer(5, "c1", "refined")]

        undo = service.repair_refiner(same_call)
        (refined,) = await service.refine_closers("s", [], closers)
        assert _texts([refined])["c1"] == (True, "refined")
        undo()
        for bad in (
            [],  # dropped
            [_closer(5, "c1", "a"), _closer(6, "c1", "b")],  # added
            [_closer(5, "c2", "other call")],
            [_closer(6, "c1", "moved")],
        ):

            async def refiner(sid: str, events: Any, found: Any, bad: Any = bad) -> Any:
                return bad

            undo = service.repair_refiner(refiner)
            with pytest.raises(ResumeError, match="repair refiner"):
                await service.refine_closers("s", [], closers)
            undo()


async def test_a_narrower_child_runs_bash_under_its_own_mode(tmp_path: Path) -> None:
    workspace = tmp_path / "w"
    workspace.mkdir()

    def bash(call_id: str, command: str) -> dict[str, Any]:
        return {"name": "bash", "id": call_id, "arguments": {"command": command}}

    parent = _script(
        tmp_path / "parent.yml",
        [
            {"tool_calls": [bash("p1", "touch by-parent")]},
            {"tool_calls": [_delegate("d1", "reader")]},
            {"text": "done"},
        ],
    )
    rows = [
        _model_row(
            tmp_path,
            "scripted-r",
            [
                {"tool_calls": [bash("c1", "touch by-child")]},
                # an escalation past the ceiling is refused before anything runs
                {
                    "tool_calls": [
                        {
                            "name": "bash",
                            "id": "c2",
                            "arguments": {
                                "command": "touch escalated",
                                "sandbox_permissions": "workspace-write",
                                "justification": "needs to write",
                            },
                        }
                    ]
                },
                {"text": "tried"},
            ],
        ),
        _agents(_child("reader", "scripted-r", tools=["bash"], sandbox="read-only")),
    ]
    async with Agent(
        model=f"scripted:{parent}",
        store=tmp_path / "s",
        sandbox="workspace-write",
        workspace=workspace,
        approval=lambda request: True,
        rows=rows,
    ) as agent:
        await agent.run("go")
        child = await _stored(agent, f"{agent.session_id}--d1")
    assert (workspace / "by-parent").exists(), "the parent writes under workspace-write"
    assert not (workspace / "by-child").exists(), "the read-only child cannot"
    assert not (workspace / "escalated").exists()
    results = _texts(child)
    assert "[sandbox: file access denied under read-only mode]" in results["c1"][1]
    assert results["c2"][0] and "wider than this sub-agent's ceiling" in results["c2"][1]


async def test_a_child_stops_at_its_step_cap(tmp_path: Path) -> None:
    @tool
    async def noop() -> str:
        """Do nothing."""
        return "nothing"

    parent = _script(
        tmp_path / "parent.yml",
        [
            {"tool_calls": [_delegate("d1", "alpha")]},
            {"text": "done"},
        ],
    )
    loop = {"tool_calls": [{"name": "noop", "id": "n1"}]}
    rows = [
        _model_row(tmp_path, "scripted-a", [loop, {"text": "never reached"}]),
        _agents(_child("alpha", "scripted-a", tools=["noop"], max_steps=1)),
    ]
    async with Agent(
        model=f"scripted:{parent}", tools=[noop], store=tmp_path / "s", rows=rows
    ) as agent:
        await agent.run("go")
        error, text = _results(agent.session)["d1"]
        sid = agent.session_id
        child = await _stored(agent, f"{sid}--d1")
    assert error and 'ended its turn "max-turn-requests" without completing' in text
    assert f"child session {sid}--d1" in text and "noop x1" in text
    assert [type(e.data.reason).__name__ for e in child if e.type == "turn/end"] == [
        "MaxTurnRequestsReason"
    ]


async def test_a_tree_budget_stops_the_descendants(tmp_path: Path) -> None:
    """max_steps 4 over the tree: the parent (1), alpha (1), gamma (2); then both stop."""

    @tool
    async def noop() -> str:
        """Do nothing."""
        return "nothing"

    parent = _script(
        tmp_path / "parent.yml",
        [{"tool_calls": [_delegate("d1", "alpha")]}, {"text": "done"}],
    )
    loop = [{"tool_calls": [{"name": "noop", "id": f"n{i}"}]} for i in range(6)]
    rows = [
        _model_row(
            tmp_path, "scripted-a", [{"tool_calls": [_delegate("g1", "gamma")]}, {"text": "a"}]
        ),
        _model_row(tmp_path, "scripted-c", [*loop, {"text": "never reached"}]),
        Row(
            id="subagents",
            name="subagents",
            config={
                "agents": [
                    _child("alpha", "scripted-a", tools=["subagent"]),
                    _child("gamma", "scripted-c", tools=["noop"]),
                ],
                "budget": {"max_steps": 4},
            },
        ),
    ]
    async with Agent(
        model=f"scripted:{parent}", tools=[noop], store=tmp_path / "s", rows=rows
    ) as agent:
        result = await agent.run("go")
        assert result.output == "done", "the parent's own requests are not gated"
        error, text = _results(agent.session)["d1"]
        sid = agent.session_id
        alpha = await _stored(agent, f"{sid}--d1")
        gamma = await _stored(agent, f"{sid}--d1--g1")
    ends = {
        name: [e.data.reason for e in log if e.type == "turn/end"]
        for name, log in (("alpha", alpha), ("gamma", gamma))
    }
    for reasons in ends.values():
        (reason,) = reasons
        assert (reason.kind_name, reason.scope, reason.limit, reason.max) == (
            "budget-exceeded",
            "tree",
            "steps",
            4,
        )
    assert [e.type for e in gamma].count("assistant/message") == 2
    assert [e.type for e in alpha].count("assistant/message") == 1
    assert error and 'ended its turn "budget-exceeded" (the tree step budget is spent' in text
    g1_error, g1_text = _texts(alpha)["g1"]
    assert g1_error and "4 model requests of max_steps 4" in g1_text


CITY = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
    "required": ["city", "population"],
    "additionalProperties": False,
}


async def test_a_typed_child_answers_validated_json(tmp_path: Path) -> None:
    parent = _script(
        tmp_path / "parent.yml",
        [
            {"tool_calls": [_delegate("d1", "extractor"), _delegate("d2", "loose")]},
            {"text": "done"},
        ],
    )

    def output(call_id: str, agent: str, **arguments: Any) -> dict[str, Any]:
        return {"tool_calls": [{"name": f"output_{agent}", "id": call_id, "arguments": arguments}]}

    rows = [
        _model_row(
            tmp_path,
            "scripted-a",
            [
                output("o1", "extractor", city="Paris"),  # refused: population is missing
                output("o2", "extractor", city="Paris", population=2100000),
                {"text": "never reached: the output call ends the turn"},
            ],
        ),
        _model_row(tmp_path, "scripted-b", [{"text": "Paris, about two million"}]),
        _agents(
            _child("extractor", "scripted-a", tools=[], output_schema=CITY),
            _child("loose", "scripted-b", output_schema=CITY),
        ),
    ]
    async with Agent(model=f"scripted:{parent}", store=tmp_path / "s", rows=rows) as agent:
        result = await agent.run("go")
        assert result.output == "done"
        results = _results(agent.session)
        sid = agent.session_id
        extractor = await _stored(agent, f"{sid}--d1")
    assert results["d1"] == (False, '{"city":"Paris","population":2100000}')
    error, text = results["d2"]
    assert error and 'ended its turn "no-output" (it answered in text instead of calling' in text
    o1_error, o1_text = _texts(extractor)["o1"]
    assert o1_error and "population" in o1_text
    offered = [e.data.header.tools for e in extractor if e.type == "request/header"]
    assert [t.name for t in offered[0]] == ["output_extractor"], "only its own output tool"


async def test_an_output_schema_outside_the_subset_is_refused_at_load(tmp_path: Path) -> None:
    parent = _script(tmp_path / "parent.yml", [{"text": "x"}])
    bad = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}}}
    rows = [
        _model_row(tmp_path, "scripted-a", [{"text": "y"}]),
        _agents(_child("extractor", "scripted-a", output_schema=bad)),
    ]
    with pytest.raises(BootError) as raised:
        async with Agent(model=f"scripted:{parent}", store=tmp_path / "s", rows=rows):
            pass
    assert "agents[0] (extractor).output_schema" in str(raised.value)


async def test_a_deferred_approval_in_a_child_pauses_the_parent_until_decided(
    tmp_path: Path,
) -> None:
    """D36 in process: the parent's turn ends awaiting approval with the delegating call open;
    the child's call decided, the parent's continued turn re-attaches and gets its answer."""
    ran: list[str] = []

    @tool(approval="ask")
    def deploy() -> str:
        """Deploy."""
        ran.append("deploy")
        return "deployed"

    parent = _script(
        tmp_path / "parent.yml", [{"tool_calls": [_delegate("d1", "alpha")]}, {"text": "ok"}]
    )
    rows = [
        _model_row(
            tmp_path,
            "scripted-a",
            [{"tool_calls": [{"name": "deploy", "id": "y1"}]}, {"text": "alpha deployed"}],
        ),
        _agents(_child("alpha", "scripted-a", tools=["deploy"])),
    ]
    async with Agent(
        model=f"scripted:{parent}", tools=[deploy], approval="defer", store=tmp_path / "s", rows=rows
    ) as agent:
        await agent.run("go")
        sid = agent.session_id
        assert "d1" not in _results(agent.session), "the delegating call waits: no result"
        ends = [e.data.reason for e in agent.session.events if e.type == "turn/end"]
        assert [(type(r).__name__, r.call_ids) for r in ends] == [
            ("AwaitingApprovalReason", ("d1",))
        ]
        assert agent.pending_approvals() == [], "the parent's call has no decision of its own"
        with pytest.raises(ApprovalDecisionError, match=f'waits on session "{sid}--d1"'):
            await agent.decide("d1", "allow")
        child = await agent.host.ctx.service(AGENT).resume(f"{sid}--d1")
        try:
            await child.decide("y1", "allow")
        finally:
            await child.aclose()
        assert ran == [], "deciding runs nothing"
        result = await agent.continue_turn()
        assert result.output == "ok"
        assert _results(agent.session)["d1"] == (False, "alpha deployed")
        stored = await _stored(agent, f"{sid}--d1")
    assert ran == ["deploy"]
    assert [type(e.data.reason).__name__ for e in stored if e.type == "turn/end"] == [
        "AwaitingApprovalReason",
        "CompletedReason",
    ]

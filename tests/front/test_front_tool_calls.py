"""``@tool`` functions called by a (scripted) model through the real tools pipeline."""

from __future__ import annotations

import dataclasses
import enum
import json
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from dsh_host import Agent, ToolContext, tool
from dsh_host._session.events import AbortedReason
from dsh_host._tools import ToolArgsError, validate

from .front_helpers import events_of, result_texts, script

pytestmark = pytest.mark.anyio


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Point(msgspec.Struct):
    x: int
    y: int = 0


@dataclasses.dataclass
class Label:
    text: str
    color: Color


class Placed(msgspec.Struct):
    label: str
    at: Point
    color: Color


seen: dict[str, Any] = {}


@tool
async def place(point: Point, label: Label, scale: float = 1.0) -> Placed:
    """Place a label at a point."""
    seen["place"] = (point, label, scale)
    return Placed(label=label.text, at=Point(point.x * int(scale), point.y), color=label.color)


def call(name: str, arguments: Any, call_id: str | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": name, "arguments": arguments}
    if call_id is not None:
        entry["id"] = call_id
    return {"tool_calls": [entry]}


async def test_arguments_are_converted_to_the_annotated_types_and_the_value_to_json(
    tmp_path: Path,
) -> None:
    seen.clear()
    model = script(tmp_path, [
        call("place", {"point": {"x": 2}, "label": {"text": "hi", "color": "blue"}, "scale": 3}),
        {"text": "done"},
    ])
    async with Agent(model, tools=[place], store=None, workspace=tmp_path) as agent:
        result = await agent.run("place it")
    assert result.output == "done" and result.completed
    point, label, scale = seen["place"]
    assert point == Point(x=2, y=0)
    assert label == Label(text="hi", color=Color.BLUE)
    assert scale == 3.0 and type(scale) is float
    assert json.loads(result_texts(agent)["call_1_1"]) == {
        "label": "hi", "at": {"x": 6, "y": 0}, "color": "blue"
    }


BAD_ARGUMENTS = [
    {"point": {"x": "2"}, "label": {"text": "hi", "color": "blue"}},
    {"point": {"x": 1}, "label": {"text": "hi", "color": "green"}},
    {"label": {"text": "hi", "color": "red"}},
    {"point": {"x": 1}, "label": {"text": "hi", "color": "red"}, "extra": True},
    {"point": {"x": 1.5}, "label": {"text": "hi", "color": "red"}},
]


async def test_invalid_arguments_are_the_runtimes_invalid_args_and_the_body_never_runs(
    tmp_path: Path,
) -> None:
    seen.clear()
    model = script(tmp_path, [*(call("place", a) for a in BAD_ARGUMENTS), {"text": "gave up"}])
    async with Agent(model, tools=[place], store=None, workspace=tmp_path) as agent:
        for _ in BAD_ARGUMENTS[1:]:
            agent.core.steer("again")  # keep the turn going: one bad call per step
        await agent.run("place it")
    assert "place" not in seen
    texts = result_texts(agent)
    parameters = place.definition.parameters
    for index, arguments in enumerate(BAD_ARGUMENTS, start=1):
        expected = "Error: " + str(ToolArgsError(validate(parameters, arguments)))
        assert texts[f"call_{index}_1"] == expected
    assert texts["call_1_1"] == 'Error: invalid arguments: "point.x" must be an integer'
    assert texts["call_4_1"] == (
        'Error: invalid arguments: "extra" is not a declared property (additionalProperties: '
        "false)"
    )
    codes = [event.data.error.code for event in events_of(agent, "tool/result")]
    assert codes == ["INVALID_ARGS"] * len(BAD_ARGUMENTS)


async def test_sync_tools_run_in_a_worker_thread_async_tools_on_the_loop(tmp_path: Path) -> None:
    threads: dict[str, int] = {}

    @tool
    def sync_tool() -> str:
        """Record the thread."""
        threads["sync"] = threading.get_ident()
        return "ok"

    @tool
    async def async_tool() -> str:
        """Record the thread."""
        threads["async"] = threading.get_ident()
        return "ok"

    model = script(tmp_path, [
        {"tool_calls": [{"name": "sync_tool"}, {"name": "async_tool"}]},
        {"text": "done"},
    ])
    async with Agent(model, tools=[sync_tool, async_tool], store=None) as agent:
        await agent.run("go")
    loop_thread = threading.get_ident()
    assert threads["async"] == loop_thread
    assert threads["sync"] != loop_thread
    assert result_texts(agent) == {"call_1_1": "ok", "call_1_2": "ok"}


async def test_tool_context_is_injected_by_type_whatever_its_name(tmp_path: Path) -> None:
    contexts: list[ToolContext] = []

    @tool
    def whoami(note: str, the_call: ToolContext) -> str:
        """Report the call's context."""
        contexts.append(the_call)
        return note

    model = script(tmp_path, [
        {"text": "first"},
        call("whoami", {"note": "a"}, "charge-1"),
        call("whoami", {"note": "b"}, "charge-2"),
        {"text": "done"},
    ])
    async with Agent(model, tools=[whoami], store=None, workspace=tmp_path) as agent:
        await agent.run("warm up")
        await agent.run("who")
        session_id = agent.session_id
    assert "the_call" not in whoami.definition.parameters["properties"]
    first, second = contexts
    assert (first.call_id, first.turn, first.step) == ("charge-1", 2, 1)
    assert (second.call_id, second.turn, second.step) == ("charge-2", 2, 2)
    assert first.session_id == session_id
    assert first.workspace == str(tmp_path)
    assert first.cancelled is False


async def test_a_cancelled_sync_tool_is_awaited_at_the_thread_boundary(tmp_path: Path) -> None:
    started = threading.Event()
    finished = threading.Event()

    @tool
    def slow(ctx: ToolContext) -> str:
        """Work until asked to stop."""
        started.set()
        deadline = time.monotonic() + 30  # hang guard only
        while not ctx.cancelled and time.monotonic() < deadline:
            time.sleep(0.01)
        finished.set()
        return "stopped early"

    model = script(tmp_path, [call("slow", {}), {"text": "never"}])
    async with Agent(model, tools=[slow], store=None) as agent:
        core = agent.core

        async def cancel_when_started() -> None:
            await anyio.to_thread.run_sync(started.wait, 30)
            core.cancel()

        async with anyio.create_task_group() as group:
            group.start_soon(cancel_when_started)
            with anyio.fail_after(60):
                result = await agent.run("go")
        assert finished.is_set()  # the thread ran to its end before the turn ended
    assert isinstance(result.turn_end, AbortedReason)
    (outcome,) = events_of(agent, "tool/result")
    assert outcome.data.error.code == "TOOL_OUTCOME_UNKNOWN"


@tool(approval="ask")
def charge(ctx: ToolContext, customer: str, cents: int) -> dict[str, Any]:
    """Charge a customer; the call id is the idempotency key."""
    seen.setdefault("charges", []).append((ctx.call_id, customer, cents))
    return {"charged": cents, "idempotency_key": ctx.call_id}


async def test_approval_ask_goes_through_the_approval_service(tmp_path: Path) -> None:
    seen.clear()
    asked: list[str | None] = []

    def answer(request: Any) -> bool:
        asked.append(request.call_id)
        return True

    model = script(tmp_path, [call("charge", {"customer": "c1", "cents": 250}), {"text": "ok"}])
    async with Agent(model, tools=[charge], store=None, approval=answer) as agent:
        await agent.run("charge c1")
    assert asked == ["call_1_1"]
    assert seen["charges"] == [("call_1_1", "c1", 250)]
    decided = events_of(agent, "approval/asked", "approval/decided")
    assert [e.type for e in decided] == ["approval/asked", "approval/decided"]
    assert decided[1].data.outcome == "allowed-once"


@pytest.mark.parametrize(
    ("approval", "text"),
    [
        ("ask", 'Error: tool "charge" requires approval, but no approval channel is available'),
        ("never", 'Error: the user rejected tool "charge"'),
    ],
)
async def test_approval_ask_fails_closed_without_a_grant(
    tmp_path: Path, approval: Any, text: str
) -> None:
    seen.clear()
    model = script(tmp_path, [call("charge", {"customer": "c1", "cents": 250}), {"text": "ok"}])
    async with Agent(model, tools=[charge], store=None, approval=approval) as agent:
        await agent.run("charge c1")
    assert "charges" not in seen
    assert result_texts(agent) == {"call_1_1": text}


async def test_a_cancelled_async_tool_is_stopped_at_its_await(tmp_path: Path) -> None:
    started = anyio.Event()
    after_sleep: list[bool] = []

    @tool
    async def wait_forever() -> str:
        """Wait."""
        started.set()
        await anyio.sleep(60)
        after_sleep.append(True)
        return "woke"

    model = script(tmp_path, [call("wait_forever", {}), {"text": "never"}])
    async with Agent(model, tools=[wait_forever], store=None) as agent:
        core = agent.core

        async def cancel_when_started() -> None:
            await started.wait()
            core.cancel()

        async with anyio.create_task_group() as group:
            group.start_soon(cancel_when_started)
            with anyio.fail_after(30):
                result = await agent.run("go")
    assert after_sleep == []
    assert isinstance(result.turn_end, AbortedReason)
    (outcome,) = events_of(agent, "tool/result")
    assert outcome.data.error.code == "TOOL_OUTCOME_UNKNOWN"
    assert result_texts(agent)["call_1_1"].startswith(
        "The tool call was stopped by a cancellation while it was running."
    )


async def test_an_async_callable_object_is_awaited_on_the_loop(tmp_path: Path) -> None:
    class Greeter:
        async def __call__(self, name: str) -> str:
            return f"hello {name} from {threading.get_ident() == loop_thread}"

    loop_thread = threading.get_ident()
    greet = tool(name="greet", description="Greet.")(Greeter())
    model = script(tmp_path, [call("greet", {"name": "ada"}), {"text": "done"}])
    async with Agent(model, tools=[greet], store=None) as agent:
        await agent.run("greet ada")
    assert result_texts(agent) == {"call_1_1": "hello ada from True"}

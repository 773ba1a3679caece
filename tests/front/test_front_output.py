"""``output_type=``: a typed final answer through the ``final_result`` tool, retried when invalid."""

from __future__ import annotations

import dataclasses
import datetime
from pathlib import Path
from typing import Literal, TypedDict

import msgspec
import pytest

from dsh_host import Agent, OutputValidationError
from dsh_host._session.events import BlockedReason, CompletedReason
from dsh_host._tools import ToolArgsError, ToolRegistrationError, validate

from .front_helpers import events_of, result_texts, script

pytestmark = pytest.mark.anyio


class Verdict(msgspec.Struct):
    """Whether the claim holds."""

    holds: bool
    confidence: Literal["low", "high"]
    reasons: list[str] = []


@dataclasses.dataclass
class City:
    name: str
    population: int


class Total(TypedDict):
    amount: int
    currency: str


def final(arguments: object) -> dict[str, object]:
    return {"tool_calls": [{"name": "final_result", "arguments": arguments}]}


async def test_a_valid_final_result_is_the_typed_output(tmp_path: Path) -> None:
    model = script(tmp_path, [final({"holds": True, "confidence": "high"})])
    async with Agent(model, output_type=Verdict, store=None) as agent:
        result = await agent.run("Is water wet?")
        requests = len(agent.host.ctx.llm.adapter_for("scripted").requests)
        tools = agent.host.ctx.tools.names()
    assert result.output == Verdict(holds=True, confidence="high", reasons=[])
    assert result.turn_end == CompletedReason()
    assert requests == 1  # the final result concludes the turn: no further model call
    assert tools == ["final_result"]


async def test_output_type_per_run_for_dataclasses_and_typed_dicts(tmp_path: Path) -> None:
    model = script(tmp_path, [
        final({"name": "Oslo", "population": 709_000}),
        final({"amount": 12, "currency": "EUR"}),
        {"text": "plain again"},
    ])
    async with Agent(model, store=None) as agent:
        city = await agent.run("Capital of Norway?", output_type=City)
        total = await agent.run("Total?", output_type=Total)
        plain = await agent.run("And?")
        assert agent.host.ctx.tools.names() == []  # no output type: no final_result tool
    assert city.output == City(name="Oslo", population=709_000)
    assert total.output == {"amount": 12, "currency": "EUR"}
    assert plain.output == "plain again"


async def test_invalid_output_is_sent_back_with_the_validation_error(tmp_path: Path) -> None:
    bad = {"holds": "yes", "confidence": "medium"}
    model = script(tmp_path, [final(bad), final({"holds": False, "confidence": "low"})])
    async with Agent(model, output_type=Verdict, store=None) as agent:
        result = await agent.run("Is fire cold?")
        schema = agent.host.ctx.tools.get("final_result").parameters
    assert result.output == Verdict(holds=False, confidence="low")
    texts = result_texts(agent)
    expected = "Error: " + str(ToolArgsError(validate(schema, bad)))
    assert texts["call_1_1"] == expected
    assert expected == (
        'Error: invalid arguments: "holds" must be a boolean; "confidence" must be one of '
        '["high", "low"]'
    )
    assert texts["call_2_1"] == "Final result accepted."


async def test_retries_are_bounded_and_then_the_run_raises(tmp_path: Path) -> None:
    bad = final({"holds": True})
    model = script(tmp_path, [bad, bad, bad, {"text": "unreachable"}])
    async with Agent(model, output_type=Verdict, output_retries=1, store=None) as agent:
        with pytest.raises(OutputValidationError) as info:
            await agent.run("Is it?")
        requests = len(agent.host.ctx.llm.adapter_for("scripted").requests)
    error = info.value
    assert error.result.output is None
    assert error.result.turn_end == BlockedReason()
    assert requests == 2  # the first answer and one retry, then the turn is stopped
    assert str(error) == (
        "no valid Verdict from the model after 2 rejected attempt(s) (output_retries=1) "
        'through the final_result tool; last problem: Error: invalid arguments: missing '
        'required property "confidence"'
    )


async def test_a_text_answer_is_steered_to_the_final_result_tool(tmp_path: Path) -> None:
    model = script(tmp_path, [
        {"text": "It holds, I think."},
        final({"holds": True, "confidence": "low"}),
    ])
    async with Agent(model, output_type=Verdict, store=None) as agent:
        result = await agent.run("Does it?")
        entered = [
            e.data for e in events_of(agent, "user/message")
            if getattr(e.data.source, "plugin", None) == "dsh-front-door"
        ]
    assert result.output == Verdict(holds=True, confidence="low")
    (notice,) = entered
    assert notice.content[0].text == (
        "Give your final answer by calling the final_result tool; a plain text reply is not "
        "accepted as the answer."
    )


async def test_stream_result_carries_the_typed_output(tmp_path: Path) -> None:
    model = script(tmp_path, [final({"holds": True, "confidence": "high"})])
    async with Agent(model, store=None) as agent:
        stream = agent.stream("Is it?", output_type=Verdict)
        async for _event in stream:
            pass
    assert stream.result is not None
    assert stream.result.output == Verdict(holds=True, confidence="high")


class Stamped(msgspec.Struct):
    at: datetime.datetime


def test_output_types_must_be_enforceable_objects() -> None:
    with pytest.raises(ToolRegistrationError, match="output_type int: must be an object type"):
        Agent("demo", output_type=int)
    with pytest.raises(ToolRegistrationError, match="DateTime values travel as strings"):
        Agent("demo", output_type=Stamped)

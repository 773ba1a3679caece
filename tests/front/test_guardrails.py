"""Guardrails in the front door: each kind trips at its point, every verdict is logged.

The tool guardrail's attack is judged by a ledger the tool body appends to: a tripped call
never reaches the body (the ledger stays empty), and the control -- the same call with a
guardrail that passes -- writes it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dsh_host import Agent, ToolContext, tool
from dsh_host._front import (
    GuardrailFunctionOutput,
    GuardrailTripwireTriggered,
    ToolCallData,
    input_guardrail,
    output_guardrail,
    tool_guardrail,
)

from .front_helpers import events_of, result_texts, script

pytestmark = pytest.mark.anyio


def ledger_tool(ledger: Path) -> Any:
    @tool
    def refund(ctx: ToolContext, customer: str, cents: int) -> str:
        """Refund a customer."""
        with ledger.open("a") as handle:
            handle.write(f"{ctx.call_id} {customer} {cents}\n")
        return "refunded"

    return refund


@tool_guardrail
def small_refunds_only(call: ToolCallData) -> GuardrailFunctionOutput:
    big = call.name == "refund" and call.arguments["cents"] > 10_000
    return GuardrailFunctionOutput(
        tripwire_triggered=big, reason="refunds over $100 need a person" if big else None
    )


def verdicts(agent: Agent) -> list[dict[str, Any]]:
    return [dict(e.data) for e in events_of(agent, "guardrail/verdict")]


async def test_a_tool_guardrail_blocks_the_call_before_its_body(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.txt"
    model = script(tmp_path, [
        {"tool_calls": [{"id": "big", "name": "refund",
                         "arguments": {"customer": "cus_1", "cents": 50_000}}]},
        {"tool_calls": [{"id": "small", "name": "refund",
                         "arguments": {"customer": "cus_1", "cents": 500}}]},
        {"text": "refunded the small one"},
    ])  # fmt: skip
    async with Agent(model, tools=[ledger_tool(ledger)], store=tmp_path / "s",
                     approval="never", guardrails=[small_refunds_only]) as agent:  # fmt: skip
        with pytest.raises(GuardrailTripwireTriggered, match="refunds over \\$100") as raised:
            await agent.run("refund cus_1")
        texts = result_texts(agent)
        found = verdicts(agent)
    assert ledger.read_text() == "small cus_1 500\n"  # the big call never reached the body
    assert "refunds over $100 need a person" in texts["big"]
    assert texts["small"] == "refunded"
    assert [(v["callId"], v["tripwireTriggered"]) for v in found] == [
        ("big", True), ("small", False)
    ]  # fmt: skip
    assert raised.value.kind == "tool" and raised.value.result.output == "refunded the small one"


async def test_control_a_passing_tool_guardrail_lets_the_call_run(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.txt"
    model = script(tmp_path, [
        {"tool_calls": [{"id": "big", "name": "refund",
                         "arguments": {"customer": "cus_1", "cents": 50_000}}]},
        {"text": "done"},
    ])  # fmt: skip
    allow = tool_guardrail(lambda call: False, name="allow-all")
    async with Agent(model, tools=[ledger_tool(ledger)], store=tmp_path / "s",
                     approval="never", guardrails=[allow]) as agent:  # fmt: skip
        result = await agent.run("refund cus_1")
    assert result.completed
    assert ledger.read_text() == "big cus_1 50000\n"


async def test_an_input_guardrail_trips_before_the_model_is_asked(tmp_path: Path) -> None:
    @input_guardrail
    async def no_secrets(prompt: str) -> GuardrailFunctionOutput:
        return GuardrailFunctionOutput("password" in prompt, reason="the prompt holds a password")

    model = script(tmp_path, [{"text": "never asked"}, {"text": "hello"}])
    async with Agent(model, store=tmp_path / "s", guardrails=[no_secrets]) as agent:
        with pytest.raises(GuardrailTripwireTriggered) as raised:
            await agent.run("my password is hunter2")
        assert not events_of(agent, "assistant/message")  # no model request was made
        assert type(raised.value.result.turn_end).__name__ == "BlockedReason"
        after = await agent.run("hi")  # the next prompt passes
        found = verdicts(agent)
    assert after.output == "never asked" and after.completed
    assert [(v["kind"], v["tripwireTriggered"]) for v in found] == [
        ("input", True), ("input", False)
    ]  # fmt: skip


async def test_an_output_guardrail_trips_on_the_final_text(tmp_path: Path) -> None:
    @output_guardrail
    def no_card_numbers(text: str) -> bool:
        return "4242" in text

    model = script(tmp_path, [{"text": "your card 4242 4242 4242 4242"}])
    async with Agent(model, store=tmp_path / "s", guardrails=[no_card_numbers]) as agent:
        with pytest.raises(GuardrailTripwireTriggered, match="no_card_numbers") as raised:
            await agent.run("what is my card?")
        found = verdicts(agent)
    assert raised.value.kind == "output"
    assert raised.value.result.output == "your card 4242 4242 4242 4242"  # logged, not hidden
    assert found == [{"turn": 1, "kind": "output", "name": "no_card_numbers",
                      "tripwireTriggered": True}]  # fmt: skip


async def test_a_guardrail_returning_nonsense_is_named(tmp_path: Path) -> None:
    bad = input_guardrail(lambda prompt: "yes", name="sloppy")
    async with Agent(script(tmp_path, [{"text": "x"}]), store=tmp_path / "s",
                     guardrails=[bad]) as agent:  # fmt: skip
        with pytest.raises(GuardrailTripwireTriggered, match="'sloppy' returned 'yes'"):
            await agent.run("hi")
        assert not events_of(agent, "assistant/message")  # fails closed: the model is not asked


def test_only_guardrails_are_accepted() -> None:
    with pytest.raises(Exception, match=r"Agent\(guardrails=\.\.\.\) takes functions decorated"):
        Agent("demo", guardrails=[lambda prompt: False])  # type: ignore[list-item]

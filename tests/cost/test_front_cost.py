"""``Agent(..., prices=..., budget=...)`` and ``RunResult.usage`` (issue 40): the front door's
turn usage carries the cost the token meter reads from the log, and a budget given to the
front door stops the turn before the request that would exceed it."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import msgspec
import pytest

from dsh_host import Agent
from dsh_host._agent.budget import BudgetExceededReason
from dsh_host.errors import ConfigError

pytestmark = pytest.mark.anyio


def script(tmp_path: Path, responses: list[dict[str, Any]]) -> str:
    path = tmp_path / "script.json"
    path.write_bytes(msgspec.json.encode({"responses": responses}))
    return f"scripted:{path}"


ONE_K = {"input_tokens": 800, "output_tokens": 200}  # $0.0016 + $0.004 at $2 / $20 per 1M
PRICES = {"scripted": {"input": 2, "output": 20}}


async def test_run_result_usage_carries_the_turn_cost(tmp_path: Path) -> None:
    model = script(tmp_path, [{"text": "a", "usage": ONE_K}, {"text": "b", "usage": ONE_K}])
    async with Agent(model, store=None, prices=PRICES) as agent:
        first = await agent.run("one")
        second = await agent.run("two")
    assert first.usage is not None and second.usage is not None
    assert first.usage.cost_usd == Decimal("0.0056")
    assert second.usage.cost_usd == Decimal("0.0056")  # the turn's, not the session's
    assert first.usage.to_json()["cost_usd"] == pytest.approx(0.0056)


async def test_a_front_door_budget_stops_the_turn(tmp_path: Path) -> None:
    call = {"tool_calls": [{"name": "nothing", "arguments": {}}], "usage": ONE_K}
    model = script(tmp_path, [call] * 5)

    from dsh_host import tool

    @tool
    def nothing() -> str:
        """Do nothing."""
        return "ok"

    budget = {"turn": {"max_cost_usd": 0.01}}
    async with Agent(model, tools=[nothing], store=None, prices=PRICES, budget=budget) as agent:
        result = await agent.run("go")
    assert isinstance(result.turn_end, BudgetExceededReason)
    assert result.usage is not None and result.usage.requests == 2  # $0.0112 >= $0.01
    assert result.turn_end.spent == pytest.approx(0.0112)


async def test_a_bad_budget_is_a_config_error(tmp_path: Path) -> None:
    model = script(tmp_path, [{"text": "a"}])
    with pytest.raises(ConfigError) as caught:
        async with Agent(model, store=None, budget={"turn": {"max_usd": 1}}):
            pass
    assert "max_usd" in str(caught.value)

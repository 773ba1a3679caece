"""The ``agent`` plugin: provides ``ctx.agent`` (:class:`~dsh_host._agent.service.AgentService`)."""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated

import msgspec

from dsh_host._context import Context
from dsh_host._plugin import Plugin
from dsh_host._session.events import register_turn_end_reason

from .budget import Budget, BudgetExceededReason
from .keys import AGENT, AGENT_EVENTS
from .prompt import SystemPrompt
from .service import AgentService
from .types import AgentOptions

__all__ = ["AgentConfig", "AgentPlugin", "BudgetConfig", "BudgetLimits"]

_Name = Annotated[str, msgspec.Meta(min_length=1)]


_Dollars = Annotated[float, msgspec.Meta(gt=0)]
_Tokens = Annotated[int, msgspec.Meta(gt=0)]


class BudgetLimits(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One scope's limits (``budget.turn`` or ``budget.session``)."""

    max_cost_usd: _Dollars | None = None
    max_tokens: _Tokens | None = None


class BudgetConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The ``budget:`` key of the ``agent`` row."""

    turn: BudgetLimits | None = None
    session: BudgetLimits | None = None

    def to_budget(self) -> Budget:
        turn = self.turn or BudgetLimits()
        session = self.session or BudgetLimits()
        return Budget(
            turn_max_cost_usd=_dollars(turn.max_cost_usd),
            turn_max_tokens=turn.max_tokens,
            session_max_cost_usd=_dollars(session.max_cost_usd),
            session_max_tokens=session.max_tokens,
        )


def _dollars(value: float | None) -> Decimal | None:
    return Decimal(str(value)) if value is not None else None


class AgentConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Config of the ``agent`` row: defaults for every agent it creates.

    Keys are snake_case; DSH's camelCase spellings are accepted too (D21).

    ``provider`` / ``model``: the route of the first request (an
    ``agent/request`` listener may choose instead). ``max_parallel_tool_calls``:
    overlapping tool bodies in one parallel group (1 = serial).
    ``max_steps_per_turn``: the loop guard; a turn that would open step
    ``max_steps_per_turn + 1`` ends ``max-turn-requests`` instead (default 200).
    ``persona``: the deployment persona section (order 0; ``{{model}}`` and
    ``{{cwd}}`` may be referenced). ``include_harness_identity``: the fixed
    order -100 identity line. ``include_runtime_context``: append runtime-context
    snapshots (approval policy, ...) to the history.
    """

    provider: _Name | None = None
    model: _Name | None = None
    max_tokens: Annotated[int, msgspec.Meta(gt=0, le=2**53 - 1)] | None = None
    reasoning_effort: _Name | None = None
    max_parallel_tool_calls: Annotated[int, msgspec.Meta(ge=1)] = 10
    max_steps_per_turn: Annotated[int, msgspec.Meta(ge=1)] = 200
    persona: str = ""
    include_harness_identity: bool = True
    include_runtime_context: bool = True
    budget: BudgetConfig | None = None


class AgentPlugin(Plugin):
    """Entry point ``agent``: the agent loop as a service.

    Declares the ``agent/*`` events and ``system-prompt/assemble`` (their keys
    are in :mod:`dsh_host._agent.keys`). On unload every agent is closed: a
    running turn ends ``aborted {kind: "disposed"}``.
    """

    name = "agent"
    provides = ("agent",)
    inject = ("sessions", "llm", "tools")
    Config = AgentConfig

    def apply(self, ctx: Context, config: AgentConfig) -> None:
        for event in AGENT_EVENTS:
            ctx.declare_event(event)
        ctx.effect(register_turn_end_reason(BudgetExceededReason), "budget-exceeded kind")
        prompt = SystemPrompt(
            ctx,
            identity=config.include_harness_identity,
            persona=config.persona,
            include_runtime_context=config.include_runtime_context,
        )
        defaults = AgentOptions(
            provider=config.provider,
            model=config.model,
            max_tokens=config.max_tokens,
            reasoning_effort=config.reasoning_effort,
            max_parallel_tool_calls=config.max_parallel_tool_calls,
            max_steps_per_turn=config.max_steps_per_turn,
            budget=config.budget.to_budget() if config.budget is not None else None,
        )
        service = AgentService(ctx, defaults, prompt)
        ctx.provide(AGENT, service)
        ctx.effect(service.aclose, "close agents")

"""Spend limits: ``max_cost_usd`` / ``max_tokens`` per turn and per session.

The loop asks :func:`check_budget` right before every model request (a retry included), so no
request starts once a limit is reached. What was spent is read from the durable log through the
token meter (replies, billed failed attempts, compaction summaries), never from a counter in
memory: a session continued by another process (``dsh resume``, ``dsh approvals continue``)
keeps counting from what its log holds.

A limit stops the turn with ``turn/end {kind: "budget-exceeded", scope, limit, max, spent}``, a
kind this harness adds (registered by the ``agent`` row; a reader that does not know it, DSH
included, keeps it as an unknown kind). A cost limit fails closed: when some call of the scope
has no known price, what was spent is unknown, and the turn stops saying so (``spent`` null)
rather than spend on. The model reads the reason too: the next turn opens with a ``user/message``
(plugin source ``budget``) that says it.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Literal

from dsh_host._session.messages import Wire

if TYPE_CHECKING:
    from dsh_host._session.session import Session
    from dsh_host._session.tokens import TokenMeter, UsageTotals

__all__ = [
    "BUDGET_EXCEEDED",
    "BUDGET_NOTICE_SOURCE",
    "Budget",
    "BudgetExceededReason",
    "check_budget",
    "over_budget",
]

#: The turn-end kind of a stop at a spend limit.
BUDGET_EXCEEDED = "budget-exceeded"
#: The plugin source of the notice the next turn opens with, so the model reads why the last
#: turn stopped (the ``turn/end`` reason is for people and programs; the model never sees it).
BUDGET_NOTICE_SOURCE = "budget"


class BudgetExceededReason(Wire, frozen=True, kw_only=True, tag=BUDGET_EXCEEDED, tag_field="kind"):
    """``turn/end {kind: "budget-exceeded"}``: a spend limit stopped the turn before a request."""

    #: which limit (``tree``: a ``subagents`` row's total over a turn's delegation tree, D34)
    scope: Literal["turn", "session", "tree"]
    limit: Literal["cost", "tokens", "steps"]  #: dollars, tokens or model requests
    max: float | int  #: the configured limit
    spent: float | int | None  #: what the log shows was spent (None: a cost not known)
    message: str  #: for people (and a model shown the reason)

    @property
    def kind_name(self) -> str:
        return BUDGET_EXCEEDED


@dataclass(frozen=True, kw_only=True, slots=True)
class Budget:
    """Limits of one agent; None: no limit. Dollars are compared exactly (``Decimal``)."""

    turn_max_cost_usd: Decimal | None = None
    turn_max_tokens: int | None = None
    session_max_cost_usd: Decimal | None = None
    session_max_tokens: int | None = None

    @property
    def active(self) -> bool:
        return any(
            limit is not None
            for limit in (
                self.turn_max_cost_usd,
                self.turn_max_tokens,
                self.session_max_cost_usd,
                self.session_max_tokens,
            )
        )


def _over(
    scope: Literal["turn", "session", "tree"],
    spent: UsageTotals,
    max_cost: Decimal | None,
    max_tokens: int | None,
) -> BudgetExceededReason | None:
    if max_tokens is not None and spent.total_tokens >= max_tokens:
        return BudgetExceededReason(
            scope=scope,
            limit="tokens",
            max=max_tokens,
            spent=spent.total_tokens,
            message=(
                f"the {scope} token budget is spent: {spent.total_tokens} tokens used of "
                f"max_tokens {max_tokens}; no further model request was made"
            ),
        )
    if max_cost is None:
        return None
    cost = spent.cost_usd
    if cost is None:
        models = ", ".join(spent.unpriced_models)
        return BudgetExceededReason(
            scope=scope,
            limit="cost",
            max=float(max_cost),
            spent=None,
            message=(
                f"the {scope} cost budget cannot be checked: no price is known for model(s) "
                f"{models}; add them to the token-meter row's prices: map"
            ),
        )
    if cost >= max_cost:
        return BudgetExceededReason(
            scope=scope,
            limit="cost",
            max=float(max_cost),
            spent=float(cost),
            message=(
                f"the {scope} cost budget is spent: ${cost} of max_cost_usd ${max_cost}; "
                "no further model request was made"
            ),
        )
    return None


def over_budget(
    scope: Literal["turn", "session", "tree"],
    spent: UsageTotals,
    *,
    max_cost_usd: Decimal | None = None,
    max_tokens: int | None = None,
    steps: int = 0,
    max_steps: int | None = None,
) -> BudgetExceededReason | None:
    """The reason to stop once ``spent`` (and ``steps`` model requests) reach a limit, or None.

    The gate for limits kept outside :class:`Budget` (a ``subagents`` row's tree budget, D34):
    the same texts and the same fail-closed cost rule as the agent's own budget.
    """
    if max_steps is not None and steps >= max_steps:
        return BudgetExceededReason(
            scope=scope,
            limit="steps",
            max=max_steps,
            spent=steps,
            message=(
                f"the {scope} step budget is spent: {steps} model requests of max_steps "
                f"{max_steps}; no further model request was made"
            ),
        )
    return _over(scope, spent, max_cost_usd, max_tokens)


def check_budget(
    budget: Budget, meter: TokenMeter, session: Session, turn: int
) -> BudgetExceededReason | None:
    """The reason to stop before the next model request of ``turn``, or None to go on."""
    if not budget.active:
        return None
    spent_turn = meter.turn_usage(session).get(turn)
    if spent_turn is not None:
        stop = _over("turn", spent_turn, budget.turn_max_cost_usd, budget.turn_max_tokens)
        if stop is not None:
            return stop
    return _over(
        "session", meter.usage(session), budget.session_max_cost_usd, budget.session_max_tokens
    )

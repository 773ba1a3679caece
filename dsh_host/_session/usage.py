"""Usage and cost of the billed calls of a log: the one place they are counted and priced.

:class:`UsageLedger` reads events one by one (a reply's usage, a failed attempt's, a compaction
summary's) and prices each call with a :class:`~dsh_host._session.prices.PriceTable`. The token
meter folds a live session through one; a listing folds stored events through one without the
token meter's surface fold (so a listing imports this module, not :mod:`.tokens`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal

import msgspec
from msgspec import UNSET

from dsh_host._session.events import (
    AssistantAttemptData,
    AssistantMessageData,
    RequestContextData,
    SessionEvent,
)
from dsh_host._session.messages import USAGE_KEYS, ChunkRecord, TokenUsage, UsageChunk
from dsh_host._session.prices import PriceTable

__all__ = ["USAGE_KEYS", "RequestCost", "UsageLedger", "UsageTotals"]



@dataclass(frozen=True, slots=True)
class UsageTotals:
    """Summed provider usage (disjoint buckets; reasoning is part of output)."""

    input_tokens: int = 0  #: uncached input
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0  #: part of output, shown, never added again
    requests: int = 0  #: model calls that reported usage
    #: dollars of the priced calls (exact; see :attr:`cost_usd` for the total's meaning)
    priced_cost_usd: Decimal = Decimal(0)
    #: calls whose model has no known price (their cost is not in ``priced_cost_usd``)
    unpriced_requests: int = 0
    unpriced_models: tuple[str, ...] = ()  #: those calls' models, first seen first

    @property
    def total_tokens(self) -> int:
        return (
            self.input_tokens
            + self.output_tokens
            + self.cache_read_tokens
            + self.cache_write_tokens
        )

    @property
    def cost_usd(self) -> Decimal | None:
        """The dollars spent, or None when some call is unpriced (unknown, never 0)."""
        return self.priced_cost_usd if self.unpriced_requests == 0 else None

    def add(self, usage: TokenUsage, cost: Decimal | None = None, model: str = "") -> UsageTotals:
        """These totals plus one call (``cost`` None: the call is unpriced)."""
        unpriced = self.unpriced_models
        if cost is None and model not in unpriced:
            unpriced = (*unpriced, model)
        return UsageTotals(
            input_tokens=self.input_tokens + usage.input_tokens,
            output_tokens=self.output_tokens + usage.output_tokens,
            cache_read_tokens=self.cache_read_tokens + (usage.cache_read_tokens or 0),
            cache_write_tokens=self.cache_write_tokens + (usage.cache_write_tokens or 0),
            reasoning_tokens=self.reasoning_tokens + (usage.reasoning_tokens or 0),
            requests=self.requests + 1,
            priced_cost_usd=self.priced_cost_usd + (cost if cost is not None else 0),
            unpriced_requests=self.unpriced_requests + (cost is None),
            unpriced_models=unpriced,
        )

    def plus(self, other: UsageTotals) -> UsageTotals:
        """These totals and ``other``'s summed (a cost stays unknown if either's is)."""
        return UsageTotals(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cache_read_tokens=self.cache_read_tokens + other.cache_read_tokens,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
            reasoning_tokens=self.reasoning_tokens + other.reasoning_tokens,
            requests=self.requests + other.requests,
            priced_cost_usd=self.priced_cost_usd + other.priced_cost_usd,
            unpriced_requests=self.unpriced_requests + other.unpriced_requests,
            unpriced_models=(
                *self.unpriced_models,
                *(m for m in other.unpriced_models if m not in self.unpriced_models),
            ),
        )

    def to_wire(self) -> dict[str, Any]:
        """The camelCase ``usage`` object of the CLI's and the server's JSON (``costUsd`` null
        when unknown)."""
        cost = self.cost_usd
        return {
            "inputTokens": self.input_tokens,
            "outputTokens": self.output_tokens,
            "cacheReadTokens": self.cache_read_tokens,
            "cacheWriteTokens": self.cache_write_tokens,
            "reasoningTokens": self.reasoning_tokens,
            "requests": self.requests,
            "costUsd": float(cost) if cost is not None else None,
            "unpricedModels": list(self.unpriced_models),
        }

    def to_json(self) -> dict[str, Any]:
        """The wire shape of ``--json`` outputs and ``RunResult.usage`` (cost as a float)."""
        cost = self.cost_usd
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cache_read_tokens": self.cache_read_tokens,
            "cache_write_tokens": self.cache_write_tokens,
            "reasoning_tokens": self.reasoning_tokens,
            "total_tokens": self.total_tokens,
            "requests": self.requests,
            "cost_usd": float(cost) if cost is not None else None,
            "unpriced_models": list(self.unpriced_models),
        }


@dataclass(frozen=True, slots=True)
class RequestCost:
    """One billed model call: what it used and what it cost."""

    seq: int  #: the event that logged the usage
    turn: int | None  #: None for a compaction outside a turn
    kind: Literal["reply", "attempt", "compaction"]  #: a reply, a failed attempt, a summary
    provider: str | None
    model: str | None
    usage: TokenUsage
    cost_usd: Decimal | None  #: None: the model has no known price


class UsageLedger:
    """Counts and prices every billed call of a log, event by event (the one place that does).

    A reply's usage (``assistant/message``), a failed attempt's (``assistant/attempt``: the
    last usage its stream reported, priced at the route of the newest ``request/context``) and
    a compaction summary's (``compaction/summary``, in the turn of its ``compaction/start``).
    The token meter folds a session through one; a listing folds stored events through one
    without building the surface.
    """

    def __init__(self, prices: PriceTable) -> None:
        self.prices = prices
        self.usage = UsageTotals()
        self.by_turn: dict[int, UsageTotals] = {}
        self.requests: list[RequestCost] = []
        self._context: tuple[str, str] | None = None
        self._compaction_turn: int | None = None

    def feed(self, event: SessionEvent) -> bool:
        """Count ``event`` if it is billed; True when it is nothing else for the meter."""
        kind, data = event.type, event.data
        if kind == "assistant/message" and isinstance(data, AssistantMessageData):
            if data.usage is not UNSET:
                source = data.message.source
                self._count(event.seq, data.turn, "reply", data.usage, source.provider,
                            source.model)  # fmt: skip
            return False  # a surface append too
        if kind == "request/context" and isinstance(data, RequestContextData):
            self._context = (data.provider, data.model)
            return False  # the meter keeps the route's window
        if kind == "assistant/attempt" and isinstance(data, AssistantAttemptData):
            usage = _attempt_usage(data)
            if usage is not None:
                provider, model = self._context if self._context is not None else (None, None)
                self._count(event.seq, data.turn, "attempt", usage, provider, model)
            return True
        if kind == "compaction/start" and isinstance(data, Mapping):
            turn = data.get("turn")
            self._compaction_turn = turn if isinstance(turn, int) else None
            return True
        if kind == "compaction/summary" and isinstance(data, Mapping):
            usage = _plain_usage(data.get("usage"))
            if usage is not None:
                provider, model = data.get("provider"), data.get("model")
                self._count(
                    event.seq,
                    self._compaction_turn,
                    "compaction",
                    usage,
                    provider if isinstance(provider, str) else None,
                    model if isinstance(model, str) else None,
                )
            return True
        return False

    def _count(
        self,
        seq: int,
        turn: int | None,
        kind: Literal["reply", "attempt", "compaction"],
        usage: TokenUsage,
        provider: str | None,
        model: str | None,
    ) -> None:
        cost = self.prices.cost(provider, model, usage)
        self.requests.append(RequestCost(seq, turn, kind, provider, model, usage, cost))
        name = model or "(no model)"
        self.usage = self.usage.add(usage, cost, name)
        if turn is not None:
            self.by_turn[turn] = self.by_turn.get(turn, UsageTotals()).add(usage, cost, name)


def _attempt_usage(data: AssistantAttemptData) -> TokenUsage | None:
    """The last usage a failed attempt's stream reported (it was billed), or None."""
    for record in reversed(data.stream):
        if isinstance(record, ChunkRecord) and isinstance(record.chunk, UsageChunk):
            return record.chunk.usage
    return None


def _plain_usage(raw: object) -> TokenUsage | None:
    """A ``compaction/summary`` record's usage (plain wire JSON), or None when absent or bad."""
    if isinstance(raw, TokenUsage):
        return raw
    if not isinstance(raw, Mapping):
        return None
    try:
        return msgspec.convert(raw, TokenUsage)
    except msgspec.ValidationError:
        return None

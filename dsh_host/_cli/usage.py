"""Usage and cost as the session logged them, for the CLI (counted by the token meter's ledger)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from .._composition_edits import services_of
from .._loader import LocatedRow
from .._session.keys import TOKEN_METER
from .._session.prices import PriceTable, parse_prices
from .common import CliUsageError

if TYPE_CHECKING:  # a listing of an unchanged root counts nothing (docs/decisions.md D44)
    from .._session.usage import UsageTotals


def price_table(located: Sequence[LocatedRow]) -> PriceTable:
    """The prices of the composition's ``token-meter`` row (catalogue only without one).

    A bad ``prices:`` entry is the user's mistake: a :class:`CliUsageError` naming it.
    """
    for entry in located:
        row = entry.row
        if row.disabled or TOKEN_METER.name not in services_of(row)[0]:
            continue
        config = row.config or {}
        try:
            table = parse_prices(config.get("prices"), f"row {row.id or row.name!r}: prices")
        except ValueError as error:
            raise CliUsageError(str(error)) from None
        return PriceTable(table, catalogue=config.get("catalogue", True) is not False)
    return PriceTable()


def logged_usage(
    events: Iterable[Any], turn: int | None = None, prices: PriceTable | None = None
) -> dict[str, Any]:
    """Usage and cost of every billed call (replies, failed attempts, compaction summaries),
    or only turn ``turn``'s, as the token meter counts them (:class:`UsageLedger`)."""
    from .._session.usage import UsageLedger, UsageTotals

    ledger = UsageLedger(prices if prices is not None else PriceTable())
    for event in events:
        ledger.feed(event)
    totals = ledger.usage if turn is None else ledger.by_turn.get(turn, UsageTotals())
    return usage_summary(totals)


def usage_summary(totals: UsageTotals) -> dict[str, Any]:
    """The camelCase ``usage`` object of ``--json`` outputs; ``costUsd`` null when unknown."""
    return totals.to_wire()


def usage_line(usage: dict[str, Any]) -> str:
    """``1234 in, 56 out`` (input counts cache reads and writes too), then ``, $0.0123`` when
    every billed model of it has a price (an unknown or partial cost is left out: ``dsh
    sessions show`` says which model lacks one)."""
    inputs = usage["inputTokens"] + usage["cacheReadTokens"] + usage["cacheWriteTokens"]
    line = f"{inputs} in, {usage['outputTokens']} out"
    cost = usage.get("costUsd")
    if isinstance(cost, int | float) and not usage.get("unpricedModels"):
        line += ", " + money(cost)
    return line


def money(usd: float) -> str:
    """``$0.0123``; ``<$0.0001`` for a cost that rounds to nothing but is not zero."""
    if 0 < usd < 0.0001:
        return "<$0.0001"
    return f"${usd:.4f}"

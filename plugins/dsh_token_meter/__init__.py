"""``token-meter``: mounts the replay-aware ``tokenMeter`` service (DSH ``dsh-token-meter``).

The measurement itself (the fold, the fixed heuristic, the result types) is
:mod:`dsh_host._session.tokens`, shared by every consumer; this row only provides it.
"""

from __future__ import annotations

from typing import Any

import msgspec

from dsh_host.sdk import (
    TOKEN_METER,
    Context,
    ContextPressure,
    ModelPrice,
    Plugin,
    PriceTable,
    RequestCost,
    TokenMeasurement,
    TokenMeter,
    TokenSurfaceNode,
    UsageTotals,
    estimate_content,
    estimate_header,
    estimate_message,
    parse_prices,
)

__all__ = [
    "ContextPressure",
    "ModelPrice",
    "PriceTable",
    "RequestCost",
    "TokenMeasurement",
    "TokenMeter",
    "TokenMeterConfig",
    "TokenMeterPlugin",
    "TokenSurfaceNode",
    "UsageTotals",
    "estimate_content",
    "estimate_header",
    "estimate_message",
]


class TokenMeterConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """YAML ``config:`` of a ``token-meter`` row: only prices (the estimator is fixed).

    ``prices``: ``{model: {input, output, cache_read?, cache_write?}}`` in US dollars per
    million tokens; a ``provider:model`` key prices one route only. They override the
    ``genai-prices`` catalogue, which prices every other model it knows.
    """

    prices: dict[str, Any] = msgspec.field(default_factory=dict)
    #: False: price from ``prices`` only (every other model's cost is unknown)
    catalogue: bool = True

    def __post_init__(self) -> None:
        parse_prices(self.prices)  # refuse a bad entry at composition, naming it


class TokenMeterPlugin(Plugin):
    """Entry point ``token-meter`` (DSH ``@deepseek-ai/dsh-token-meter``); provides ``tokenMeter``.

    DSH's meter takes no settings; this row adds ``prices`` and ``catalogue`` (cost in money,
    which DSH does not report) and rejects every other key.
    """

    name = "token-meter"
    provides = ("tokenMeter",)
    Config = TokenMeterConfig

    def apply(self, ctx: Context, config: TokenMeterConfig) -> None:
        table = PriceTable(parse_prices(config.prices), catalogue=config.catalogue)
        ctx.provide(TOKEN_METER, TokenMeter(table))

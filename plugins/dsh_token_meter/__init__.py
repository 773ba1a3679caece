"""``token-meter``: mounts the replay-aware ``tokenMeter`` service (DSH ``dsh-token-meter``).

The measurement itself (the fold, the fixed heuristic, the result types) is
:mod:`dsh_host.session.tokens`, shared by every consumer; this row only provides it.
"""

from __future__ import annotations

from dsh_host import Context, NoConfig, Plugin
from dsh_host.session.tokens import (
    ContextPressure,
    TokenMeasurement,
    TokenMeter,
    TokenSurfaceNode,
    UsageTotals,
    estimate_content,
    estimate_header,
    estimate_message,
)

__all__ = [
    "ContextPressure",
    "TokenMeasurement",
    "TokenMeter",
    "TokenMeterPlugin",
    "TokenSurfaceNode",
    "UsageTotals",
    "estimate_content",
    "estimate_header",
    "estimate_message",
]


class TokenMeterPlugin(Plugin):
    """Entry point ``token-meter`` (DSH ``@deepseek-ai/dsh-token-meter``); provides ``tokenMeter``.

    No settings: DSH's meter rejects every key, and so does this row.
    """

    name = "token-meter"
    provides = ("tokenMeter",)
    Config = NoConfig

    def apply(self, ctx: Context, config: NoConfig) -> None:
        ctx.provide("tokenMeter", TokenMeter())

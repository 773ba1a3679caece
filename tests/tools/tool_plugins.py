"""Plugins used by the tools tests (referenced by ``module:Attr`` rows)."""

from __future__ import annotations

from typing import Any

from dsh_host import Context, Plugin

from .tools_helpers import echo_tool


class RegistersEcho(Plugin):
    name = "registers-echo"
    inject = ("tools",)

    def apply(self, ctx: Context, config: Any) -> None:
        ctx.tools.register(echo_tool(), owner=ctx)

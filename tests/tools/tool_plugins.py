"""Plugins used by the tools tests (referenced by ``module:Attr`` rows)."""

from __future__ import annotations

from typing import Any

from tools_helpers import echo_tool

from dsh_host import Context, Plugin


class RegistersEcho(Plugin):
    name = "registers-echo"
    inject = ("tools",)

    def apply(self, ctx: Context, config: Any) -> None:
        ctx.tools.register(echo_tool(), owner=ctx)

"""Small plugins used by the host tests (referenced by ``module:Attr`` rows)."""

from __future__ import annotations

from typing import Any

import msgspec

from dsh_host import Context, Plugin
from dsh_host._bus import Emit

#: Records what the sample plugins did, in order, for assertions.
JOURNAL: list[str] = []


class EchoConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    greeting: str = "hi"
    times: int = 1


class Echo(Plugin):
    name = "echo"
    provides = ("echo",)
    Config = EchoConfig

    def apply(self, ctx: Context, config: EchoConfig) -> None:
        ctx.provide("echo", config)
        ctx.effect(lambda: JOURNAL.append(f"dispose echo {ctx.row_id}"))
        JOURNAL.append(f"apply echo {ctx.row_id} {config.greeting}")


class NeedsEcho(Plugin):
    name = "needs-echo"
    inject = ("echo",)

    def apply(self, ctx: Context, config: Any) -> None:
        JOURNAL.append(f"apply needs-echo sees {ctx.echo.greeting}")
        ctx.effect(lambda: JOURNAL.append("dispose needs-echo"))


class Around(Plugin):
    """An around-hook on tools/execute that records entry and exit."""

    name = "around"

    class Config(msgspec.Struct, forbid_unknown_fields=True):
        label: str = "a"

    def apply(self, ctx: Context, config: Any) -> None:
        async def around(exec_: list[str], next_: Any) -> Any:
            exec_.append(f"enter {config.label}")
            result = await next_()
            exec_.append(f"exit {config.label}")
            return result

        ctx.on("tools/execute", around)


class Exploding(Plugin):
    name = "exploding"
    provides = ("boom",)

    def apply(self, ctx: Context, config: Any) -> None:
        ctx.provide("boom", object())
        ctx.on("session/event", lambda session, event: None)
        ctx.effect(lambda: JOURNAL.append("undo exploding"))
        raise RuntimeError("kaboom during apply")


class AsyncOnEmit(Plugin):
    name = "async-on-emit"

    def apply(self, ctx: Context, config: Any) -> None:
        async def bad(session: Any, event: Any) -> None:
            return None

        ctx.on("session/event", bad)


#: An event owned by the plugin below (one declaration, with its key).
PING = Emit[[str]]("sample/ping", 1, "(text)")


class PingOwner(Plugin):
    """Declares and dispatches ``sample/ping``; the declaration goes with the plugin."""

    name = "ping-owner"

    def apply(self, ctx: Context, config: Any) -> None:
        ctx.declare_event(PING)

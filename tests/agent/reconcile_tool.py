"""A side-effecting ``@tool`` with a reconciler, and the child process that crashes inside it.

``transfer`` appends ``<idempotency key> <to> <cents>`` to a ledger file and fsyncs it (the
effect really happened; the key is what a real API would be sent as ``Idempotency-Key``).
Its reconciler looks the call's key up in that ledger: found is ``Done``, absent is
``NotDone``, no ledger file at all is ``Unknown`` (the "service" cannot be asked).

Run as a script it is the child (``python reconcile_tool.py <spec json>``): a host with the
scripted model, ``transfer`` and the persistence row of ``spec["store"]`` (``jsonl`` or
``sqlite``) runs one turn; ``spec["effect"]`` says whether the body performs the effect before
it writes the ready file and blocks (the parent SIGKILLs it there).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from dsh_host import Row, ToolContext, open_host, tool
from dsh_host._front.tools import FunctionTool
from dsh_host._tools import Done, NotDone, ReconcileVerdict, Unknown


def persistence_row(store: str, root: str) -> Row:
    name = {"jsonl": "session-persistence-jsonl", "sqlite": "session-persistence-sqlite"}[store]
    return Row(name=name, config={"root": root})


def make_transfer(ledger: str, ready: str | None = None, effect: bool = True) -> FunctionTool:
    """The tool; ``ready`` set: the body blocks after the effect (the child's kill point)."""

    def reconcile(ctx: ToolContext, to: str) -> ReconcileVerdict:
        if not os.path.exists(ledger):
            return Unknown("the ledger cannot be read")
        for line in Path(ledger).read_text().splitlines():
            key, dest, cents = line.split()
            if key == ctx.idempotency_key and dest == to:
                return Done(f"transferred {cents} cents to {dest}")
        return NotDone()

    @tool(reconcile=reconcile)
    def transfer(ctx: ToolContext, to: str, cents: int) -> str:
        """Transfer money (the idempotency key makes the effect happen at most once)."""
        if effect:
            with open(ledger, "a") as out:
                out.write(f"{ctx.idempotency_key} {to} {cents}\n")
                out.flush()
                os.fsync(out.fileno())
        if ready is not None:
            Path(ready).write_text(f"{ctx.session_id}\n")
            time.sleep(600)  # the parent kills the process here, before any result
        return f"transferred {cents} cents to {to}"

    return transfer


async def _child(spec: dict[str, Any]) -> None:
    rows = [
        Row(name="sessions"),
        Row(name="llm"),
        Row(name="tools"),
        Row(name="llm-scripted", config={"responses": spec["responses"]}),
        persistence_row(spec["store"], spec["root"]),
        Row(name="session-checkpoint-policy"),
        Row(name="agent", config={"provider": "scripted", "model": "scripted"}),
    ]
    async with open_host(rows) as host:
        transfer = make_transfer(spec["ledger"], spec["ready"], spec["effect"])
        host.ctx.tools.register(transfer.definition)
        agent = host.ctx.agent.create(session_id=spec["session"], cwd=spec["root"])
        await agent.run_turn("pay bob")


if __name__ == "__main__":
    import anyio

    anyio.run(_child, json.loads(sys.argv[1]), backend="trio")

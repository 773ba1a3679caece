"""Child of the front-door crash test: a side effect keyed by the call id, then a hang to be killed.

argv: model spec, ledger path, ready-file path, session root.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import anyio

from dsh_host import Agent, ToolContext, tool

MODEL, LEDGER, READY, ROOT = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]


@tool
def charge(ctx: ToolContext, customer: str, cents: int) -> str:
    """Charge a customer (the call id is the idempotency key)."""
    with LEDGER.open("a") as ledger:
        ledger.write(f"{ctx.call_id} {customer} {cents}\n")
        ledger.flush()
        os.fsync(ledger.fileno())
    READY.write_text(f"{ctx.session_id}\n")
    time.sleep(600)  # the parent kills the process here, after the effect, before the result
    return "charged"


async def main() -> None:
    async with Agent(MODEL, tools=[charge], store=ROOT) as agent:
        await agent.run("charge cus_1")


anyio.run(main, backend="trio")

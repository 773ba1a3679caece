"""Child of test_guardrail_crash: a front-door agent SIGKILLed inside a slow tool guardrail.

``python guardrail_crash_child.py <root> <model spec> <ledger> <ready>``: the ``charge`` body
would append to the ledger; the guardrail writes the session id to the ready file and blocks
(the parent kills the process there, before the guardrail answers).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import anyio

from dsh_host import Agent, ToolContext, tool
from dsh_host._front import ToolCallData, tool_guardrail


async def main(root: str, model: str, ledger: str, ready: str) -> None:
    @tool
    def charge(ctx: ToolContext, customer: str, cents: int) -> str:
        """Charge a customer."""
        with open(ledger, "a") as out:
            out.write(f"{ctx.call_id} {customer} {cents}\n")
        return "charged"

    holder: list[Agent] = []

    @tool_guardrail
    def slow_review(call: ToolCallData) -> bool:
        Path(ready + ".tmp").write_text(holder[0].session_id)
        os.replace(ready + ".tmp", ready)  # whole or absent: the parent kills once it exists
        time.sleep(600)  # the parent kills the process here, inside the guardrail
        return False

    async with Agent(model, tools=[charge], store=root, approval="never",
                     guardrails=[slow_review]) as agent:  # fmt: skip
        holder.append(agent)
        await agent.run("charge cus_1")


if __name__ == "__main__":
    first, second, third, fourth = sys.argv[1:5]
    anyio.run(main, first, second, third, fourth, backend="trio")

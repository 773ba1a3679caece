"""A side-effecting tool keyed on the call's idempotency key, and each call needs approval.

``python examples/idempotent_charge.py``. dsh records the ``tool/call`` durably before the body
runs and hands the body that call's idempotency key (``ctx.idempotency_key``: derived from the
session id and the call id, so it is the same for this call in every process that runs it and
different for every other call of every session). Forward it as the idempotency key of the side
effect: here the payment service's first reply is lost after it charged, the client retries with
the same key, and the customer is charged once. After a crash, ``dsh resume`` marks such a call
``TOOL_OUTCOME_UNKNOWN``; the key lets whoever retries find out what happened. (``ctx.call_id``
alone would not do: a model's call ids repeat across sessions -- this script's first call is
``call_1_1`` every run -- so a second run's charge would be taken for the first.)
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import anyio

from dsh_host import Agent, ToolContext, tool
from dsh_host.sdk import ApprovalRequest

SCRIPT = Path(__file__).with_name("scripts") / "idempotent_charge.yml"
MODEL = os.environ.get("DSH_EXAMPLE_MODEL", f"scripted:{SCRIPT}")
LEDGER = Path("ledger.jsonl")


class PaymentService:
    """A stand-in payment API that deduplicates by idempotency key (as real ones do)."""

    def __init__(self, ledger: Path) -> None:
        self.ledger = ledger
        self.replies_to_lose = 1  # the first reply is lost in transit, after the charge

    def charge(self, customer: str, cents: int, idempotency_key: str) -> dict[str, Any]:
        entries = self.entries()
        done = next((e for e in entries if e["key"] == idempotency_key), None)
        if done is None:
            done = {"key": idempotency_key, "customer": customer, "cents": cents}
            with self.ledger.open("a") as out:
                out.write(json.dumps(done) + "\n")
        if self.replies_to_lose:
            self.replies_to_lose -= 1
            raise TimeoutError("no reply from the payment service")
        return {"charged": done["cents"], "customer": done["customer"], "key": done["key"]}

    def entries(self) -> list[dict[str, Any]]:
        if not self.ledger.exists():
            return []
        return [json.loads(line) for line in self.ledger.read_text().splitlines()]


payments = PaymentService(LEDGER)


@tool(approval="ask", timeout_s=30)
def charge(ctx: ToolContext, customer: str, cents: int) -> dict[str, Any]:
    """Charge a customer, in cents.

    Args:
        customer: the customer id (cus_...).
        cents: the amount in cents.
    """
    for attempt in range(3):  # the client retries a lost reply with the same key
        try:
            return payments.charge(customer, cents, idempotency_key=ctx.idempotency_key)
        except TimeoutError:
            if attempt == 2 or ctx.cancelled:
                raise
    raise AssertionError("unreachable")


def approve(request: ApprovalRequest) -> bool:
    """The approval channel: a person, a chat button ... here a rule over the logged arguments."""
    session = request.agent.session
    call = next(e.data for e in session.events
                if e.type == "tool/call" and e.data.call_id == request.call_id)
    allowed = json.loads(call.arguments)["cents"] <= 100_00
    print(f"approval for {request.tool_name} {call.arguments}: {'yes' if allowed else 'no'}")
    return allowed


async def main() -> None:
    async with Agent(MODEL, tools=[charge], approval=approve, store=".dsh/sessions") as agent:
        result = await agent.run("Charge cus_42 $19.99, then $2,500.")
    print(result.output)
    print("ledger:", payments.entries())
    print(f"session {result.session_id}: inspect it with `dsh sessions show {result.session_id}`")


if __name__ == "__main__":
    LEDGER.unlink(missing_ok=True)
    anyio.run(main, backend="trio")

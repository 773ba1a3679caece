"""Structured output: the answer is a typed value, validated before the run returns it.

``python examples/structured_output.py``. The model answers through a ``final_result`` tool whose
arguments are the ``Ticket``'s schema; an invalid answer goes back to the model with the
validation error (at most ``output_retries`` times), so ``result.output`` is always a ``Ticket``.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Literal

import msgspec

from dsh_host import Agent

SCRIPT = Path(__file__).with_name("scripts") / "structured_output.yml"
MODEL = os.environ.get("DSH_EXAMPLE_MODEL", f"scripted:{SCRIPT}")


@dataclasses.dataclass
class Estimate:
    days: int


class Ticket(msgspec.Struct):
    """A bug ticket filed from a user report."""

    title: str
    severity: Literal["low", "medium", "high"]
    estimate: Estimate
    labels: list[str] = []


def main() -> None:
    agent = Agent(MODEL, output_type=Ticket, output_retries=2, store=None)
    result = agent.run_sync("File a ticket: the upload test fails one run in ten.")
    ticket: Ticket = result.output
    print(f"{ticket.severity}: {ticket.title} ({ticket.estimate.days} days) {ticket.labels}")
    for event in agent.session.events:
        if event.type == "tool/result":
            print("model read:", event.data.message.content[0].content[0].text)


if __name__ == "__main__":
    main()

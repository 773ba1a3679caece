"""A typed tool agent: the schema comes from the type hints, bad arguments never reach the body.

Run it from anywhere: ``python examples/typed_tools.py``. It uses a scripted model (no API key);
set ``DSH_EXAMPLE_MODEL=openai-compatible:deepseek-chat`` (and ``DEEPSEEK_API_KEY``) to ask a
real one.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal

import anyio
import msgspec

from dsh_host import Agent, events, tool

SCRIPT = Path(__file__).with_name("scripts") / "typed_tools.yml"
MODEL = os.environ.get("DSH_EXAMPLE_MODEL", f"scripted:{SCRIPT}")

Unit = Literal["km", "mi"]
PER_KM: dict[str, float] = {"km": 1.0, "mi": 0.621371}


class Conversion(msgspec.Struct, rename={"source": "from", "target": "to"}):
    """Which units to convert between."""

    source: Unit
    target: Unit


@tool(concurrency_safe=True)
def convert(
    amount: Annotated[float, msgspec.Meta(description="the distance to convert")],
    unit: Conversion,
) -> dict[str, float | str]:
    """Convert a distance between kilometres and miles."""
    value = amount / PER_KM[unit.source] * PER_KM[unit.target]
    return {"value": round(value, 2), "unit": unit.target}


async def main() -> None:
    async with Agent(MODEL, tools=[convert], instructions="You are terse.", store=None) as agent:
        stream = agent.stream("Convert 12.5 km to miles and 3 miles to furlongs.")
        async for event in stream:
            if isinstance(event, events.TextDelta):
                print(event.text, end="")
            elif isinstance(event, events.ToolCallStarted):
                print(f"\n-> {event.name} {event.arguments}")
            elif isinstance(event, events.ToolCallFinished):
                print(f"<- {event.text}")
            elif isinstance(event, events.TurnEnd):
                print(f"\nturn ended: {event.kind}")
        assert stream.result is not None
        print("answer:", stream.result.output)
        print("schema:", msgspec.json.encode(convert.definition.parameters).decode())


if __name__ == "__main__":
    anyio.run(main, backend="trio")

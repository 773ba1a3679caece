"""``dsh replay``: a recorded session's prompts against another model, without new effects (D28).

:func:`replay_stored` forks the stored source just before its first turn (the child's header
links to it as any fork's does; its ``fork/effects`` record carries ``origin: "replay"`` and the
ledger of every call the source made), then runs each recorded user prompt in the child with
the model the caller composed. The agent's ledger gate (:mod:`.ledger`) decides every tool call:

* a read-only tool (``read_only``) runs;
* any other tool never executes: a call equal (tool and canonical arguments) to a recorded one
  that is done is answered from the record (``Error: not run again ... its recorded result:
  ...``), one of unknown outcome is refused with its idempotency key, and an unmatched call is
  refused naming the nearest recorded call.

The report compares the turns: tool calls (name and arguments), the final text, how the turn
ended, tokens and cost; the first divergence; a unified diff of final answers that differ.
:func:`turn_records` and :func:`compare` are pure, for a test over recorded sessions.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from dsh_host._agent.keys import AGENT
from dsh_host._persistence.fork import fork_stored
from dsh_host._persistence.keys import SESSION_PERSISTENCE
from dsh_host._session.events import (
    AssistantMessageData,
    SessionEvent,
    TurnEnd,
    TurnStart,
    to_builtins,
)
from dsh_host._session.keys import SESSIONS, TOKEN_METER
from dsh_host._session.messages import TextBlock, ToolCallBlock, UserMessage, UserSource
from dsh_host._session.prices import PriceTable
from dsh_host._session.tokens import TokenMeter
from dsh_host._session.usage import UsageLedger

from .ledger import canonical_arguments

if TYPE_CHECKING:
    from dsh_host._context import Context

    from .loop import Agent

__all__ = ["ReplayReport", "TurnRecord", "compare", "replay_stored", "turn_records"]


@dataclass(slots=True)
class TurnRecord:
    """One turn as the log holds it."""

    turn: int
    prompt: str
    calls: list[tuple[str, str]] = field(default_factory=list)  #: (tool, canonical arguments)
    final_text: str | None = None
    end: str | None = None  #: the turn/end reason's kind (None: never ended)
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "turn": self.turn, "prompt": self.prompt,
            "calls": [{"tool": t, "arguments": a} for t, a in self.calls],
            "finalText": self.final_text, "end": self.end,
            "inputTokens": self.input_tokens, "outputTokens": self.output_tokens,
            "costUsd": self.cost_usd,
        }  # fmt: skip


def turn_records(
    events: Sequence[SessionEvent], *, after: int = -1, prices: PriceTable | None = None
) -> list[TurnRecord]:
    """The turns that start after seq ``after`` in ``events``, in order, priced with ``prices``
    (default: the catalogue only). Pure."""
    turns: dict[int, TurnRecord] = {}
    current: TurnRecord | None = None
    meter = UsageLedger(prices if prices is not None else PriceTable())
    for event in events:
        if event.seq <= after:
            continue
        meter.feed(event)
        data = event.data
        if isinstance(data, TurnStart):
            current = turns.setdefault(data.turn, TurnRecord(turn=data.turn, prompt=""))
        elif current is None:
            continue
        elif isinstance(data, UserMessage) and isinstance(data.source, UserSource):
            if not current.prompt:
                current.prompt = "".join(
                    b.text for b in data.content if isinstance(b, TextBlock)
                )
        elif isinstance(data, AssistantMessageData):
            text = "".join(b.text for b in data.message.content if isinstance(b, TextBlock))
            if text:
                current.final_text = text
            for block in data.message.content:
                if isinstance(block, ToolCallBlock):
                    current.calls.append((block.name, canonical_arguments(block.arguments)))
        elif isinstance(data, TurnEnd):
            current.end = str(to_builtins(data.reason).get("kind"))
            current = None
    for number, record in turns.items():
        totals = meter.by_turn.get(number)
        if totals is not None:
            record.input_tokens = totals.input_tokens + totals.cache_read_tokens
            record.output_tokens = totals.output_tokens
            cost = totals.cost_usd
            record.cost_usd = str(cost) if cost is not None else None
    return list(turns.values())


@dataclass(frozen=True, slots=True)
class ReplayReport:
    """What a replay found: both sides per turn, the first divergence, the answer diffs."""

    source: str
    replay: str
    turns: list[dict[str, Any]]
    first_divergence: dict[str, Any] | None

    @property
    def diverged(self) -> bool:
        return self.first_divergence is not None

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source, "replay": self.replay, "turns": self.turns,
            "firstDivergence": self.first_divergence,
        }  # fmt: skip


def _divergence(a: TurnRecord, b: TurnRecord | None) -> dict[str, Any] | None:
    """Where turn ``b`` first differs from ``a``: a tool call, the final text, the end."""
    if b is None:
        return {"turn": a.turn, "kind": "missing-turn", "detail": "the replay has no such turn"}
    for index in range(max(len(a.calls), len(b.calls))):
        left = a.calls[index] if index < len(a.calls) else None
        right = b.calls[index] if index < len(b.calls) else None
        if left == right:
            continue
        if left is None:
            kind = "extra-call"
        elif right is None:
            kind = "missing-call"
        elif left[0] != right[0]:
            kind = "different-tool"
        else:
            kind = "different-arguments"
        return {"turn": a.turn, "kind": kind, "call": index + 1,
                "source": list(left) if left else None,
                "replay": list(right) if right else None}  # fmt: skip
    if a.final_text != b.final_text:
        return {"turn": a.turn, "kind": "different-final-text"}
    if a.end != b.end:
        return {"turn": a.turn, "kind": "different-end", "source": a.end, "replay": b.end}
    return None


def compare(
    source_id: str, source: Sequence[TurnRecord], replay_id: str, replay: Sequence[TurnRecord]
) -> ReplayReport:
    """The report of ``replay`` (turns of the child) against ``source`` (the recorded turns)."""
    rows: list[dict[str, Any]] = []
    first: dict[str, Any] | None = None
    for index, recorded in enumerate(source):
        again = replay[index] if index < len(replay) else None
        divergence = _divergence(recorded, again)
        if first is None and divergence is not None:
            first = divergence
        row: dict[str, Any] = {
            "turn": recorded.turn, "source": recorded.to_json(),
            "replay": again.to_json() if again is not None else None,
            "divergence": divergence,
        }  # fmt: skip
        if again is not None:
            row["inputTokensDelta"] = again.input_tokens - recorded.input_tokens
            row["outputTokensDelta"] = again.output_tokens - recorded.output_tokens
            row["costUsdDelta"] = (
                str(Decimal(again.cost_usd) - Decimal(recorded.cost_usd))
                if again.cost_usd is not None and recorded.cost_usd is not None
                else None
            )
            if recorded.final_text != again.final_text:
                row["finalTextDiff"] = "\n".join(difflib.unified_diff(
                    (recorded.final_text or "").splitlines(),
                    (again.final_text or "").splitlines(),
                    fromfile=f"{source_id} turn {recorded.turn}",
                    tofile=f"{replay_id} turn {again.turn}", lineterm="",
                ))  # fmt: skip
        rows.append(row)
    return ReplayReport(source_id, replay_id, rows, first)


async def replay_stored(
    ctx: Context, source_id: str, *, child_id: str | None = None, from_turn: int = 1,
    prepare: Any = None,
) -> ReplayReport:  # fmt: skip
    """Replay the stored session ``source_id`` in a new child with the host's model.

    ``from_turn``: the child keeps the turns before it as they are and replays the rest (the
    ledger then holds the calls of the replayed turns). ``prepare(agent)``, when given, runs
    on the child's agent before its first turn (the CLI records the run terms it changed
    there). Raises what the fork and the resume raise.
    """
    persistence = ctx.service(SESSION_PERSISTENCE)
    load = await persistence.inspect(source_id)
    meter = ctx.get(TOKEN_METER)
    prices = meter.prices if isinstance(meter, TokenMeter) else None  # the composition's
    recorded = [t for t in turn_records(load.events, prices=prices) if t.turn >= from_turn]
    if not recorded:
        from dsh_host._session.errors import SessionForkError

        raise SessionForkError(
            f'session "{source_id}" has no turn {from_turn} or later to replay',
            "INVALID_BOUNDARY",
        )
    fork = await fork_stored(
        persistence, source_id, before_turn=recorded[0].turn, child_id=child_id,
        origin_note={"origin": "replay"},
    )  # fmt: skip
    agent: Agent = await ctx.service(AGENT).resume(fork.session_id)
    try:
        if prepare is not None:
            prepare(agent)
        start = agent.session.events[-1].seq
        for turn in recorded:
            await agent.run_turn(turn.prompt)
        await ctx.service(SESSIONS).flush(agent.session)
        events = list(agent.session.events)
    finally:
        await agent.aclose()
    replayed = turn_records(events, after=start, prices=prices)
    return compare(source_id, recorded, fork.session_id, replayed)

"""Crash safety of compaction (issue 22): a real child process runs a long turn that crosses
the threshold and is SIGKILLed at every compaction step. From the host, after it is dead: the
stored log is a valid prefix whose surface folds (a replacement is stored only with its
``compaction/summary`` and ``compaction/start`` before it, so the surface is either untouched or
completely compacted); the summary request was preceded by a flush; resume repairs the turn
without closing the plugin bracket, the dead bracket no longer blocks, and the session goes on
(and compacts again when it must)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dsh_host import Row, open_host
from dsh_host._session.compaction import is_compact_checkpoint_source
from dsh_host._session.events import (
    InterruptedReason,
    ReplaceOp,
    SessionEvent,
    encode_event,
)
from dsh_host._session.header import SessionHeader
from dsh_host._session.session import Session

from .compaction_child import KILL_POINTS, SESSION_ID, SUMMARY, register_tool, rows

pytestmark = pytest.mark.anyio

CHILD = Path(__file__).with_name("compaction_child.py")


def run_child(root: Path, point: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(CHILD), str(root), point],
        capture_output=True,
        text=True,
        timeout=300,
    )


async def stored(root: Path) -> tuple[SessionHeader, list[SessionEvent]]:
    async with open_host(
        [Row(name="sessions"), Row(name="session-persistence-jsonl", config={"root": str(root)})]
    ) as host:
        handle = await host.ctx.sessionPersistence.open(SESSION_ID, "read")
        load = await handle.read()
        await handle.close()
    return load.header, list(load.events)


def brackets_are_whole(events: list[SessionEvent]) -> None:
    """Every stored replacement has its shadow price (a pruned result) or its summary and start
    (a checkpoint) right before it."""
    for event in events:
        if event.type == "tool/result" and isinstance(event.surface_op, ReplaceOp):
            price = events[event.seq - 1]
            assert price.type == "compaction/prune"
            assert list(price.data["shadowedSeqs"]) == [event.surface_op.start]
            continue
        if event.type == "user/message" and isinstance(event.surface_op, ReplaceOp):
            assert is_compact_checkpoint_source(event.data.source)
            summary = events[event.seq - 1]
            assert summary.type == "compaction/summary"
            cid = summary.data["compactionId"]
            assert event.data.source.compaction_id == cid
            starts = [e for e in events if e.type == "compaction/start"]
            assert any(s.data["compactionId"] == cid and s.seq < summary.seq for s in starts)
            assert isinstance(event.source_event_seqs, tuple)
            assert event.source_event_seqs[:2] == (
                next(s.seq for s in starts if s.data["compactionId"] == cid),
                summary.seq,
            )


@pytest.mark.slow
@pytest.mark.parametrize("point", KILL_POINTS)
async def test_sigkill_at_every_compaction_step(tmp_path: Path, point: str) -> None:
    root = tmp_path / "sessions"
    child = run_child(root, point)
    assert child.returncode == -9, child.stdout + child.stderr
    assert f"kill {point}" in child.stdout

    header, events = await stored(root)
    assert [e.seq for e in events] == list(range(len(events)))
    assert "Traceback" not in child.stderr
    restored = Session.restore(header, events, mark_seed_end=False)  # the surface folds
    brackets_are_whole(events)
    starts = [e for e in events if e.type == "compaction/start"]
    checkpoints = [
        e for e in events if e.type == "user/message" and isinstance(e.surface_op, ReplaceOp)
    ]
    if point == "in-summary":
        # The summary request leaves the machine only after a flush: the start is durable.
        assert starts and events[-1].type == "compaction/start"
        assert not checkpoints
    if point == "next-request":
        # The next request was flushed too: the whole bracket is on disk.
        assert "compaction/end" in [e.type for e in events] and checkpoints
    if not checkpoints:
        # Untouched by summarization: every tool result is on the surface, as it was appended
        # or as its pruned replacement.
        pruned = {
            e.surface_op.start: e.seq
            for e in events
            if e.type == "tool/result" and isinstance(e.surface_op, ReplaceOp)
        }
        for result in (e for e in events if e.type == "tool/result" and e.surface_op == "append"):
            assert pruned.get(result.seq, result.seq) in restored.surface.nodes

    # Resume: repair closes the turn, never the plugin bracket; the dead lock no longer blocks.
    async with open_host(rows(str(root))) as host:
        agent = await host.ctx.agent.resume(SESSION_ID)
        session = agent.session
        repaired = list(session.events[len(events) :])
        assert [encode_event(e) for e in session.events[: len(events)]] == [
            encode_event(e) for e in events
        ]
        assert not any(e.type.startswith("compaction/") for e in repaired)
        ends = [e for e in repaired if e.type == "turn/end"]
        if events and not any(e.type == "turn/end" for e in events):
            assert ends and isinstance(ends[-1].data.reason, InterruptedReason)
        # The next turn (ten more chunks) compacts again: the dead bracket does not block it.
        register_tool(host)
        await agent.run_turn("continue")
        after = list(session.events)
        assert after[-1].type == "turn/end"
        later = [e for e in after[len(events) :] if e.type == "compaction/end"]
        assert later and all("error" not in e.data for e in later)
        await agent.aclose()


@pytest.mark.slow
async def test_a_clean_child_run_compacts(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    child = run_child(root, "none")
    assert child.returncode == 0, child.stderr
    assert "done" in child.stdout
    _header, events = await stored(root)
    brackets_are_whole(events)
    summaries = [e for e in events if e.type == "compaction/summary"]
    assert summaries and summaries[0].data["summary"][0]["text"] == SUMMARY

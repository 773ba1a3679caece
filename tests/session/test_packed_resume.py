"""A resumed session holds its older events encoded, not decoded (docs/decisions.md D37).

Issues 36 and 42: ``dsh resume`` of a 100k-event session held every decoded event (~650 B
each in ``tracemalloc``). These resume a stored log of 5,620 and of 27,124 events through
``ctx.agent.resume`` (the path ``dsh resume``, the Python front door and ``dsh serve`` share)
and bound what the 21,504 more events add to the memory the resumed session keeps.
"""

from __future__ import annotations

import gc
import importlib
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import anyio
import pytest

from dsh_host import Row, open_host
from dsh_host._session import Session
from dsh_host._session.folds import LogFold
from dsh_host._session.packed import PackedLog

BENCH = Path(__file__).resolve().parents[2] / "bench"
SMALL = 5 * 1_024 + 500
BIG = SMALL + 7 * 3_072


def _turns(events: int) -> Session:
    """A session of ``events`` events of the benches' turn mix (12 a turn, 1 KB tool output)."""
    sys.path.insert(0, str(BENCH))
    try:
        turn_payloads: Any = importlib.import_module("session_append").turn_payloads
    finally:
        sys.path.remove(str(BENCH))
    output = "".join(f"-rw-r--r-- 1 dev dev {i * 37:>8} f_{i}.py\n" for i in range(20))
    session = Session.create(f"big-{events}")
    turn = 0
    while len(session.events) < events:
        turn += 1
        for event_type, data, op in turn_payloads(turn, tool_output=output):
            if len(session.events) < events:
                session.append(event_type, data, surface_op=op)
    return session


def _rows(kind: str, root: Path) -> list[Row]:
    return [
        Row(name="sessions"),
        Row(name=f"session-persistence-{kind}", config={"root": str(root)}),
        Row(name="llm"),
        Row(name="tools"),
        Row(name="llm-scripted", id="model", config={"responses": [{"text": "unused"}]}),
        Row(name="agent", config={"provider": "scripted", "model": "scripted"}),
    ]


async def _store(kind: str, root: Path, session: Session) -> None:
    async with open_host(_rows(kind, root)) as host:
        handle = await host.ctx.sessionPersistence.create(session.header)
        handle.append(list(session.events))
        await handle.flush()
        await handle.close()


async def _retained(kind: str, root: Path, session: Session) -> tuple[int, Session]:
    """Bytes the resume of ``session`` leaves allocated, and the resumed session."""
    async with open_host(_rows(kind, root)) as host:
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            agent = await host.ctx.agent.resume(session.id)
            gc.collect()
            retained = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        resumed = agent.session
        await agent.aclose()
    return retained, resumed


@pytest.mark.parametrize("kind", ["jsonl", "sqlite"])
def test_resume_holds_older_events_encoded(tmp_path: Path, kind: str) -> None:
    # The same place in the turn mix and in a page (3,072 = lcm(12, 1,024)), so both resumed
    # logs hold as many decoded events (the tail, the cached pages): the difference is what
    # the 21,504 more events cost.
    small, big = _turns(SMALL), _turns(BIG)
    for session in (small, big):
        anyio.run(_store, kind, tmp_path, session)
    retained_small, _ = anyio.run(_retained, kind, tmp_path, small, backend="trio")
    retained_big, resumed = anyio.run(_retained, kind, tmp_path, big, backend="trio")
    added = (retained_big - retained_small) / (BIG - SMALL)
    # Decoded, each event of this mix kept ~650 B; packed (zstd pages), ~80 B with the folds.
    assert added < 200, f"{added:.0f} B per event added to a resumed session"
    # Nothing changed in what the session holds: the same events, then the repair's.
    assert list(resumed.events)[:BIG] == list(big.events)
    assert resumed.events[-1].type == "session/end-seed"


def test_packed_log_is_a_list_of_the_events() -> None:
    session = _turns(5_000)
    events = list(session.events)
    log = PackedLog(events)
    assert log.packed == 3 * 1024  # the newest page or two stay decoded
    assert len(log) == 5_000
    assert list(log) == events
    assert log[1_500] == events[1_500] and log[-1] is events[-1]
    assert log[1_000:3_100] == tuple(events[1_000:3_100])
    copy = log.copy()
    copy.append(events[0])
    assert len(log) == 5_000 and len(copy) == 5_001
    assert copy.starts_with(log) and not log.starts_with(copy)
    other = PackedLog([*events[:2_000], events[2_001], *events[2_001:]])  # not shared pages
    assert log.starts_with(PackedLog(events[:4_500]))
    assert not log.starts_with(other) and log != other
    assert log.copy(2_500) == events[:2_500] and log.copy(1_024) == events[:1_024]
    assert list(log.walk(1_000, 3_100)) == events[1_000:3_100]


def test_a_fold_over_a_packed_log_sees_every_event() -> None:
    session = _turns(5_000)
    restored = Session.restore(session.header, PackedLog(session.events), mark_seed_end=False)
    fold: LogFold[list[int]] = LogFold([], lambda seqs, event: [*seqs[-2:], event.seq])
    assert fold.value(restored) == [4_997, 4_998, 4_999]
    restored.append("session/title", {"title": "t"})
    assert fold.value(restored) == [4_998, 4_999, 5_000]
    assert restored.events == [*session.events, restored.events[-1]]

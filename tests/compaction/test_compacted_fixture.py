"""The committed compacted session (``tests/fixtures/dsh-compacted-session``) round-trips through
the JSONL reader (issue 22): every event re-encodes to its stored line byte for byte, the surface
folds to the recorded nodes, and the shadowed originals are still in the log and the transcript."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dsh_host import Row, open_host
from dsh_host._session.compaction import is_compact_checkpoint_source
from dsh_host._session.events import ReplaceOp, encode_event
from dsh_host._session.session import Session, derive_messages_from_events

pytestmark = pytest.mark.anyio

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "dsh-compacted-session"


async def test_the_compacted_fixture_round_trips(tmp_path: Path) -> None:
    expected = json.loads((FIXTURE / "expected.json").read_text())
    root = tmp_path / "root"
    shutil.copytree(FIXTURE / "root-none", root)
    [log] = root.glob("*/*/session.v3.jsonl")
    lines = log.read_bytes().splitlines()
    async with open_host(
        [
            Row(name="sessions"),
            Row(
                name="session-persistence-jsonl",
                config={"root": str(root), "compression": "none"},
            ),
        ]
    ) as host:
        handle = await host.ctx.sessionPersistence.open(expected["sessionId"], "read")
        load = await handle.read()
        await handle.close()
    events = list(load.events)
    assert load.torn_tail is None
    assert [e.type for e in events] == expected["types"]
    assert [encode_event(e) for e in events] == lines[1:]  # line 0 is the session header

    session = Session.restore(load.header, events, mark_seed_end=False)
    assert list(session.surface.nodes) == expected["surfaceNodes"]
    assert len(derive_messages_from_events(events)) == expected["modelMessages"]
    summaries = [e for e in events if e.type == "compaction/summary"]
    prunes = [e for e in events if e.type == "compaction/prune"]
    assert (len(summaries), len(prunes)) == (expected["compactions"], expected["prunes"])
    # Every shadowed original is still in the log and in the append-origin transcript.
    origin = {e.seq for e in session.append_origin_events()}
    for summary in summaries:
        for seq in summary.data["shadowedSeqs"]:
            assert events[seq].seq == seq
        checkpoint = events[summary.seq + 1]
        assert isinstance(checkpoint.surface_op, ReplaceOp)
        assert is_compact_checkpoint_source(checkpoint.data.source)
        assert checkpoint.seq not in origin
    # The second compaction merged the first checkpoint (a surface-position span).
    assert summaries[1].data["shadowedSeqs"][0] == summaries[0].seq + 1
    results = [e for e in events if e.type == "tool/result" and e.surface_op == "append"]
    assert len(results) == 7 and all(e.seq in origin for e in results)

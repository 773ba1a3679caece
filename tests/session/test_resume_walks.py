"""A resume decodes each packed page a bounded number of times (docs/decisions.md D46).

D37 keeps a resumed session's older events as zstd pages, decoded again on every access. A
``dsh resume`` walked the whole log five times (the inspect's repair closers, the recorded
terms, the restore's checks, the service's closers again, the usage), each walk decoding every
page. The closers now start at the last turn end that carries nothing into the next turn and
the terms are found where the log last recorded them, so a resume decodes each page for the
restore's checks and the usage fold only. These count the page decodes of a real ``dsh
resume`` (a child process, the decoder counted) and check that the shortcuts answer what a
walk from the start answers.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from dsh_host import open_host
from dsh_host._session import Session, interrupted_turn_closers, packed
from dsh_host._session.events.data import CompositionTerms, ModelRoute, RunTerms
from dsh_host._session.packed import PAGE, PackedLog
from dsh_host._session.repair import TOOL_OUTCOME_UNKNOWN
from dsh_host._session.session import LogView
from dsh_host._session.terms import TERMS_EVENT, recorded_terms

from .test_packed_resume import BENCH, _rows, _store, _turns

#: Five full pages and a cut turn: the resume repairs it.
EVENTS = 5 * PAGE + 1_000 + 5

#: Runs ``dsh`` with every packed page decode counted; prints the count on stderr at exit.
COUNTED = """
import atexit, sys
from dsh_host._session import packed
count = [0]
decode = packed._Page.decode
def counted(self):
    count[0] += 1
    return decode(self)
packed._Page.decode = counted
atexit.register(lambda: print(f"PAGE-DECODES {count[0]}", file=sys.stderr))
from dsh_host._cli import main
sys.argv = ["dsh", *sys.argv[1:]]
sys.exit(main())
"""


def _config(tmp: Path, root: Path) -> Path:
    config = tmp / "resume.yml"
    config.write_text(
        "- id: sessions\n  name: sessions\n"
        f"- id: session-persistence\n  name: session-persistence-jsonl\n  config:\n"
        f"    root: {root}\n"
        "- id: llm\n  name: llm\n"
        "- id: tools\n  name: tools\n"
        "- id: model\n  name: llm-scripted\n  config:\n    responses: [{text: unused}]\n"
        "- id: agent\n  name: agent\n  config:\n    provider: scripted\n    model: scripted\n"
    )
    return config


def _decodes(session_id: str, config: Path, cwd: Path, *prompt: str) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, "-c", COUNTED, "resume", session_id, *prompt, "--config", str(config)],
        cwd=cwd, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    line = next(x for x in done.stderr.splitlines() if x.startswith("PAGE-DECODES "))
    return int(line.split()[1]), done.stdout


async def _stored(root: Path, session_id: str) -> list[Any]:
    async with open_host(_rows("jsonl", root)) as host:
        load = await host.ctx.sessionPersistence.inspect(session_id)
        assert load is not None
        return list(load.events)


def test_dsh_resume_decodes_each_page_for_the_restore_and_the_usage_only(
    tmp_path: Path,
) -> None:
    root = tmp_path / "root"
    session = _turns(EVENTS)
    anyio.run(_store, "jsonl", root, session)
    config = _config(tmp_path, root)
    pages = EVENTS // PAGE - 1  # the newest 1,024 to 2,047 events stay decoded
    decodes, out = _decodes(session.id, config, tmp_path)
    assert "repair:" in out  # the cut turn was closed
    # Before: five walks (the inspect's closers, the terms, the restore's checks, the
    # service's closers, the usage), 5 * pages decodes. Now the restore's checks and the
    # usage fold: each decodes a page once.
    assert decodes <= 2 * pages, f"{decodes} page decodes for {pages} packed pages"
    stored = anyio.run(_stored, root, session.id)
    assert stored[:EVENTS] == list(session.events)
    assert stored[-1].type == "session/end-seed" and stored[-2].type == "turn/end"
    decodes, out = _decodes(session.id, config, tmp_path)  # balanced now: nothing to close
    assert "nothing to repair" in out
    assert decodes <= 2 * pages
    # A turn on top: the restore's checks, the two prompt projections, the call ids, the
    # first derive_messages and the usage walk the log; the effects ledger (no fork/effects
    # event in the log) and the closers do not. Before: ten walks.
    decodes, out = _decodes(session.id, config, tmp_path, "hello")
    assert "unused" in out
    assert decodes <= 6 * pages, f"{decodes} page decodes for {pages} packed pages"


TERMS = RunTerms(
    reason="created", by="test", model=ModelRoute(provider="scripted", model="m"),
    workspace=None, sandbox=None, approval=None,
    composition=CompositionTerms(name="test.yml", digest="0" * 64),
)  # fmt: skip


def _payloads(turn: int) -> list[tuple[str, Any, Any]]:
    sys.path.insert(0, str(BENCH))
    try:
        payloads: Any = importlib.import_module("session_append").turn_payloads
    finally:
        sys.path.remove(str(BENCH))
    return list(payloads(turn))


def _completed_turns(session: Session, until: int) -> None:
    while len(session.events) < until:
        turn = sum(1 for e in session.events if e.type == "turn/start") + 1
        for event_type, data, op in _payloads(turn):
            session.append(event_type, data, surface_op=op)


def _awaiting_chain(session: Session) -> str:
    """A turn that ends awaiting approval of its call, then one that ends awaiting it again
    (the call carried through both, D19); returns the call id."""
    turn = sum(1 for e in session.events if e.type == "turn/start") + 1
    payloads = _payloads(turn)
    call_id = f"call-{turn}"
    for event_type, data, op in payloads[:5]:  # turn/start .. the assistant's tool call
        session.append(event_type, data, surface_op=op)
    session.append("step/end", {"turn": turn, "step": 1})
    waiting = {"kind": "awaiting-approval", "callIds": [call_id]}
    session.append("turn/end", {"turn": turn, "reason": waiting})
    session.append("turn/start", {"turn": turn + 1})
    session.append("step/start", {"turn": turn + 1, "step": 1})
    session.append("step/end", {"turn": turn + 1, "step": 1})
    session.append("turn/end", {"turn": turn + 1, "reason": waiting})
    return call_id


def _approval_log() -> Session:
    """Completed turns, terms recorded once, calls carried by awaiting-approval turn ends
    across a page boundary, more turns, and a carried call in an open turn at the end."""
    session = Session.create("approvals")
    _completed_turns(session, 12 * 90)
    session.append(TERMS_EVENT, TERMS, ignorable=True)
    _completed_turns(session, 2 * PAGE - 14)
    _awaiting_chain(session)  # straddles events 2,048
    _completed_turns(session, 3 * PAGE + 100)
    call_id = _awaiting_chain(session)
    turn = sum(1 for e in session.events if e.type == "turn/start") + 1
    session.append("turn/start", {"turn": turn})
    session.append("step/start", {"turn": turn, "step": 1})
    session.append("tool/call", {"turn": turn, "step": 1, "callId": call_id, "name": "bash",
                                 "arguments": "{}"})  # fmt: skip
    return session


def test_the_closers_and_terms_of_a_packed_log_are_those_of_a_walk_from_the_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    session = _approval_log()
    events = list(session.events)
    log = PackedLog(events)
    assert log.packed >= 2 * PAGE
    ends = [i for i, e in enumerate(events) if e.type == "turn/end"]
    stops = {len(events), len(events) - 1, len(events) - 2, *ends[-4:], *(i + 1 for i in ends[-4:]),
             *ends[-9:-5], *(i + 1 for i in ends[-9:-5]), 2 * PAGE, PAGE + 3, 40}  # fmt: skip
    for stop in sorted(stops):
        walked = interrupted_turn_closers(iter(events[:stop]))  # an iterator: from the start
        view = LogView(log, stop)  # a session's snapshot, shorter than its log
        assert interrupted_turn_closers(view) == walked, stop
        assert interrupted_turn_closers(PackedLog(events[:stop])) == walked, stop
        assert interrupted_turn_closers(log.copy(stop)) == walked, stop  # no marks: walks back
        assert recorded_terms(view) == recorded_terms(iter(events[:stop])), stop
        assert recorded_terms(log.copy(stop)) == recorded_terms(iter(events[:stop])), stop
    closers = interrupted_turn_closers(log)
    assert [c.type for c in closers] == ["tool/result", "step/end", "turn/end"]
    assert closers[0].data.error.code == TOOL_OUTCOME_UNKNOWN  # carried through two turn ends
    assert recorded_terms(log) == TERMS
    assert recorded_terms(PackedLog(events[:PAGE])) is None
    # Neither reads the pages before what it needs: the closers start at the last turn end
    # carrying nothing (in the decoded tail), the terms are read from the one page holding them.
    decoded: list[int] = []
    decode = packed._Page.decode

    def counted(page: Any) -> list[Any]:
        decoded.append(1)
        return decode(page)

    monkeypatch.setattr(packed._Page, "decode", counted)
    fresh = PackedLog(events)
    assert interrupted_turn_closers(fresh) == closers and not decoded
    assert recorded_terms(fresh) == TERMS and len(decoded) == 1


@pytest.mark.parametrize("kind", ["jsonl", "sqlite"])
def test_a_stores_read_packs_the_lines_it_decoded_without_encoding_them_again(
    tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row decoded in one typed pass is packed as its stored line: no encode and no check
    decode of it (each cost ~0.1 and ~0.25 s a 100k-event read, twice a ``dsh resume``)."""
    session = _turns(EVENTS)
    anyio.run(_store, kind, tmp_path, session)
    checked: list[int] = []
    round_trips = packed._round_trips

    def counted(line: bytes, event: Any) -> bool:
        checked.append(1)
        return round_trips(line, event)

    monkeypatch.setattr(packed, "_round_trips", counted)

    async def load() -> Any:
        async with open_host(_rows(kind, tmp_path)) as host:
            return (await host.ctx.sessionPersistence.inspect(session.id)).events

    events = anyio.run(load)
    assert isinstance(events, PackedLog) and events.packed == 4 * PAGE
    # Only the events no typed line decoder takes (a request header, one a turn) are checked.
    headers = sum(1 for e in session.events[: events.packed] if e.type == "request/header")
    assert len(checked) == headers, f"{len(checked)} events encoded and checked"
    assert list(events) == list(session.events)  # every page decodes to the stored events

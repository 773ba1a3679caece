"""``decode_stored_rows`` (the SQLite and PostgreSQL backends' read): rows that are this
build's exact encoding take the one-pass typed decode, every other row the general path, and
both give the same events, refusals and texts as the general path alone."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from dsh_host._persistence import persistence
from dsh_host._persistence.persistence import (
    SessionFormatUnsupportedError,
    SessionPersistenceCorruptionError,
    decode_stored_event,
    decode_stored_rows,
)
from dsh_host._session.events import decode_event

from .fixtures import EXPECTED, fixture_records
from .test_decode_event_line import ROWS, canonical

WHERE = "main.session_events#s"


def general(rows: list[tuple[int, str | bytes]]) -> list[Any]:
    """The reference: every row through the general path, as before the one-pass decode."""
    out = []
    for seq, text in rows:
        raw = text.decode("utf-8") if isinstance(text, bytes) else text
        out.append(decode_stored_event(raw, session_id="s", seq=seq, where=WHERE))
    return out


class Counting:
    """``decode_stored_event`` wrapped: how many rows took the general path."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        real = persistence.decode_stored_event

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(persistence, "decode_stored_event", counted)


def renumbered(lines: list[bytes]) -> list[bytes]:
    """The lines with seq 0.. in order (the rows of one contiguous log)."""
    out = []
    for seq, line in enumerate(lines):
        event = decode_event(line)
        out.append(canonical({**json.loads(line), "seq": seq}) if event.seq != seq else line)
    return out


def rows_of(lines: list[bytes], as_text: bool) -> list[tuple[int, str | bytes]]:
    return [(seq, line.decode("utf-8") if as_text else line) for seq, line in enumerate(lines)]


@pytest.mark.parametrize("as_text", [True, False], ids=["text", "bytes"])
def test_this_builds_rows_take_the_one_pass_decode_and_equal_the_general_path(
    monkeypatch: pytest.MonkeyPatch, as_text: bool
) -> None:
    lines = renumbered([canonical(row) for row in ROWS])
    for name, spec in EXPECTED.items():
        if not spec["scenario"].startswith("corrupt"):
            lines.extend(renumbered(fixture_records(name)))
            break
    lines = renumbered(lines)
    rows = rows_of(lines, as_text)
    reference = general(rows)
    counting = Counting(monkeypatch)
    fast = decode_stored_rows("s", rows, 0, where=WHERE)
    assert counting.calls == 0  # none took the general path
    assert fast == reference
    assert [repr(e) for e in fast] == [repr(e) for e in reference]  # 2 vs 2.0, tuples, frozen


def test_a_jsonb_columns_normalized_text_takes_the_general_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """PostgreSQL's jsonb prints ``{"a": 1}`` (spaces, its own key order): not this build's
    bytes, so every row is decoded the general way, to the same events."""
    lines = renumbered([canonical(row) for row in ROWS])
    spaced = [json.dumps(json.loads(line)).encode() for line in lines]
    rows = rows_of(spaced, as_text=True)
    reference = general(rows)
    counting = Counting(monkeypatch)
    assert decode_stored_rows("s", rows, 0, where=WHERE) == reference
    assert counting.calls == len(rows)


def test_a_long_digit_run_is_not_vouched_for(monkeypatch: pytest.MonkeyPatch) -> None:
    row = {**ROWS[0], "seq": 0, "data": {"turn": 1, "note": "order 12345678901234567"}}
    line = msgspec.json.encode(row)
    reference = general([(0, line)])
    counting = Counting(monkeypatch)
    assert decode_stored_rows("s", [(0, line)], 0, where=WHERE) == reference
    assert counting.calls == 1


def test_refusals_keep_their_types_and_texts() -> None:
    user = json.loads(canonical({**ROWS[2], "seq": 0}))
    user["data"]["id"] = ""
    bad = msgspec.json.encode(user)
    with pytest.raises(SessionPersistenceCorruptionError, match="lacks an identified message"):
        decode_stored_rows("s", [(0, bad)], 0, where=WHERE)
    unknown = msgspec.json.encode({"type": "x/new", "seq": 0, "time": 1, "data": {}})
    with pytest.raises(SessionFormatUnsupportedError, match=r'"x/new" .* newer harness'):
        decode_stored_rows("s", [(0, unknown)], 0, where=WHERE)
    gap = canonical({**ROWS[0], "seq": 1})
    with pytest.raises(
        SessionPersistenceCorruptionError, match="row 0 has seq 0 holding an event with seq 1"
    ):
        decode_stored_rows("s", [(0, gap)], 0, where=WHERE)

"""A stored session has one summary (``dsh_host._session.summary``), whoever lists it.

``dsh sessions list --json`` and ``dsh serve``'s ``Session`` used to compute their own: a long
first prompt was clipped at 60 characters by one and at 80 by the other, and the last turn's end
was read from different event sequences (issue 33). Both now render
:class:`~dsh_host._session.summary.SessionSummary`; this stores a real session through ``dsh run``
and reads it back through both.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import anyio
from dsh_session_persistence_jsonl import JsonlSessionPersistence

from dsh_host._server.runtime import StoredSummary
from dsh_host._session.summary import TITLE_CHARS

from .cli_helpers import dsh, json_lines

PROMPT = "Summarise every TODO in this repository, grouped by directory, " * 3


def test_the_cli_listing_and_the_api_say_the_same_title_and_end(tmp_path: Path) -> None:
    work = tmp_path / "project"
    work.mkdir()
    script = tmp_path / "s.json"
    script.write_text(json.dumps({"responses": [{"text": "ok"}]}))
    ran = dsh("run", PROMPT, "--model", f"scripted:{script}", "--json", cwd=work)
    assert ran.returncode == 0, ran.stderr
    listed = dsh("sessions", "list", "--json", cwd=work)
    assert listed.returncode == 0, listed.stderr
    [entry] = json_lines(listed.stdout)

    root = Path(os.environ["XDG_DATA_HOME"]) / "dsh" / "sessions"
    load = anyio.run(JsonlSessionPersistence(str(root)).inspect, entry["sessionId"])
    fields = StoredSummary.of(load).fields

    assert len(PROMPT.strip()) > TITLE_CHARS
    assert entry["title"] == fields["title"]
    assert len(entry["title"]) == TITLE_CHARS and entry["title"].endswith("…")
    assert entry["lastTurnEnd"] == fields["lastTurnEnd"]["kind"] == "completed"
    assert entry["events"] == fields["events"]
    assert entry["usage"] == fields["usage"]

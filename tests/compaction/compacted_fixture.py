"""Writes ``tests/fixtures/dsh-compacted-session``: one session dsh compacted, as dsh stores it.

Run ``python tests/compaction/compacted_fixture.py`` from the repository root to regenerate
(ids and times change; ``expected.json`` is rewritten to match). The session: a prompt, six
tool steps whose results are 1 000 characters plus one of 6 000 (the pruner rewrites it), a
scripted model declaring a 2 000-token window, token-meter, the pruner and compaction-basic,
JSONL without compression (one event per line, readable with any line tool).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, when run as a script

from compaction.compaction_helpers import call, register_echo, rows
from dsh_host import Row, open_host
from dsh_host._session.session import derive_messages_from_events

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "dsh-compacted-session"
SESSION_ID = "compacted-session"
SUMMARY = "## Primary Request and Intent\n- emit six chunks\n## Current Work\n- chunk emission"


async def main() -> None:
    root = FIXTURE / "root-none"
    if root.exists():
        shutil.rmtree(root)
    script: list[dict[str, Any]] = [call(f"chunk {i} " + "z" * 1000) for i in range(6)]
    script.insert(2, call("big ", times=1500))
    script.append({"text": "all six emitted"})
    base = rows(script, context_window=2000, summaries=[{"text": SUMMARY}] * 4)
    extra = [
        Row(name="session-persistence-jsonl", config={"root": str(root), "compression": "none"}),
        Row(name="session-checkpoint-policy"),
        Row(name="token-meter"),
        Row(
            name="compaction-tool-result-pruner",
            config={"thresholdChars": 2000, "headChars": 500, "tailChars": 200},
        ),
        Row(name="compaction-basic"),
    ]
    async with open_host([*base, *extra]) as host:
        register_echo(host)
        agent = host.ctx.agent.create(session_id=SESSION_ID, cwd="/home/dev/project")
        await agent.run_turn("emit six chunks")
        events = list(agent.session.events)
        nodes = list(agent.session.surface.nodes)
        await agent.aclose()
    expected = {
        "sessionId": SESSION_ID,
        "types": [e.type for e in events],
        "surfaceNodes": nodes,
        "modelMessages": len(derive_messages_from_events(events)),
        "compactions": sum(1 for e in events if e.type == "compaction/summary"),
        "prunes": sum(1 for e in events if e.type == "compaction/prune"),
    }
    (FIXTURE / "expected.json").write_text(
        json.dumps(expected, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    )


if __name__ == "__main__":
    anyio.run(main, backend="trio")

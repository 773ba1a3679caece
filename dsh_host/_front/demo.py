"""The built-in demo conversation (``dsh run`` with no ``--model``).

A scripted model, so a fresh install shows the whole harness without network
access: it reads the workspace, writes a file through the sandboxed ``bash``
tool (using the call's idempotency key), shows that a write outside
the workspace is refused, and finishes. Every call is recorded and made
durable before it runs.
"""

from __future__ import annotations

from typing import Any, Final

DEMO_WORKSPACE: Final = ".dsh/demo-workspace"
DEMO_PROMPT: Final = "Show me what dsh does: look around, keep a note, and stay inside the fence."

DEMO_RESPONSES: Final[list[dict[str, Any]]] = [
    {
        "text": "Let me look at the workspace first.",
        "tool_calls": [
            {
                "name": "bash",
                "arguments": {
                    "command": "pwd && ls -A && "
                    "(cat notes.txt 2>/dev/null || echo '(no notes yet)')",
                    "description": "List the workspace and show notes.txt",
                },
            }
        ],
    },
    {
        "text": "I'll add a line to notes.txt, tagged with this call's idempotency key "
        "so a retry after a crash could tell whether it already happened.",
        "tool_calls": [
            {
                "name": "bash",
                "arguments": {
                    # The harness's key, not the call id: call ids restart in every session
                    # (the demo's are the same each run), so the call id alone would make a
                    # second demo run skip its note as "already done".
                    "command": 'key="$DSH_IDEMPOTENCY_KEY"; '
                    'grep -qF "$key" notes.txt 2>/dev/null '
                    '|| echo "note from dsh ($key)" >> notes.txt; tail -n 3 notes.txt',
                    "description": "Append a note keyed by the call's idempotency key",
                },
            }
        ],
    },
    {
        "text": "Now a write outside the workspace, which the sandbox must refuse.",
        "tool_calls": [
            {
                "name": "bash",
                "arguments": {
                    "command": "touch \"$HOME/dsh-demo-escape\" 2>&1 "
                    "&& echo 'escaped?!' || echo 'refused, as it should be'",
                    "description": "Try to write outside the workspace",
                },
            }
        ],
    },
    {
        "text": "Done. Each call above was written to the session log and flushed to disk "
        "before it ran; after a crash, `dsh resume` would mark a call that never started "
        "TOOL_NOT_STARTED and one that may have run TOOL_OUTCOME_UNKNOWN."
    },
]

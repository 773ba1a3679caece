"""Child process for the pseudo-terminal tests: one approval request answered on the TTY.

Usage: ``python answerer_child.py <anyio-backend> <result.json>``. Boots a real
host (``sessions`` + ``user-approval``), opens a turn, logs a ``tool/call``,
installs the terminal answerer on stdin (the pty) and asks once. Writes the
outcome, whether an answerer was installed, and the audit events as JSON.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import anyio

from dsh_host import Row, open_host
from dsh_host._cli.answerer import install_terminal_answerer
from dsh_host._session import event_to_builtins
from dsh_host._tools import ApprovalRequest

ARGUMENTS = '{"command": "rm -rf build \\u001b[2J", "description": "clean"}'


class Agent:
    def __init__(self, session: Any) -> None:
        self.session = session

    @property
    def id(self) -> str:
        return str(self.session.id)


async def main() -> dict[str, Any]:
    async with open_host([Row(name="sessions"), Row(name="user-approval")]) as host:
        session = host.ctx.sessions.create("pty-session")
        session.append("turn/start", {"turn": 1})
        session.append("step/start", {"turn": 1, "step": 1})
        session.append(
            "tool/call",
            {"turn": 1, "step": 1, "callId": "call-42", "name": "bash", "arguments": ARGUMENTS},
        )
        installed = install_terminal_answerer(host.ctx) is not None
        outcome = await host.ctx.approval.request(
            ApprovalRequest(
                agent=Agent(session),
                tool_name="bash",
                call_id="call-42",
                reason="tool-rules: shell needs a human",
            )
        )
        audit = [
            event_to_builtins(e) for e in session.events if e.type.startswith("approval/")
        ]
    return {"installed": installed, "outcome": outcome, "audit": audit}


if __name__ == "__main__":
    result = anyio.run(main, backend=sys.argv[1])
    with open(sys.argv[2], "w", encoding="utf-8") as fh:
        json.dump(result, fh)

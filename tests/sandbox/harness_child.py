"""A harness process the sandbox suite kills: a real host running one confined ``bash`` call.

Run as ``python harness_child.py BACKEND MODE WORKSPACE COMMAND`` (``BACKEND`` is the
``sandbox-local`` backend; the event loop is trio, the one whose retired worker threads once
killed confined children). Prints ``started`` once the call is about to spawn, then waits for
the call; the test SIGKILLs this process while the command runs and checks from the host that
the confined processes died with it.
"""

from __future__ import annotations

import sys

import anyio

from dsh_host import CancelToken, Row, open_host
from dsh_host._tools import TOOLS, ToolExecutionInput


async def main(backend: str, mode: str, workspace: str, command: str) -> None:
    rows = [
        Row(name="tools"),
        Row(name="sandbox-local", config={"backend": backend}),
        Row(name="builtin-tools", config={"workspace": workspace, "sandbox": mode}),
    ]
    async with open_host(rows) as host:
        print("started", flush=True)
        result = await host.ctx.service(TOOLS).execute(
            ToolExecutionInput(
                call_id="call-harness-kill",
                name="bash",
                arguments={"command": command, "description": "run a long command"},
                signal=CancelToken(),
            )
        )
        print("finished", result.value, flush=True)


if __name__ == "__main__":
    first, second, third, fourth = sys.argv[1:5]
    anyio.run(main, first, second, third, fourth, backend="trio")

"""SIGKILL inside a side-effecting tool body: the one harness for the composition tests.

The crash suite proper (``harness.py`` / ``child.py``) kills a host composition at every
barrier, on every persistence backend. This module serves the tests that need the same kill
through another door: the agent service's ``resume`` (tests/agent/test_resume.py) and the
``Agent`` front door (tests/front/test_front_crash.py). They used to bring a child script each;
they share this one, so the kill, its protocol and its checks live in one place.

Run as a script it is the child (``python tool_body.py <spec json>``). The spec:

``composition``
    ``"host"``: ``open_host`` rows (sessions, llm, tools, llm-scripted,
    session-persistence-jsonl, session-checkpoint-policy, agent) with an *async* ``charge``
    tool registered through ``ctx.tools``; ``"front"``: ``Agent(model, tools=[charge],
    store=root)`` with a *sync* ``@tool`` ``charge`` (it runs on a worker thread).
``root`` / ``workspace`` / ``ledger`` / ``ready``
    the session root, the agent's cwd, the side-effect ledger, the ready file;
``model`` / ``session`` / ``prompt``
    the ``scripted:PATH`` model spec, the session id (``host`` only; the front door picks its
    own), the user's message.

The ``charge`` body appends ``<call id> <customer> <cents>`` to the ledger and fsyncs it (the
side effect really happened), writes the session id to the ready file, and then blocks. The
parent SIGKILLs the child then: after the effect, before any result.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from dsh_host import Agent, ToolContext, tool

#: a hang guard only: how long the child may take to reach the tool body
START_TIMEOUT = 60.0


@dataclass(frozen=True)
class KilledInBody:
    """What the parent knows after the kill: the session id and the ledger's lines."""

    session_id: str
    ledger: list[str]


def kill_inside_tool_body(
    tmp_path: Path,
    composition: str,
    responses: list[dict[str, Any]],
    *,
    root: Path,
    session: str | None = None,
    prompt: str = "charge cus_1",
) -> KilledInBody:
    """Run the child until its ``charge`` body has done its effect, SIGKILL it, report.

    Fails (not returns) when the child dies on its own or never reaches the body.
    """
    workspace = tmp_path / "ws"
    workspace.mkdir(exist_ok=True)
    ledger, ready = tmp_path / "ledger.txt", tmp_path / "ready"
    script = tmp_path / "tool-body-script.json"
    script.write_bytes(msgspec.json.encode({"responses": responses}))
    spec = {
        "composition": composition,
        "root": str(root),
        "workspace": str(workspace),
        "ledger": str(ledger),
        "ready": str(ready),
        "model": f"scripted:{script}",
        "session": session,
        "prompt": prompt,
    }
    child = subprocess.Popen(
        [sys.executable, __file__, json.dumps(spec)],
        cwd=workspace,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not ready.exists() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        if not ready.exists():
            child.kill()
            _, err = child.communicate(timeout=60)
            raise AssertionError(f"the child never reached the tool body ({child.poll()}):\n{err}")
        os.kill(child.pid, signal.SIGKILL)
    finally:
        if child.poll() is None:
            child.wait(timeout=60)
        if child.stderr is not None:
            child.stderr.close()
    assert child.returncode == -signal.SIGKILL, child.returncode
    return KilledInBody(ready.read_text().strip(), ledger.read_text().splitlines())


# --------------------------------------------------------------------------- the child


def _record(
    ledger: str, ready: str, call_id: str, session_id: str, customer: str, cents: int
) -> None:
    with open(ledger, "a") as out:
        out.write(f"{call_id} {customer} {cents}\n")
        out.flush()
        os.fsync(out.fileno())
    Path(ready).write_text(f"{session_id}\n")


async def _host(spec: dict[str, Any], script: Any) -> None:
    import anyio

    from dsh_host import Row, open_host
    from dsh_host._tools import ToolDefinition, ToolExecution, text_output

    rows = [
        Row(name="sessions"),
        Row(name="llm"),
        Row(name="tools"),
        Row(name="llm-scripted", config=script),
        Row(name="session-persistence-jsonl", config={"root": spec["root"]}),
        Row(name="session-checkpoint-policy"),
        Row(name="agent", config={"provider": "scripted", "model": "scripted"}),
    ]
    async with open_host(rows) as host:
        ctx = host.ctx

        async def charge(args: Any, exec: ToolExecution) -> Any:
            await anyio.to_thread.run_sync(
                _record, spec["ledger"], spec["ready"], exec.call_id, spec["session"],
                args["customer"], args["cents"],
            )  # fmt: skip
            await anyio.sleep_forever()  # the parent kills the process here

        ctx.tools.register(
            ToolDefinition(
                name="charge",
                description="Charge a customer (the call id is the idempotency key).",
                parameters={
                    "type": "object",
                    "properties": {"customer": {"type": "string"}, "cents": {"type": "integer"}},
                },
                execute=charge,
                output=text_output(),
            )
        )
        agent = ctx.agent.create(session_id=spec["session"], cwd=spec["workspace"])
        await agent.run_turn(spec["prompt"])


def _front_charge(spec: dict[str, Any]) -> Any:
    @tool
    def charge(ctx: ToolContext, customer: str, cents: int) -> str:
        """Charge a customer (the call id is the idempotency key)."""
        assert ctx.session_id is not None
        _record(spec["ledger"], spec["ready"], ctx.call_id, ctx.session_id, customer, cents)
        time.sleep(600)  # the parent kills the process here, after the effect, before the result
        return "charged"

    return charge


async def _front(spec: dict[str, Any], script: Any) -> None:
    async with Agent(spec["model"], tools=[_front_charge(spec)], store=spec["root"]) as agent:
        await agent.run(spec["prompt"])


if __name__ == "__main__":
    import anyio

    child_spec = json.loads(sys.argv[1])
    child_script = msgspec.json.decode(
        Path(child_spec["model"].removeprefix("scripted:")).read_bytes()
    )
    main = {"host": _host, "front": _front}[child_spec["composition"]]
    anyio.run(main, child_spec, child_script, backend="trio")

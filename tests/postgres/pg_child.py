"""A separate OS process using the PostgreSQL backend, for the race, kill and crash tests.

Usage: ``python pg_child.py <command> <dsn> <schema> <session-id> [args]``. Every line
it prints is flushed at once; the parent reads them as they come and SIGKILLs it.

* ``race``: connect (schema ready), print ``ready``, wait for a line on stdin, then try
  ``open(id, "write")``: print ``won <backend pid>`` and hold the lock forever, or
  print ``owned`` and exit.
* ``stall``: open the session for writing, append the events given as JSON on stdin's
  first line, print ``flushing <backend pid>``, then flush and print ``flushed`` (the
  parent makes the INSERT wait on a row lock and kills us while it waits).
* ``agent``: a harness (sessions, llm, tools, scripted model, this backend, agent) that
  runs one turn whose ``pay`` tool body prints ``body <call id>`` and blocks forever.
  The ``session-checkpoint-policy`` row flushes the session before a top-level tool
  body runs, so ``tool/call`` is durable when the body starts.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.to_thread
from dsh_session_persistence_postgres import PostgresSessionPersistence

from dsh_host._persistence.persistence import SessionAlreadyOwnedError


async def race(dsn: str, schema: str, session_id: str) -> None:
    async with anyio.create_task_group() as tg:
        backend = PostgresSessionPersistence(dsn, schema=schema, spawn=tg.start_soon)
        await backend.ensure_schema()
        print("ready", flush=True)
        await anyio.to_thread.run_sync(sys.stdin.readline)
        try:
            handle = await backend.open(session_id, "write")
        except SessionAlreadyOwnedError:
            print("owned", flush=True)
            tg.cancel_scope.cancel()
            return
        assert handle.lease is not None
        print(f"won {handle.lease.backend_pid}", flush=True)
        await anyio.sleep_forever()


async def stall(dsn: str, schema: str, session_id: str) -> None:
    events = json.loads(await anyio.to_thread.run_sync(sys.stdin.readline))
    backend = PostgresSessionPersistence(dsn, schema=schema)
    handle = await backend.open(session_id, "write")
    handle.append(events)
    assert handle.lease is not None
    print(f"flushing {handle.lease.backend_pid}", flush=True)
    await handle.flush()
    print("flushed", flush=True)
    await anyio.sleep_forever()


async def agent(dsn: str, schema: str, session_id: str, workspace: str) -> None:
    from dsh_host import Row, open_host
    from dsh_host._tools import (
        ToolDefinition,
        ToolExecution,
        text_output,
    )

    responses = [
        {
            "text": "paying now",
            "tool_calls": [{"name": "pay", "arguments": {"invoice": 42}, "id": "call-pay"}],
        }
    ]
    rows = [
        Row(name="sessions"),
        Row(name="session-persistence-postgres", config={"dsn": dsn, "schema": schema}),
        Row(name="session-checkpoint-policy"),
        Row(name="llm"),
        Row(name="tools"),
        Row(name="llm-scripted", config={"responses": responses}),
        Row(name="agent", config={"provider": "scripted", "model": "scripted"}),
    ]
    async with open_host(rows) as host:
        ctx = host.ctx

        async def pay(args: Any, exec: ToolExecution) -> Any:
            print(f"body {exec.call_id}", flush=True)
            await anyio.sleep_forever()

        ctx.tools.register(
            ToolDefinition(
                name="pay",
                description="pay an invoice",
                parameters={"type": "object", "properties": {"invoice": {"type": "integer"}}},
                execute=pay,
                output=text_output(),
            )
        )

        runner = ctx.agent.create(session_id=session_id, cwd=workspace)
        await runner.run_turn("pay invoice 42")


COMMANDS: dict[str, Callable[..., Awaitable[None]]] = {"race": race, "stall": stall, "agent": agent}

if __name__ == "__main__":
    anyio.run(COMMANDS[sys.argv[1]], *sys.argv[2:], backend="trio")

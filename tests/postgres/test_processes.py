"""Real OS processes against a real server: racing writers, a killed owner, SIGKILL mid-flush,
and a harness killed inside a tool body then resumed by another process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import psycopg
import pytest
from persistence.helpers import ev, header, plain, turn
from psycopg import sql

from dsh_host import Row, open_host
from dsh_host._persistence.persistence import SessionAlreadyOwnedError
from dsh_host._session.events import (
    CompletedReason,
    InterruptedReason,
    ToolErrorData,
    ToolResultData,
    TurnEnd,
    event_to_builtins,
)
from dsh_host._session.repair import TOOL_OUTCOME_UNKNOWN_TEXT, interrupted_turn_closers

from .helpers import backend, query, stored_rows, until, until_gone

# both backends: other processes
pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]

CHILD = str(Path(__file__).with_name("pg_child.py"))


def spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, CHILD, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


async def line(proc: subprocess.Popen[str]) -> str:
    def read() -> str:
        assert proc.stdout is not None
        text = proc.stdout.readline()
        if not text:
            assert proc.stderr is not None
            raise AssertionError(f"child exited early ({proc.wait()}): {proc.stderr.read()}")
        return text.strip()

    with anyio.fail_after(60):
        return await anyio.to_thread.run_sync(read)


def send(proc: subprocess.Popen[str], text: str) -> None:
    assert proc.stdin is not None
    proc.stdin.write(text + "\n")
    proc.stdin.flush()


async def kill(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    await anyio.to_thread.run_sync(proc.wait)


async def seeded(dsn: str, schema: str, session_id: str, events: list[Any]) -> None:
    async with backend(dsn, schema) as b:
        handle = await b.create(header(session_id))
        handle.append(events)
        await handle.close()


async def test_racing_processes_exactly_one_wins_and_killing_it_frees_the_lock(
    pg_dsn: str, pg_schema: str
) -> None:
    await seeded(pg_dsn, pg_schema, "contended", turn(0, 1))
    racers = [spawn("race", pg_dsn, pg_schema, "contended") for _ in range(3)]
    try:
        for proc in racers:
            assert await line(proc) == "ready"
        for proc in racers:  # release them together
            send(proc, "go")
        answers = [await line(proc) for proc in racers]
        winners = [a for a in answers if a.startswith("won ")]
        assert len(winners) == 1, answers
        assert answers.count("owned") == 2
        winner = racers[answers.index(winners[0])]
        pid = int(winners[0].split()[1])
        async with backend(pg_dsn, pg_schema) as b:
            with pytest.raises(SessionAlreadyOwnedError):
                await b.open("contended", "write")
            await kill(winner)  # SIGKILL: no close, no unlock — only the socket goes away
            await until_gone(pg_dsn, pid)  # PostgreSQL ends its session, and the lock with it
            handle = await b.open("contended", "write")
            assert handle.next_seq == len(turn(0, 1))
            await handle.close()
    finally:
        for proc in racers:
            if proc.poll() is None:
                await kill(proc)


@pytest.mark.parametrize("outcome", ["statement-finishes", "backend-terminated"])
async def test_sigkill_during_a_flush_stores_all_of_the_batch_or_none(
    pg_dsn: str, pg_schema: str, outcome: str
) -> None:
    events = turn(0, 1, tools=1)[:4]  # turn/start, user, step/start, assistant asking for a tool
    batch = [
        events[3],
        ev(
            "tool/call",
            4,
            {"turn": 1, "step": 1, "callId": "call-1-0", "name": "bash", "arguments": "{}"},
        ),
    ]
    await seeded(pg_dsn, pg_schema, "midflush", events[:3])
    proc = spawn("stall", pg_dsn, pg_schema, "midflush")
    sessions = sql.SQL("{}.sessions").format(sql.Identifier(pg_schema))
    try:
        with psycopg.connect(pg_dsn) as blocker:  # a transaction holding the header row
            blocker.execute(
                sql.SQL("SELECT 1 FROM {} WHERE id = 'midflush' FOR UPDATE").format(sessions)
            )
            send(proc, json.dumps(batch))
            reply = await line(proc)
            assert reply.startswith("flushing ")
            pid = int(reply.split()[1])
            # The INSERT's foreign-key check now waits for our row lock.
            await until(
                lambda: bool(
                    query(
                        pg_dsn,
                        "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'",
                        (pid,),
                    )
                )
            )
            await kill(proc)  # the client dies with its statement in flight
            if outcome == "backend-terminated":
                query(pg_dsn, "SELECT pg_terminate_backend(%s)", (pid,))
                await until_gone(pg_dsn, pid)
            blocker.rollback()  # release the row lock; a surviving statement completes now
        await until_gone(pg_dsn, pid)
    finally:
        if proc.poll() is None:
            await kill(proc)
    stored = [json.loads(text) for _, text in stored_rows(pg_dsn, pg_schema, "midflush")]
    assert stored in (plain(events[:3]), plain(events[:3] + batch))  # all or nothing
    if outcome == "backend-terminated":
        assert stored == plain(events[:3])  # rolled back with its backend
    elif query(pg_dsn, "SHOW client_connection_check_interval") == [("0",)]:
        # The server does not watch idle clients mid-statement: the INSERT ran to its commit
        # although nobody was left to hear about it — "outcome unknown" to the writer.
        assert stored == plain(events[:3] + batch)
    # The dead writer's lock is gone; the next owner repairs what is really stored.
    async with backend(pg_dsn, pg_schema) as b:
        writer = await b.open("midflush", "write")
        closers = interrupted_turn_closers((await writer.read()).events)
        expected = ["step/end", "turn/end"]
        if len(stored) == 5:
            expected = ["tool/result", *expected]
            assert closers[0].data.error.code == "TOOL_OUTCOME_UNKNOWN"
        assert [c.type for c in closers] == expected
        writer.append(closers)
        await writer.close()
        assert (await b.inspect("midflush")).closers == ()


async def test_harness_killed_in_a_tool_body_is_resumed_by_another_process(
    pg_dsn: str, pg_schema: str, tmp_path: Path
) -> None:
    proc = spawn("agent", pg_dsn, pg_schema, "crashy", str(tmp_path))
    try:
        assert await line(proc) == "body call-pay"  # the body runs: tool/call is durable
    finally:
        await kill(proc)
    responses = [{"text": "I will check whether invoice 42 was paid."}]
    rows = [
        Row(name="sessions"),
        Row(name="session-persistence-postgres", config={"dsn": pg_dsn, "schema": pg_schema}),
        Row(name="llm"),
        Row(name="tools"),
        Row(id="model", name="llm-scripted", config={"responses": responses}),
        Row(name="agent", config={"provider": "scripted", "model": "scripted"}),
    ]
    async with open_host(rows) as host:
        agent = await host.ctx.agent.resume("crashy")
        events = list(agent.session.events)
        reason = await agent.run_turn("did the payment go through?")
        await agent.aclose()
    kinds = [e.type for e in events]
    call = kinds.index("tool/call")
    assert kinds[call:] == ["tool/call", "tool/result", "step/end", "turn/end", "session/end-seed"]
    closer = events[call + 1]
    assert isinstance(closer.data, ToolResultData)
    assert closer.source_event_seqs == (events[call].seq,)
    assert isinstance(closer.data.error, ToolErrorData)
    assert closer.data.error.code == "TOOL_OUTCOME_UNKNOWN"
    text = closer.data.message.content[0].content[0].text  # type: ignore[union-attr]
    assert text == TOOL_OUTCOME_UNKNOWN_TEXT and "Do not retry blindly." in text
    end = events[call + 3].data
    assert isinstance(end, TurnEnd) and end.reason == InterruptedReason()
    assert reason == CompletedReason()
    stored = [json.loads(t) for _, t in stored_rows(pg_dsn, pg_schema, "crashy")]
    assert [e["seq"] for e in stored] == list(range(len(stored)))
    assert [e["type"] for e in stored].count("turn/end") == 2
    assert stored[: len(events)] == [plain(event_to_builtins(e)) for e in events]


def _verify(dsn: str, schema: str, session_id: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``dsh sessions verify`` on the shipped PostgreSQL composition, in a process of its own."""
    config = Path(__file__).resolve().parents[2] / "configs" / "postgres.yml"
    env = {**os.environ, "DSH_POSTGRES_DSN": dsn, "DSH_POSTGRES_SCHEMA": schema}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "dsh_host",
            "sessions",
            "verify",
            session_id,
            "--config",
            str(config),
            "--json",
        ],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


async def test_verify_of_a_session_another_process_writes_says_held(
    pg_dsn: str, pg_schema: str, tmp_path: Path
) -> None:
    """Issue 42: with a live writer in another process, ``verify`` reports it held (exit 3),
    like the JSONL backend, not "recoverable, run dsh resume" (exit 1) for its open turn."""
    events = turn(0, 1, tools=1)[:4]  # an open turn: without a writer, resume would close it
    await seeded(pg_dsn, pg_schema, "live", events)
    holder = spawn("race", pg_dsn, pg_schema, "live")
    try:
        assert await line(holder) == "ready"
        send(holder, "go")
        won = await line(holder)
        assert won.startswith("won "), won
        pid = int(won.split()[1])
        held = await anyio.to_thread.run_sync(_verify, pg_dsn, pg_schema, "live", tmp_path)
        assert held.returncode == 3, (held.stdout, held.stderr)
        report = json.loads(held.stdout)
        assert report["heldBy"].startswith(f"held by a live writer (PostgreSQL backend pid {pid}")
        await kill(holder)
        await until_gone(pg_dsn, pid)
    finally:
        if holder.poll() is None:
            await kill(holder)
    free = await anyio.to_thread.run_sync(_verify, pg_dsn, pg_schema, "live", tmp_path)
    assert free.returncode == 1, (free.stdout, free.stderr)  # now: interrupted, recoverable
    assert json.loads(free.stdout)["heldBy"] is None

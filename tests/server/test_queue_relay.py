"""``dsh serve --queue``: the flushes a worker announces reach the other workers' LISTEN (not its
own), and the flushes that queued up while a NOTIFY was on its way go out as one notification
per session (issue 36: a NOTIFY is a round trip per flush).

Real PostgreSQL; the relay reads a real memory stream. Asyncio only, as the queue.
"""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import psycopg
import pytest
from anyio.abc import TaskStatus
from psycopg import sql

pytest.importorskip("procrastinate")

from dsh_host._server.queue import Flush, TurnQueue
from dsh_host._server.runtime import ServeOptions, ServerRuntime


def test_queued_flushes_go_out_as_one_notification_per_session(
    pg_dsn: str, pg_prefix: str
) -> None:
    queue = TurnQueue(pg_dsn, f"{pg_prefix}_queue")

    async def main() -> list[str]:
        async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as listener:
            await listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(queue.channel)))
            send, receive = anyio.create_memory_object_stream[Flush](max_buffer_size=100)
            for session_id in ("a", "a", "b", "a"):  # a burst, before the relay reads
                send.send_nowait((session_id, None))
            send.close()
            await queue.relay_flushes(receive)  # returns once the stream is drained and closed
            got: list[str] = []
            with anyio.fail_after(60):  # hang guard only
                async for notice in listener.notifies():
                    got.append(notice.payload)
                    if len(got) == 2:
                        break
            # One per session, in the order of their first flush (one by flush: a, a, ...).
            return got

    assert asyncio.run(main()) == ["a", "b"]


def test_a_worker_is_not_woken_by_its_own_notifications(pg_dsn: str, pg_prefix: str) -> None:
    # Its streams were woken at the flush itself; a second wake-up, once the turn has ended,
    # made every stream of the session read the table again.
    queue = TurnQueue(pg_dsn, f"{pg_prefix}_queue")

    async def main() -> list[str]:
        woken: list[str] = []
        other = anyio.Event()

        def wake(session_id: str, _end: int | None) -> None:
            woken.append(session_id)
            if session_id == "other":
                other.set()

        async with (
            await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as outside,
            anyio.create_task_group() as group,
        ):
            group.start_soon(queue.listen, wake)
            with anyio.fail_after(60):  # hang guard only: wait for the LISTEN to be in place
                for _ in itertools.count():
                    listening = await outside.execute(
                        "SELECT 1 FROM pg_stat_activity WHERE query = %s",
                        (f'LISTEN "{queue.channel}"',),
                    )
                    if await listening.fetchone():
                        break
                    await anyio.sleep(0.05)
            send, receive = anyio.create_memory_object_stream[Flush](max_buffer_size=10)
            send.send_nowait(("own", None))
            send.close()
            await queue.relay_flushes(receive)
            # Sent after the relay's commit: delivered after its notification.
            await outside.execute("SELECT pg_notify(%s, 'other')", (queue.channel,))
            with anyio.fail_after(60):  # hang guard only
                await other.wait()
            group.cancel_scope.cancel()
        return woken

    assert asyncio.run(main()) == ["other"]


def test_a_notification_past_what_a_stream_has_seen_wakes_it_and_no_other_does(
    pg_dsn: str, pg_prefix: str, tmp_path: Path
) -> None:
    # docs/decisions.md D51. A stream on one worker, its session's turn on another: each flush
    # there is a NOTIFY here, and a NOTIFY that comes after the stream has already read that
    # far (woken by the one before, read after both flushes) woke it for a read that found
    # nothing. The NOTIFY carries the end it announces, and only a stream behind it is woken.
    here = TurnQueue(pg_dsn, f"{pg_prefix}_queue")
    there = TurnQueue(pg_dsn, f"{pg_prefix}_queue")  # the other worker: another backend

    async def main() -> list[bool]:
        async with (
            await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as outside,
            anyio.create_task_group() as group,
        ):
            options = ServeOptions(compositions={}, default_workspace=str(tmp_path),
                                   poll_interval=3600.0)  # no idle poll in this window
            runtime = ServerRuntime(options, group)
            group.start_soon(here.listen, runtime._wake)
            await _listening(outside, here.channel)

            async def announce(*flushes: Flush) -> None:
                send, receive = anyio.create_memory_object_stream[Flush](max_buffer_size=10)
                for flush in flushes:
                    send.send_nowait(flush)
                send.close()
                await there.relay_flushes(receive)

            async def waiting(
                session_id: str, after: int, woken: list[bool], *, task_status: TaskStatus[None]
            ) -> None:
                # started() before the wait: the wait registers the stream before it yields
                task_status.started()
                woken.append(await runtime.wait_for_events(session_id, after, 60))

            async def follow(after: int, *flushes: Flush) -> bool:
                # A stream that has seen up to seq ``after`` waits; the flushes are announced,
                # then a marker of another session, delivered after them (one sender, one
                # backend: in commit order).
                stream: list[bool] = []
                marker: list[bool] = []
                async with anyio.create_task_group() as inner:
                    await inner.start(waiting, "s", after, stream)
                    await inner.start(waiting, "marker", -1, marker)
                    await announce(*flushes)
                    await announce(("marker", 1))
                    with anyio.fail_after(60):  # hang guard only
                        while not marker:
                            await anyio.lowlevel.checkpoint()
                    inner.cancel_scope.cancel()
                return stream == [True]

            woke = [
                await follow(11, ("s", 12)),  # it has seen seq 11: the store's end 12 is not news
                await follow(11, ("s", 10), ("s", 12)),  # two flushes, one NOTIFY: the furthest
                await follow(11, ("s", 13)),  # seq 12 is new
                await follow(11, ("s", 12), ("s", None)),  # a flush that did not tell its end
            ]
            group.cancel_scope.cancel()
        return woke

    assert asyncio.run(main()) == [False, False, True, True]


async def _listening(outside: psycopg.AsyncConnection[Any], channel: str) -> None:
    with anyio.fail_after(60):  # hang guard only: wait for the LISTEN to be in place
        for _ in itertools.count():
            listening = await outside.execute(
                "SELECT 1 FROM pg_stat_activity WHERE query = %s", (f'LISTEN "{channel}"',)
            )
            if await listening.fetchone():
                return
            await anyio.sleep(0.05)

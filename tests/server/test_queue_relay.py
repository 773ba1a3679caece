"""``dsh serve --queue``: the flushes a worker announces reach the other workers' LISTEN (not its
own), and the flushes that queued up while a NOTIFY was on its way go out as one notification
per session (issue 36: a NOTIFY is a round trip per flush).

Real PostgreSQL; the relay reads a real memory stream. Asyncio only, as the queue.
"""

from __future__ import annotations

import asyncio
import itertools

import anyio
import psycopg
import pytest
from psycopg import sql

pytest.importorskip("procrastinate")

from dsh_host._server.queue import TurnQueue


def test_queued_flushes_go_out_as_one_notification_per_session(
    pg_dsn: str, pg_prefix: str
) -> None:
    queue = TurnQueue(pg_dsn, f"{pg_prefix}_queue")

    async def main() -> list[str]:
        async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as listener:
            await listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(queue.channel)))
            send, receive = anyio.create_memory_object_stream[str](max_buffer_size=100)
            for session_id in ("a", "a", "b", "a"):  # a burst, before the relay reads
                send.send_nowait(session_id)
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

        def wake(session_id: str) -> None:
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
            send, receive = anyio.create_memory_object_stream[str](max_buffer_size=10)
            send.send_nowait("own")
            send.close()
            await queue.relay_flushes(receive)
            # Sent after the relay's commit: delivered after its notification.
            await outside.execute("SELECT pg_notify(%s, 'other')", (queue.channel,))
            with anyio.fail_after(60):  # hang guard only
                await other.wait()
            group.cancel_scope.cancel()
        return woken

    assert asyncio.run(main()) == ["other"]

"""``dsh serve --queue``: the flushes a worker announces reach the other workers' LISTEN, and
the flushes that queued up while a NOTIFY was on its way go out as one notification per
session (issue 36: a NOTIFY is a round trip per flush).

Real PostgreSQL; the relay reads a real memory stream. Asyncio only, as the queue.
"""

from __future__ import annotations

import asyncio

import anyio
import psycopg
import pytest
from psycopg import sql

pytest.importorskip("procrastinate")

from dsh_host.server.queue import TurnQueue


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

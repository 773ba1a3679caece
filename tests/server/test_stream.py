"""``GET /sessions/{id}/stream``: server-sent events of new events, resumable by seq."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from .harness import read_sse, running_server

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]


def turn_end(turn: int) -> Any:
    return lambda data: data["type"] == "turn/end" and data["data"]["turn"] == turn


SLOW_TEXT = {"text": "one two three four five six seven eight", "chunk_delay_ms": 20}


async def test_a_stream_follows_a_turn_live_and_ids_are_seqs(tmp_path: Path) -> None:
    async with running_server(tmp_path, [SLOW_TEXT, {"text": "second answer"}]) as server:
        session_id = await server.create()
        # Open the stream first, then start the turn: every event arrives through the stream.
        frames = await read_sse(
            server.client, f"/sessions/{session_id}/stream", until=turn_end(1),
            started=lambda: server.turn(session_id, "count slowly"),
        )
        seqs = [seq for seq, _, _ in frames]
        # a new stream shows new events: all of the turn's, after the creation's run terms (seq 0)
        assert seqs == list(range(1, len(frames) + 1))
        assert all(event == data["type"] and seq == data["seq"] for seq, event, data in frames)
        stored = await server.events(session_id)
        assert [e["type"] for e in stored[:1]] == ["run/terms"]
        assert [e["seq"] for e in stored[1:]] == seqs  # nothing missed, nothing twice
        await server.wait_turn_end(session_id, 1)  # turn/end is streamed before the release
        # The next turn, from where the client left off (Last-Event-ID = the last seq seen).
        resumed = await read_sse(
            server.client, f"/sessions/{session_id}/stream", until=turn_end(2),
            headers={"Last-Event-ID": str(seqs[-1])},
            started=lambda: server.turn(session_id, "again"),
        )
        assert resumed[0][0] == seqs[-1] + 1
        assert [seq for seq, _, _ in resumed] == list(range(seqs[-1] + 1, resumed[-1][0] + 1))


async def test_last_event_id_replays_what_was_missed(tmp_path: Path) -> None:
    async with running_server(tmp_path, [{"text": "done"}]) as server:
        session_id = await server.create()
        await server.turn(session_id, "hi")
        await server.wait_turn_end(session_id, 1)
        stored = await server.events(session_id)
        middle = stored[len(stored) // 2]["seq"]
        frames = await read_sse(
            server.client, f"/sessions/{session_id}/stream", until=turn_end(1),
            headers={"Last-Event-ID": str(middle)},
        )
        assert [seq for seq, _, _ in frames] == [e["seq"] for e in stored if e["seq"] > middle]
        by_query = await read_sse(
            server.client, f"/sessions/{session_id}/stream?after={middle}", until=turn_end(1))
        assert by_query == frames


async def test_a_stream_of_an_unknown_session_is_a_json_404(tmp_path: Path) -> None:
    async with running_server(tmp_path, [{"text": "x"}]) as server:
        response = await server.client.get("/sessions/nope/stream")
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "SESSION_NOT_FOUND"
        bad = await server.client.get("/sessions/nope/stream", headers={"Last-Event-ID": "x"})
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "INVALID_REQUEST"


#: A follower in its own process: copies the SSE stream to its stdout, line by line.
FOLLOWER = """
import sys, urllib.request
with urllib.request.urlopen(sys.argv[1]) as stream:
    for line in stream:
        sys.stdout.write(line.decode()); sys.stdout.flush()
"""
LONG_TEXT = {"text": " ".join(f"word{i}" for i in range(60)), "chunk_delay_ms": 20}


async def test_a_killed_follower_leaves_the_turn_and_the_log_whole(tmp_path: Path) -> None:
    """A reader that dies mid-turn (SIGKILL: its socket closes under the server) stops only
    its own stream: the turn ends ``completed``, every event is stored, ``verify`` says 0."""
    async with running_server(tmp_path, [LONG_TEXT]) as server:
        session_id = await server.create()
        follower = subprocess.Popen(  # noqa: ASYNC220 - read from a thread, killed at once
            [sys.executable, "-c", FOLLOWER, f"{server.url}/sessions/{session_id}/stream"],
            stdout=subprocess.PIPE, text=True,
        )
        try:
            assert follower.stdout is not None
            first = await anyio.to_thread.run_sync(follower.stdout.readline)
            assert first.startswith(": dsh event stream"), first
            await server.turn(session_id, "count slowly")
            line = "-"
            # request/context is the last event before the model streams: the turn is running.
            while line and not line.startswith("event: request/context"):
                line = await anyio.to_thread.run_sync(follower.stdout.readline)
            assert line, "the follower's stream ended before the model request"
        finally:
            follower.kill()
            follower.wait()
        ended = await server.wait_turn_end(session_id, 1)
        assert ended["lastTurnEnd"]["kind"] == "completed", ended
        stored = await server.events(session_id)
        assert [e["seq"] for e in stored] == list(range(len(stored)))
        assert stored[-1]["type"] == "turn/end"
    verify = await anyio.run_process(
        [sys.executable, "-m", "dsh_host", "sessions", "verify", session_id,
         "--root", str(server.root)],
        cwd=tmp_path, check=False,
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr

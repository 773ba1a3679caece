"""A wake-up says how far the store holds the session; a stream that has read that far is not
woken for a read that finds nothing (docs/decisions.md D51, issue 36).

A turn's flushes wake the session's idle streams, and the turn's close wakes them once more
("the store has it all now"). A stream that had already read the turn to its end from that
last flush read again at the close and found nothing: a read of the store for nothing, at
every turn a stream follows. Here the streams waiting are real ``wait_for_events`` calls of a
real in-process runtime running real turns (scripted model, JSONL store); the count is the
wake-ups each stream gets.
"""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest
from anyio.abc import TaskStatus

from dsh_host._server.command import build_compositions
from dsh_host._server.runtime import ServeOptions, ServerRuntime

from .harness import write_composition

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]


async def test_a_stream_that_has_read_a_turn_to_its_end_is_not_woken_again(
    tmp_path: Path,
) -> None:
    workspace, root = tmp_path / "ws", tmp_path / "sessions"
    workspace.mkdir()
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": [{"text": f"answer {n}"} for n in range(4)]}))
    options = ServeOptions(
        compositions=build_compositions(
            str(write_composition(tmp_path)), [], f"scripted:{script}", str(root)
        ),
        default_workspace=str(workspace.resolve()),
        poll_interval=3600.0,  # no idle poll: every wake-up here is a flush's or a close's
    )

    async def turn(runtime: ServerRuntime, prompt: str) -> int:
        """Run a turn to its close; the store's end (the seq after its last event) then."""
        await runtime.start_turn("s", prompt)
        with anyio.fail_after(60):  # hang guard only
            while runtime.running("s") is not None:
                await anyio.lowlevel.checkpoint()
        return await runtime.stored_end("s") + 1

    async def waiting(
        runtime: ServerRuntime, after: int, woken: list[bool], *, task_status: TaskStatus[None]
    ) -> None:
        task_status.started()  # the wait registers the stream before it first yields
        woken.append(await runtime.wait_for_events("s", after, 60))

    async with anyio.create_task_group() as group:
        runtime = ServerRuntime(options, group)
        await runtime.start()
        await runtime.create_session(workspace=None, composition=None, session_id="s")
        first = await turn(runtime, "one")  # the first turn stores more (the system prompt)
        end = await turn(runtime, "two")
        length = end - first  # every later turn stores as many events
        woken: list[list[bool]] = []
        # A stream that has seen the next turn to its end (as one woken by its last flush
        # and read from the turn's memory has), then one that has not seen its last event.
        # (The streams of a session share their wake-up: one at a time.)
        for missing, prompt in ((0, "three"), (1, "four")):
            stream: list[bool] = []
            async with anyio.create_task_group() as streams:
                await streams.start(waiting, runtime, end + length - 1 - missing, stream)
                end = await turn(runtime, prompt)
                for _ in range(100):  # the close's wake-up, had there been one, is delivered
                    await anyio.lowlevel.checkpoint()
                streams.cancel_scope.cancel()
            woken.append(stream)
        runtime.close()
    assert end == first + 3 * length
    assert woken == [[], [True]]

"""The persistence backend contract, reusable by every backend.

A backend's test module provides a ``backend_factory`` fixture (an object
satisfying :class:`BackendFactory`) and star-imports the tests from here::

    from .contract import *  # noqa: F403

    @pytest.fixture
    def backend_factory(tmp_path): return MyFactory(tmp_path)

Everything here goes through the seam in ``dsh_host._persistence.persistence``
only; real files / real databases, real subprocesses for the lock and crash
cases. No test asserts on timing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Protocol

import anyio
import anyio.lowlevel
import pytest

from dsh_host._cancel import CancelToken
from dsh_host._persistence.persistence import (
    SessionAlreadyExistsError,
    SessionAlreadyOwnedError,
    SessionAppendRejectedError,
    SessionHandleClosedError,
    SessionNotFoundError,
)
from dsh_host._persistence.storage import SupportsStoredEnds
from dsh_host._session.events import RequestHeaderData, SessionEvent, event_to_builtins
from dsh_host._session.messages import EpochHeader, LlmCallConfig
from dsh_host._session.repair import TOOL_NOT_STARTED_TEXT, TOOL_OUTCOME_UNKNOWN_TEXT
from dsh_host.errors import AbortError

from .helpers import ev, header, log, plain, turn

__all__ = [
    "BackendFactory",
    "backend_of",
    "test_abandoned_lazy_id_is_reusable",
    "test_append_is_visible_through_the_handle_before_flush",
    "test_append_rejects_non_json_data",
    "test_append_rejects_seq_mismatch",
    "test_closed_handle_refuses",
    "test_concurrent_closes_drain_once_and_release_once",
    "test_concurrent_flushes_write_each_event_once",
    "test_create_rejects_invalid_header_without_reserving_the_id",
    "test_create_rejects_known_ids",
    "test_created_session_is_absent_until_flushed_then_header_only",
    "test_current_revision_is_what_a_read_would_report",
    "test_ignorable_unknown_event_is_kept",
    "test_inspect_synthesizes_closers_without_writing",
    "test_list_returns_headers",
    "test_open_missing_session",
    "test_pre_aborted_token_raises_the_reason",
    "test_read_from_gives_the_suffix_and_follows_appends",
    "test_resume_appends_closers_and_continues",
    "test_retired_shapes_never_enter_a_log",
    "test_round_trip",
    "test_second_writer_in_process_is_refused",
    "test_sessions_flush_concurrently",
    "test_sigkill_of_writer_keeps_every_flushed_event",
    "test_stored_ends_are_each_sessions_next_seq_or_left_out",
    "test_two_processes_racing_for_write_one_wins",
    "test_writer_in_another_process_excludes_until_killed",
]

pytestmark = pytest.mark.anyio

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "child.py")


class BackendFactory(Protocol):
    """How the contract builds backend instances over one shared store."""

    def make(self, store: str, spawn: Callable[..., Any] | None) -> Any:
        """A fresh backend instance over ``store`` (same store name → same data)."""
        ...

    def child_source(self, store: str) -> str:
        """Python source defining ``make_backend(spawn)`` over ``store``, for subprocesses."""
        ...


@asynccontextmanager
async def backend_of(factory: BackendFactory, store: str = "main") -> AsyncIterator[Any]:
    """A backend with a task group for its write windows; closed (drained) on exit."""
    async with anyio.create_task_group() as tg:
        backend = factory.make(store, tg.start_soon)
        try:
            yield backend
        finally:
            await backend.aclose()
            tg.cancel_scope.cancel()


def wire(events: Any) -> list[Any]:
    return [plain(event_to_builtins(e)) for e in events]


# --------------------------------------------------------------------------- basics


async def test_round_trip(backend_factory: BackendFactory) -> None:
    events = log(2, tools=1)
    async with backend_of(backend_factory) as backend:
        handle = await backend.create(header("rt", agentPreset="default", delegationDepth=1))
        handle.append(events[:5])
        await handle.flush()
        handle.append(events[5:])
        await handle.close()
    async with backend_of(backend_factory) as backend:
        reader = await backend.open("rt", "read")
        load = await reader.read()
        assert wire(load.events) == plain(events)
        assert load.last_seq == len(events) - 1
        assert load.torn_tail is None
        assert load.closers == ()
        assert load.header.id == "rt"
        assert load.header.agent_preset == "default"
        assert load.header.delegation_depth == 1
        assert load.header.cwd == "/home/dev/project"


async def test_read_from_gives_the_suffix_and_follows_appends(
    backend_factory: BackendFactory,
) -> None:
    """What a follower polls: the events from a seq on, nothing once it has read to the end
    (however often it asks), then exactly what was appended since."""
    events = log(2, tools=1)
    async with backend_of(backend_factory) as backend:
        handle = await backend.create(header("follow"))
        handle.append(events[:5])
        await handle.flush()
        async with backend_of(backend_factory) as follower:
            assert wire(await follower.read_from("follow", 0)) == plain(events[:5])
            assert wire(await follower.read_from("follow", 3)) == plain(events[3:5])
            # A page: at most ``limit`` events (a reader walking a long log holds one page).
            assert wire(await follower.read_from("follow", 1, limit=2)) == plain(events[1:3])
            assert wire(await follower.read_from("follow", 4, limit=9)) == plain(events[4:5])
            for _ in range(2):
                assert await follower.read_from("follow", 5) == ()
            assert await follower.read_from("follow", 10_000) == ()
            handle.append(events[5:])
            await handle.flush()
            assert wire(await follower.read_from("follow", 5)) == plain(events[5:])
            assert await follower.read_from("follow", len(events)) == ()
            with pytest.raises(SessionNotFoundError, match='session "absent" not found'):
                await follower.read_from("absent", 0)
        await handle.close()


async def test_current_revision_is_what_a_read_would_report(
    backend_factory: BackendFactory,
) -> None:
    """The optional ``current_revision``: where the backend can tell it without reading, it is
    the revision a read reports, and it moves with every stored append; None otherwise, and
    for a session that is not stored."""
    events = log(1)
    async with backend_of(backend_factory) as backend:
        current = getattr(backend, "current_revision", None)
        if current is None:
            pytest.skip("this backend offers no current_revision")
        assert await current("later") is None
        handle = await backend.create(header("later"))
        assert await current("later") is None  # nothing stored before the first flush
        handle.append(events[:2])
        await handle.flush()
        first = await current("later")
        if first is None:  # a storage that cannot tell: it says so every time
            assert await current("later") is None
        else:
            assert first == (await backend.inspect("later")).revision
            handle.append(events[2:])
            await handle.flush()
            now = await current("later")
            assert now != first and now == (await backend.inspect("later")).revision
        await handle.close()


async def test_stored_ends_are_each_sessions_next_seq_or_left_out(
    backend_factory: BackendFactory,
) -> None:
    """The optional ``stored_ends`` (D47: a server's idle poll): in one call, the next seq of
    each session the storage can tell without a read; a session not stored is left out, and
    so is one it cannot vouch for (the caller reads it). Once a reader has read a log to its
    end, every storage that offers it tells that log's end, and a later append moves it (or
    leaves the session out until it is read again)."""
    events = log(1)
    async with backend_of(backend_factory) as backend:
        if not isinstance(backend.storage, SupportsStoredEnds):
            pytest.skip("this backend offers no stored_ends")
        assert await backend.stored_ends([]) == {}
        assert await backend.stored_ends(["absent"]) == {}
        handle = await backend.create(header("ends"))
        handle.append(events[:3])
        await handle.flush()
        async with backend_of(backend_factory) as reader:
            assert len(await reader.read_from("ends", 0)) == 3
            assert await reader.stored_ends(["absent", "ends"]) == {"ends": 3}
            handle.append(events[3:])
            await handle.flush()
            assert (await reader.stored_ends(["ends"])).get("ends", len(events)) == len(events)
            assert len(await reader.read_from("ends", 3)) == len(events) - 3
            assert await reader.stored_ends(["ends"]) == {"ends": len(events)}
        await handle.close()


async def test_append_is_visible_through_the_handle_before_flush(
    backend_factory: BackendFactory,
) -> None:
    events = log(1)
    async with backend_of(backend_factory) as backend:
        handle = await backend.create(header("vis"))
        handle.append(events)
        assert handle.next_seq == len(events)
        assert wire((await handle.read()).events) == plain(events)
        await handle.flush()
        assert handle.durable_seq == len(events)
        async with backend_of(backend_factory) as other:
            load = await (await other.open("vis", "read")).read()
            assert wire(load.events) == plain(events)


async def test_created_session_is_absent_until_flushed_then_header_only(
    backend_factory: BackendFactory,
) -> None:
    async with backend_of(backend_factory) as backend:
        handle = await backend.create(header("lazy"))
        assert [item.header.id for item in await backend.list()] == []
        with pytest.raises(SessionNotFoundError, match='session "lazy" not found'):
            await backend.open("lazy", "read")
        await handle.flush()
        assert [item.header.id for item in await backend.list()] == ["lazy"]
        load = await (await backend.open("lazy", "read")).read()
        assert load.events == () and load.last_seq is None


async def test_abandoned_lazy_id_is_reusable(backend_factory: BackendFactory) -> None:
    async with backend_of(backend_factory) as backend:
        handle = await backend.create(header("again"))
        await handle.close()
        second = await backend.create(header("again"))
        second.append(log(1))
        await second.flush()
        assert len((await (await backend.open("again", "read")).read()).events) == len(log(1))


async def test_create_rejects_known_ids(backend_factory: BackendFactory) -> None:
    async with backend_of(backend_factory) as backend:
        await backend.create(header("dup"))
        with pytest.raises(SessionAlreadyExistsError, match="already exists in this backend"):
            await backend.create(header("dup"))
        stored = await backend.create(header("stored"))
        await stored.flush()
        await stored.close()
    async with backend_of(backend_factory) as backend:
        with pytest.raises(SessionAlreadyExistsError, match="already has a persisted log"):
            await backend.create(header("stored"))


async def test_create_rejects_invalid_header_without_reserving_the_id(
    backend_factory: BackendFactory,
) -> None:
    async with backend_of(backend_factory) as backend:
        with pytest.raises(Exception, match="createdAt"):
            await backend.create({**header("bad"), "createdAt": 1.5})
        with pytest.raises(Exception, match="losslessly JSON-serializable"):
            await backend.create({**header("bad"), "cwd": float("nan")})
        handle = await backend.create(header("bad"))
        assert handle.id == "bad"


async def test_append_rejects_seq_mismatch(backend_factory: BackendFactory) -> None:
    events = log(1)
    async with backend_of(backend_factory) as backend:
        handle = await backend.create(header("seq"))
        handle.append(events[:3])
        await handle.flush()
        with pytest.raises(SessionAppendRejectedError, match="expected 3 at index 0, got 0"):
            handle.append(events[:3])
        with pytest.raises(SessionAppendRejectedError, match="expected 4 at index 1, got 5"):
            handle.append([events[3], events[5]])
        assert handle.next_seq == 3  # a rejected batch leaves nothing behind
        handle.append(events[3:])
        await handle.close()
    async with backend_of(backend_factory) as backend:
        load = await (await backend.open("seq", "read")).read()
        assert wire(load.events) == plain(events)


async def test_append_rejects_non_json_data(backend_factory: BackendFactory) -> None:
    async with backend_of(backend_factory) as backend:
        handle = await backend.create(header("json"))
        for bad in (float("inf"), float("nan"), -0.0, 2**60, {1: "x"}, {"x": object()}, {"s"}):
            with pytest.raises(SessionAppendRejectedError, match="losslessly JSON-serializable"):
                handle.append([ev("todo/write", 0, {"todos": [], "extra": bad})])
        cyclic: dict[str, Any] = {}
        cyclic["self"] = cyclic
        with pytest.raises(SessionAppendRejectedError, match="losslessly JSON-serializable"):
            handle.append([ev("todo/write", 0, cyclic)])
        assert handle.next_seq == 0


async def test_ignorable_unknown_event_is_kept(backend_factory: BackendFactory) -> None:
    event = ev("future-plugin/thing", 0, {"anything": [1, 2]}, ignorable=True)
    async with backend_of(backend_factory) as backend:
        handle = await backend.create(header("ign"))
        handle.append([event])
        await handle.close()
        load = await (await backend.open("ign", "read")).read()
        assert wire(load.events) == [plain(event)]


async def test_closed_handle_refuses(backend_factory: BackendFactory) -> None:
    async with backend_of(backend_factory) as backend:
        handle = await backend.create(header("closed"))
        handle.append(log(1)[:1])
        await handle.close()
        await handle.close()  # idempotent
        with pytest.raises(SessionHandleClosedError):
            handle.append(log(1)[1:2])
        with pytest.raises(SessionHandleClosedError):
            await handle.flush()


async def test_open_missing_session(backend_factory: BackendFactory) -> None:
    async with backend_of(backend_factory) as backend:
        for mode in ("read", "write"):
            with pytest.raises(SessionNotFoundError, match='session "nope" not found'):
                await backend.open("nope", mode)


async def test_pre_aborted_token_raises_the_reason(backend_factory: BackendFactory) -> None:
    reason = object()
    token = CancelToken()
    token.abort(reason)
    async with backend_of(backend_factory) as backend:
        handle = await backend.create(header("abort"))
        await handle.flush()
        calls: tuple[Callable[[], Awaitable[object]], ...] = (
            lambda: backend.open("abort", "read", token=token),
            lambda: backend.open("abort", "write", token=token),
            lambda: backend.inspect("abort", token=token),
            lambda: backend.list(token=token),
        )
        for call in calls:
            with pytest.raises(AbortError) as raised:
                await call()
            assert raised.value.reason is reason


async def test_list_returns_headers(backend_factory: BackendFactory) -> None:
    async with backend_of(backend_factory) as backend:
        for sid, cwd in (("a", "/p/one"), ("b", "/p/two"), ("c", "/p/one")):
            handle = await backend.create(header(sid, cwd=cwd))
            handle.append(log(1))
            await handle.close()
        listed = await backend.list()
        assert sorted(item.header.id for item in listed) == ["a", "b", "c"]
        assert {item.header.id: item.header.cwd for item in listed} == {
            "a": "/p/one",
            "b": "/p/two",
            "c": "/p/one",
        }
        again = await backend.list()
        assert [i.revision for i in again] == [i.revision for i in listed]


# --------------------------------------------------------------------------- ownership


async def test_second_writer_in_process_is_refused(backend_factory: BackendFactory) -> None:
    async with backend_of(backend_factory) as backend:
        handle = await backend.create(header("own"))
        handle.append(log(1))
        await handle.flush()
        with pytest.raises(SessionAlreadyExistsError):
            await backend.create(header("own"))
        with pytest.raises(SessionAlreadyOwnedError):
            await backend.open("own", "write")
        async with backend_of(backend_factory) as other:
            with pytest.raises(SessionAlreadyOwnedError):
                await other.open("own", "write")
            reader = await other.open("own", "read")  # readers never lock
            assert len((await reader.read()).events) == len(log(1))
        await handle.close()
        again = await backend.open("own", "write")
        assert again.next_seq == len(log(1))
        await again.close()


def _child(factory: BackendFactory, store: str, *args: str) -> subprocess.Popen[str]:
    env = dict(os.environ, DSH_TEST_BACKEND=factory.child_source(store))
    return subprocess.Popen(
        [sys.executable, CHILD, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _read_line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        assert proc.stderr is not None
        raise AssertionError(f"child exited early: {proc.wait()} {proc.stderr.read()}")
    return line.strip()


@pytest.mark.parametrize("anyio_backend", ["trio"])  # real processes; one event loop suffices
async def test_writer_in_another_process_excludes_until_killed(
    backend_factory: BackendFactory,
) -> None:
    async with backend_of(backend_factory) as backend:
        handle = await backend.create(header("xproc"))
        handle.append(log(1))
        await handle.close()
    proc = _child(backend_factory, "main", "hold", "xproc")
    try:
        assert await anyio.to_thread.run_sync(_read_line, proc) == "locked"
        async with backend_of(backend_factory) as backend:
            with pytest.raises(SessionAlreadyOwnedError):
                await backend.open("xproc", "write")
            assert len((await (await backend.open("xproc", "read")).read()).events) == len(log(1))
    finally:
        proc.send_signal(signal.SIGKILL)
        await anyio.to_thread.run_sync(proc.wait)
    async with backend_of(backend_factory) as backend:
        handle = await backend.open("xproc", "write")
        assert handle.next_seq == len(log(1))
        await handle.close()


@pytest.mark.parametrize("anyio_backend", ["trio"])  # real processes; one event loop suffices
async def test_two_processes_racing_for_write_one_wins(
    backend_factory: BackendFactory, tmp_path: Any
) -> None:
    async with backend_of(backend_factory) as backend:
        handle = await backend.create(header("race"))
        handle.append(log(1))
        await handle.close()
    go = os.path.join(str(tmp_path), "go")
    racers = [_child(backend_factory, "main", "race", "race", go) for _ in range(2)]
    try:
        await anyio.Path(go).touch()
        results = [await anyio.to_thread.run_sync(_read_line, p) for p in racers]
        assert sorted(results) == ["owned", "won"]
        winner = racers[results.index("won")]
        async with backend_of(backend_factory) as backend:
            with pytest.raises(SessionAlreadyOwnedError):
                await backend.open("race", "write")
        winner.send_signal(signal.SIGKILL)
        await anyio.to_thread.run_sync(winner.wait)
        async with backend_of(backend_factory) as backend:
            handle = await backend.open("race", "write")  # the kernel dropped the dead lock
            await handle.close()
    finally:
        for proc in racers:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            await anyio.to_thread.run_sync(proc.wait)


@pytest.mark.parametrize("anyio_backend", ["trio"])  # real processes; one event loop suffices
async def test_sigkill_of_writer_keeps_every_flushed_event(
    backend_factory: BackendFactory,
) -> None:
    from .child import deterministic_events

    expected = plain(deterministic_events(5_000))
    for round_no, batch in enumerate((1, 7, 50)):
        sid = f"crash-{round_no}"
        proc = _child(backend_factory, "main", "write", sid, str(batch), "create")
        flushed = 0
        try:
            for _ in range(3 + round_no * 2):
                line = await anyio.to_thread.run_sync(_read_line, proc)
                flushed = int(line.split()[1])
        finally:
            proc.send_signal(signal.SIGKILL)
            await anyio.to_thread.run_sync(proc.wait)
        async with backend_of(backend_factory) as backend:
            load = await (await backend.open(sid, "read")).read()
            got = wire(load.events)
            # Never less than what flush() had reported, and always an exact prefix of what
            # was sent (the child may have flushed more batches after its last report).
            assert len(got) >= flushed
            assert got == expected[: len(got)]
            writer = await backend.open(sid, "write")  # the crash tail is repairable
            # Under the write lock the dead writer is gone for good. Until then a database
            # server may still commit the transaction it had sent before the kill (CI saw
            # PostgreSQL do it once): what was read before is a prefix of what is stored now.
            settled = wire((await writer.read()).events)
            assert settled[: len(got)] == got and settled == expected[: len(settled)]
            await writer.flush()
            await writer.close()
            again = await (await backend.open(sid, "read")).read()
            assert wire(again.events) == settled
            assert again.torn_tail is None


# --------------------------------------------------------------------------- repair


async def test_inspect_synthesizes_closers_without_writing(
    backend_factory: BackendFactory,
) -> None:
    events = log(2, tools=0, last_closed=False)  # turn 2 crashed before turn/end
    events += [
        ev("step/start", len(events), {"turn": 2, "step": 2}),
    ]
    async with backend_of(backend_factory) as backend:
        handle = await backend.create(header("insp"))
        handle.append(events)
        await handle.close()
        before = await backend.list()
        load = await backend.inspect("insp")
        closers = wire(load.closers)
        assert [c["type"] for c in closers] == ["step/end", "turn/end"]
        assert [c["seq"] for c in closers] == [len(events), len(events) + 1]
        assert closers[1]["data"] == {"turn": 2, "reason": {"kind": "interrupted"}}
        assert all(c["time"] == events[-1]["time"] for c in closers)
        assert [i.revision for i in await backend.list()] == [i.revision for i in before]
        reread = await (await backend.open("insp", "read")).read()
        assert reread.closers == () and len(reread.events) == len(events)


async def test_resume_appends_closers_and_continues(backend_factory: BackendFactory) -> None:
    events = turn(0, 1, closed=False, tools=0)[:4]  # turn/start, user, step/start, assistant
    events[-1] = turn(0, 1, tools=2)[3]  # the assistant asks for two tools
    events.append(
        ev(
            "tool/call",
            4,
            {"turn": 1, "step": 1, "callId": "call-1-0", "name": "bash", "arguments": "{}"},
        )
    )
    async with backend_of(backend_factory) as backend:
        handle = await backend.create(header("resume"))
        handle.append(events)
        await handle.close()
        before = (await backend.list())[0].revision
        writer = await backend.open("resume", "write")
        load = await writer.read()
        from dsh_host._session.repair import interrupted_turn_closers

        closers = interrupted_turn_closers(load.events)
        writer.append(closers)
        await writer.flush()
        after = (await backend.list())[0].revision
        assert after != before
        writer.append([ev("turn/start", writer.next_seq, {"turn": 2})])
        await writer.close()
        stored = wire((await (await backend.open("resume", "read")).read()).events)
        assert [e["type"] for e in stored[5:]] == [
            "tool/result",
            "tool/result",
            "step/end",
            "turn/end",
            "turn/start",
        ]
        unknown, not_started = stored[5], stored[6]
        assert unknown["data"]["error"]["code"] == "TOOL_OUTCOME_UNKNOWN"
        assert unknown["sourceEventSeqs"] == [4]
        assert unknown["data"]["message"]["content"][0]["content"][0]["text"] == (
            TOOL_OUTCOME_UNKNOWN_TEXT
        )
        assert not_started["data"]["error"]["code"] == "TOOL_NOT_STARTED"
        assert "sourceEventSeqs" not in not_started
        assert not_started["data"]["message"]["content"][0]["content"][0]["text"] == (
            TOOL_NOT_STARTED_TEXT
        )
        # Turn 1 is balanced now; only the freshly opened turn 2 would need a closer.
        assert [c.type for c in (await backend.inspect("resume")).closers] == ["turn/end"]


async def test_sessions_flush_concurrently(backend_factory: BackendFactory) -> None:
    """Several sessions' batches are written at the same time (on worker threads)."""
    events = log(6, tools=3)
    async with backend_of(backend_factory) as backend:
        handles = [await backend.create(header(f"par-{n}")) for n in range(6)]

        async def write(handle: Any) -> None:
            for start in range(0, len(events), 7):
                handle.append(events[start : start + 7])
                await handle.flush()

        async with anyio.create_task_group() as tg:
            for handle in handles:
                tg.start_soon(write, handle)
        for handle in handles:
            await handle.close()
        for n in range(6):
            load = await (await backend.open(f"par-{n}", "read")).read()
            assert wire(load.events) == plain(events)


async def test_concurrent_flushes_write_each_event_once(backend_factory: BackendFactory) -> None:
    events = log(8, tools=2)
    async with backend_of(backend_factory) as backend:
        handle = await backend.create(header("conc"))
        async with anyio.create_task_group() as tg:
            for start in range(0, len(events), 5):
                handle.append(events[start : start + 5])
                for _ in range(3):
                    tg.start_soon(handle.flush)
                await anyio.lowlevel.checkpoint()
        await handle.flush()
        assert handle.durable_seq == len(events)
        await handle.close()
    async with backend_of(backend_factory) as backend:
        load = await (await backend.open("conc", "read")).read()
        assert wire(load.events) == plain(events)


async def test_concurrent_closes_drain_once_and_release_once(
    backend_factory: BackendFactory,
) -> None:
    """Regression: a second ``close`` while the first was still draining released the lock
    (and the log's descriptor) under the running write, which then failed ("lock already
    released") and lost the buffered batch. A second closer now waits for the first."""
    events = log(4, tools=2)
    async with backend_of(backend_factory) as backend:
        handle = await backend.create(header("closes"))
        handle.append(events[:5])
        await handle.flush()
        handle.append(events[5:])  # buffered: the first close drains it
        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(handle.close)
        assert handle.durable_seq == len(events)
        with pytest.raises(SessionHandleClosedError):
            handle.append(events[:1])
        again = await backend.open("closes", "write")  # ownership was released
        assert again.next_seq == len(events)
        await again.close()
    async with backend_of(backend_factory) as backend:
        load = await (await backend.open("closes", "read")).read()
        assert wire(load.events) == plain(events)


async def test_retired_shapes_never_enter_a_log(backend_factory: BackendFactory) -> None:
    """DSH's retired shapes are refused at append, typed or plain (docs/storage.md), and so is
    v3's retired ``request/header`` ``header.system`` — a v3 reader refuses a log holding it."""
    config = {"provider": "mock", "model": "m"}
    retired = [
        (ev("request/header-delta", 1, {}), "unsupported legacy request/header-delta event"),
        (ev("mode/set", 1, {"mode": "x"}), "unsupported legacy mode/set event"),
        (
            ev("request/header", 1, {"header": {"config": config}, "reason": "fallback"}),
            'unsupported legacy request/header reason "fallback"',
        ),
        (
            ev(
                "request/header",
                1,
                {"header": {"config": config, "system": "x"}, "reason": "change"},
            ),
            r"carries header\.system, which DSH v3 retired",
        ),
    ]
    typed_system = SessionEvent(
        type="request/header",
        seq=1,
        time=1,
        data=RequestHeaderData(
            header=EpochHeader(config=LlmCallConfig(provider="mock", model="m"), system=""),
            reason="change",
        ),
    )
    async with backend_of(backend_factory) as backend:
        handle = await backend.create(header("retired"))
        handle.append([ev("turn/start", 0, {"turn": 1})])
        for event, message in retired:
            with pytest.raises(SessionAppendRejectedError, match=message):
                handle.append([event])
        with pytest.raises(SessionAppendRejectedError, match=r"header\.system"):
            handle.append([typed_system])
        assert handle.next_seq == 1
        await handle.close()

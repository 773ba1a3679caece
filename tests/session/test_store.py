"""SessionStore through a real host: lifecycle events, flush barrier, fork (D6)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from dsh_host import Context, Plugin, Row, open_host
from dsh_host._loader import PluginHost
from dsh_host._session import (
    ForkedReason,
    InvalidSessionHeaderError,
    Session,
    SessionAttachedError,
    SessionEvent,
    SessionExistsError,
    SessionForkError,
    SessionNotLiveError,
    SessionStore,
    TextBlock,
    decode_event,
    encode_event,
    event_to_builtins,
    interrupted_turn_closers,
)

from .builders import assistant, one_turn, user

pytestmark = pytest.mark.anyio


class Recorder:
    """Listens to the four session events on the root context."""

    def __init__(self, ctx: Context) -> None:
        self.log: list[tuple[str, str, int | None]] = []
        ctx.on("session/created", lambda s: self.log.append(("created", s.id, None)))
        ctx.on("session/disposed", lambda s: self.log.append(("disposed", s.id, None)))
        ctx.on("session/event", lambda s, e: self.log.append(("event", s.id, e.seq)))


@pytest.fixture
async def host() -> AsyncIterator[PluginHost]:
    async with open_host([Row(name="sessions")]) as h:
        yield h


async def test_the_plugin_provides_the_store(host: PluginHost) -> None:
    store = host.ctx.sessions
    assert isinstance(store, SessionStore)
    assert host.ctx.host.services()["sessions"] is not None


async def test_create_get_list_and_lifecycle_events(host: PluginHost) -> None:
    ctx = host.ctx
    rec = Recorder(ctx)
    store: SessionStore = ctx.sessions
    first = store.create(meta={"cwd": "/home/dev/project"})
    second = store.create("named")
    minted = first.id
    # a fresh time + random id, unique across processes and runs (not "session-1")
    assert re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{6}", minted), minted
    assert first.header.cwd == "/home/dev/project"
    assert store.get("named") is second
    assert store.get("missing") is None
    assert store.list() == [first, second]
    second.append("turn/start", {"turn": 1})
    store.detach(second)
    store.detach(second)  # idempotent: disposed once
    second.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})  # detached: silent
    assert rec.log == [
        ("created", minted, None),
        ("created", "named", None),
        ("event", "named", 0),
        ("disposed", "named", None),
    ]
    assert store.create().id not in (minted, "named")


async def test_duplicates_and_bad_meta_are_refused(host: PluginHost) -> None:
    store: SessionStore = host.ctx.sessions
    store.create("dup")
    with pytest.raises(SessionExistsError, match='session "dup" already exists'):
        store.create("dup")
    stale = Session.create("dup")
    with pytest.raises(SessionExistsError):
        store.attach(stale)  # a stale object cannot overwrite the live one
    with pytest.raises(InvalidSessionHeaderError, match="unknown key"):
        store.create("m", meta={"color": "red"})
    with pytest.raises(InvalidSessionHeaderError, match="absolute path"):
        store.create("m", meta={"cwd": "rel"})
    with pytest.raises(InvalidSessionHeaderError, match="unknown key"):
        store.create("m", meta={"seedLength": 3})
    assert store.get("m") is None


async def test_one_object_cannot_be_attached_to_two_stores(host: PluginHost) -> None:
    other = SessionStore()
    session = host.ctx.sessions.create("x")
    with pytest.raises(SessionAttachedError, match="already attached"):
        other.attach(session)


async def test_restored_session_attaches_without_replaying_events(host: PluginHost) -> None:
    rec = Recorder(host.ctx)
    source = Session.create("src")
    one_turn(source)
    decoded = [decode_event(encode_event(e)) for e in source.events]
    restored = Session.restore({"version": 3, "id": "resumed", "createdAt": 1}, decoded)
    host.ctx.sessions.attach(restored)
    restored.append("turn/start", {"turn": 2})
    assert rec.log == [("created", "resumed", None), ("event", "resumed", len(decoded) + 1)]


async def test_flush_waits_for_every_listener_and_raises_the_first_failure() -> None:
    order: list[str] = []

    class Persist(Plugin):
        name = "persist"
        inject = ("sessions",)

        def apply(self, ctx: Context, config: Any) -> None:
            async def slow_fail(session: Session) -> None:
                await anyio.sleep(0.05)
                order.append("first done")
                raise OSError("disk unavailable")

            async def second(session: Session) -> None:
                order.append("second start")
                await anyio.sleep(0.1)
                order.append("second done")

            async def third(session: Session) -> None:
                raise ValueError("also failed")

            ctx.on("session/flush", slow_fail)
            ctx.on("session/flush", second)
            ctx.on("session/flush", third)

    async with open_host([Row(name="sessions")]) as h:
        store: SessionStore = h.ctx.sessions
        session = store.create("f")
        assert await store.flush(session) is False  # nobody persists: False, not an error
        # Register the listeners on the root context (a row would need an entry point).
        plugin = Persist()
        plugin.apply(h.ctx, None)
        with pytest.raises(OSError, match="disk unavailable") as info:
            await store.flush(session)
        assert isinstance(info.value, OSError)  # the exact value, not a group
        assert order == ["second start", "first done", "second done"]


async def test_flush_returns_true_with_a_listener_and_refuses_non_live_sessions(
    host: PluginHost,
) -> None:
    store: SessionStore = host.ctx.sessions
    flushed: list[str] = []

    async def persist(session: Session) -> None:
        flushed.append(session.id)

    host.ctx.on("session/flush", persist)
    session = store.create("live")
    assert await store.flush(session) is True
    assert flushed == ["live"]
    with pytest.raises(SessionNotLiveError, match='session "loose" is not live in this store'):
        await store.flush(Session.create("loose"))
    store.detach(session)
    with pytest.raises(SessionNotLiveError):
        await store.flush(session)
    impostor = Session.create("live2")
    store.create("live2")
    with pytest.raises(SessionNotLiveError):
        await store.flush(impostor)


async def test_disposing_the_plugin_detaches_every_session() -> None:
    disposed: list[str] = []
    async with open_host([Row(name="sessions")]) as h:
        h.ctx.on("session/disposed", lambda s: disposed.append(s.id))
        h.ctx.sessions.create("a")
        h.ctx.sessions.create("b")
    assert disposed == ["b", "a"]


class TestFork:
    def _source(self, store: SessionStore) -> Session:
        session = store.create("src", meta={"cwd": "/w"})
        one_turn(session, 1)  # 0..5
        session.append("approval/policy", {"policy": "ask"})  # 6: trailing log-only event
        return session

    async def test_default_boundary_includes_trailing_log_only_events(
        self, host: PluginHost
    ) -> None:
        store: SessionStore = host.ctx.sessions
        source = self._source(store)
        child = store.fork(source)
        assert child.id not in ("src", "")
        assert [e.type for e in child.events][-2:] == ["approval/policy", "session/end-seed"]
        marker = child.events[-1]
        assert event_to_builtins(marker)["data"] == {"inherited": True}
        assert child.first_live_seq == 7
        assert child.header.parent_session == "src"
        assert child.header.is_seeded is True
        assert child.header.cwd == "/w"
        assert list(child.events)[:7] == list(source.events)
        assert source.seq == 7  # the source is unchanged
        assert list(child.derive_messages()) == list(source.derive_messages())
        child.append("turn/start", {"turn": 2})
        assert source.seq == 7  # detached copy: the child's log is its own

    async def test_fork_inside_an_open_turn_closes_it_with_forked(self, host: PluginHost) -> None:
        store: SessionStore = host.ctx.sessions
        source = self._source(store)
        source.append("turn/start", {"turn": 2})  # 7
        source.append("user/message", user("u2"), surface_op="append")  # 8
        source.append("compaction/start", {"compactionId": "c", "turn": 2})  # 9: plugin bracket
        child = store.fork(source, child_id="kid")
        types = [e.type for e in child.events][-3:]
        assert types == ["compaction/start", "turn/end", "session/end-seed"]
        closer = child.events[10]
        assert closer.data.turn == 2 and closer.data.reason == ForkedReason()
        assert closer.time == source.events[9].time
        assert interrupted_turn_closers(list(child.events)) == []
        assert source.events[-1].type == "compaction/start"

    async def test_an_earlier_boundary_works_while_the_source_has_an_open_step(
        self, host: PluginHost
    ) -> None:
        store: SessionStore = host.ctx.sessions
        source = self._source(store)
        source.append("turn/start", {"turn": 2})
        source.append("step/start", {"turn": 2, "step": 1})
        child = store.fork(source, 5)
        assert [e.type for e in child.events] == [
            *[e.type for e in list(source.events)[:6]],
            "session/end-seed",
        ]
        with pytest.raises(SessionForkError, match="ends inside open step 1 of turn 2") as info:
            store.fork(source)
        assert info.value.code == "OPEN_STEP"

    @pytest.mark.parametrize(
        "reason",
        [
            {"kind": "completed"},
            {"kind": "aborted", "reason": {"kind": "hook", "reason": "x"}},
            {"kind": "blocked"},
            {"kind": "error", "error": {"message": "m", "code": "UNKNOWN"}},
            {"kind": "max-tokens"},
            {"kind": "interrupted"},
            {"kind": "forked"},
            {"kind": "plugin-kind", "detail": 1},
        ],
    )
    async def test_every_reason_is_a_valid_boundary(
        self, host: PluginHost, reason: dict[str, Any]
    ) -> None:
        store: SessionStore = host.ctx.sessions
        source = store.create("r")
        source.append("turn/start", {"turn": 1})
        source.append("turn/end", {"turn": 1, "reason": reason})
        child = store.fork(source)
        assert event_to_builtins(child.events[1])["data"]["reason"] == reason

    async def test_fork_errors_and_their_codes(self, host: PluginHost) -> None:
        store: SessionStore = host.ctx.sessions
        source = self._source(store)
        store.create("taken")
        cases: list[tuple[dict[str, Any], str, str]] = [
            (
                {"source": source, "child_id": "taken", "boundary": 99},
                'session "taken" already exists',
                "SESSION_ALREADY_EXISTS",
            ),
            ({"source": "nope"}, 'session "nope" not found', "SESSION_NOT_FOUND"),
            ({"source": Session.create("loose")}, 'session "loose" not found', "SESSION_NOT_FOUND"),
            (
                {"source": Session.create("src")},
                'session "src" is not the live store instance',
                "SESSION_NOT_LIVE",
            ),
            (
                {"source": source, "boundary": -1},
                "must be a non-negative safe integer, got -1",
                "INVALID_BOUNDARY",
            ),
            ({"source": source, "boundary": 1.5}, "got 1.5", "INVALID_BOUNDARY"),
            ({"source": source, "boundary": True}, "got True", "INVALID_BOUNDARY"),
            (
                {"source": source, "boundary": 7},
                'fork boundary 7 does not exist in session "src" (last seq: 6)',
                "INVALID_BOUNDARY",
            ),
        ]
        for kwargs, message, code in cases:
            with pytest.raises(SessionForkError) as info:
                store.fork(**kwargs)
            assert message in str(info.value)
            assert info.value.code == code

    async def test_an_empty_source_forks_an_empty_child(self, host: PluginHost) -> None:
        store: SessionStore = host.ctx.sessions
        source = store.create("empty")
        child = store.fork(source)
        assert [e.type for e in child.events] == ["session/end-seed"]
        with pytest.raises(SessionForkError, match=r"last seq: none"):
            store.fork(source, 0)

    async def test_fork_of_a_fork_gets_its_own_tagged_marker(self, host: PluginHost) -> None:
        store: SessionStore = host.ctx.sessions
        child = store.fork(self._source(store))
        grandchild = store.fork(child)
        markers = [e.seq for e in grandchild.events if e.type == "session/end-seed"]
        assert markers == [7, 8]  # the inherited prefix ends in the ancestor's marker
        assert grandchild.header.parent_session == child.id

    async def test_fork_notifies_created_but_replays_no_events(self, host: PluginHost) -> None:
        rec = Recorder(host.ctx)
        store: SessionStore = host.ctx.sessions
        source = store.create("s")
        source.append("user/message", user("u"), surface_op="append")
        source.append(
            "assistant/message", assistant(1, 1, "a", TextBlock(text="x")), surface_op="append"
        )
        rec.log.clear()
        child = store.fork(source, child_id="c")
        assert rec.log == [("created", "c", None)]
        event: SessionEvent = child.append("user/message", user("u2"), surface_op="append")
        assert rec.log[-1] == ("event", "c", event.seq)

"""``SessionStore`` (``ctx.sessions``): the live sessions of a host, and the flush barrier.

The store persists nothing itself. It publishes sessions on the host's event
bus and persistence backends listen:

- ``session/created (session)`` — once, when a session becomes live;
- ``session/event (session, event)`` — after every commit (wired as the
  session's observer while it is live);
- ``session/flush (session)`` — the durability barrier, dispatched by
  :meth:`SessionStore.flush` only;
- ``session/disposed (session)`` — once, when a live session leaves the store.

The store talks to the bus through three callables (emit, parallel dispatch,
listener count) so it can be built without a host in tests; the ``sessions``
plugin wires them to the plugin's context.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final

from msgspec import UNSET

from dsh_host._jsonsafe import is_safe_int
from dsh_host._session.errors import (
    InvalidSessionHeaderError,
    SessionAttachedError,
    SessionExistsError,
    SessionForkError,
    SessionNotLiveError,
)
from dsh_host._session.events import (
    ForkedReason,
    SessionEvent,
    StepEnd,
    StepStart,
    TurnEnd,
    TurnStart,
)
from dsh_host._session.header import (
    SESSION_FORMAT_VERSION,
    SessionHeader,
    check_session_id,
    header_from_meta,
    new_session_id,
    now_ms,
)
from dsh_host._session.session import Session

__all__ = ["META_KEYS", "SessionStore"]

#: Keys ``create(meta=...)`` accepts (the header fields a caller may choose).
META_KEYS: Final = (
    "cwd",
    "parentSession",
    "createdAt",
    "isSeeded",
    "origin",
    "delegationDepth",
    "agentPreset",
)


def _noop_emit(name: str, *args: Any) -> None:
    return None


async def _noop_parallel(name: str, *args: Any) -> None:
    return None


class SessionStore:
    """The registry of live sessions (``ctx.sessions``)."""

    def __init__(
        self,
        *,
        emit: Callable[..., None] = _noop_emit,
        parallel: Callable[..., Awaitable[None]] = _noop_parallel,
        listener_count: Callable[[str], int] = lambda name: 0,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        self._emit = emit
        self._parallel = parallel
        self._listener_count = listener_count
        self._clock = clock
        self._live: dict[str, Session] = {}  # insertion order = creation order
        self._detachers: dict[str, Callable[[], None]] = {}
        self._closed = False

    # -- lifecycle ------------------------------------------------------------------------

    def create(
        self,
        session_id: str | None = None,
        *,
        seed: Sequence[SessionEvent | Mapping[str, Any]] | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> Session:
        """Create, publish and announce a new session.

        ``session_id`` defaults to a fresh time + random id (:func:`new_session_id`). ``meta``
        may carry ``cwd`` (absolute), ``parentSession``, ``createdAt``,
        ``isSeeded``, ``origin``, ``delegationDepth``, ``agentPreset``; unknown
        keys are refused. Raises :class:`SessionExistsError` for a live id.
        """
        sid = self._mint_id() if session_id is None else check_session_id(session_id)
        self._check_free(sid)
        header = self._header_from_meta(sid, meta)
        session = Session.create(sid, seed=seed, header=header, clock=self._clock)
        return self.attach(session)

    def attach(self, session: Session, *, appended: Sequence[SessionEvent] = ()) -> Session:
        """Publish an existing detached session (e.g. one rebuilt with ``Session.restore``).

        Emits ``session/created``; from now on every append is dispatched as
        ``session/event``. ``appended`` are events of ``session`` written to its log since it
        was read but before it was attached (a resume's repair closers): they are dispatched as
        ``session/event`` too, in order, so every append reaches the listeners, a repair's
        included. Raises :class:`SessionExistsError` when the id is live
        and :class:`SessionAttachedError` when the object is attached already.
        """
        self._check_open()
        if session._store is not None:
            raise SessionAttachedError(f'session "{session.id}" is already attached to a store')
        self._check_free(session.id)
        session._store = self
        self._live[session.id] = session
        emit = self._emit

        def observe(s: Session, event: SessionEvent) -> None:
            emit("session/event", s, event)

        self._detachers[session.id] = session.add_observer(observe)
        self._emit("session/created", session)
        for event in appended:
            emit("session/event", session, event)
        return session

    def announce(self, session: Session, appended: Sequence[SessionEvent]) -> None:
        """Dispatch ``session/event`` for ``appended``, events written to ``session``'s log
        outside this store (the repair of a session nobody continues here: a sub-agent's child),
        then ``session/disposed``, so every append reaches the listeners, a repair's included.
        ``session`` is not made live: nothing binds it to a write handle, and the id stays free.
        """
        self._check_open()
        if session._store is not None or session.id in self._live:
            raise SessionAttachedError(
                f'session "{session.id}" is live; its appends reach the listeners already'
            )
        for event in appended:
            self._emit("session/event", session, event)
        self._emit("session/disposed", session)

    def detach(self, session: Session) -> None:
        """Remove a live session from the store and emit ``session/disposed`` (idempotent)."""
        if self._live.get(session.id) is not session:
            return
        del self._live[session.id]
        self._detachers.pop(session.id)()
        session._store = None
        self._emit("session/disposed", session)

    def close(self) -> None:
        """Detach every live session (newest first); the store accepts no new sessions."""
        for session in reversed(list(self._live.values())):
            self.detach(session)
        self._closed = True

    def get(self, session_id: str) -> Session | None:
        """The live session with this id, or None."""
        return self._live.get(session_id)

    def list(self) -> list[Session]:
        """Live sessions in creation order (a fresh list)."""
        return list(self._live.values())

    def is_live(self, session: Session) -> bool:
        """True when this exact object is live in this store."""
        return self._live.get(session.id) is session

    # -- durability -----------------------------------------------------------------------

    async def flush(self, session: Session) -> bool:
        """The durability barrier: run every ``session/flush`` listener and wait for all.

        Listeners run in parallel; all are awaited even if one fails early, then
        the first-registered failure is raised as is. Returns True when at least
        one listener participated (False: nothing persists this session). Raises
        :class:`SessionNotLiveError` for a session that is not live here.
        """
        if not self.is_live(session):
            raise SessionNotLiveError(
                f'session "{session.id}" is not live in this store; flush only sessions '
                "returned by create()/attach()/fork() and not yet detached"
            )
        participants = self._listener_count("session/flush")
        await self._parallel("session/flush", session)
        return participants > 0

    # -- fork -----------------------------------------------------------------------------

    def fork(
        self,
        source: Session | str,
        boundary: int | None = None,
        child_id: str | None = None,
    ) -> Session:
        """A new live session whose seed is ``source``'s events ``0..boundary`` (inclusive).

        ``boundary`` defaults to the last seq. No step may be open at the
        boundary (``OPEN_STEP``); a turn open there is closed in the child's seed
        with ``turn/end {kind: "forked"}`` (D6). The child gets
        ``session/end-seed {inherited: true}`` at the cut and a header with
        ``parentSession`` = source id, ``isSeeded: true``, and the source's ``cwd``.
        The source is unchanged.
        """
        if child_id is not None:
            check_session_id(child_id)
            if child_id in self._live:
                raise SessionForkError(
                    f'session "{child_id}" already exists', "SESSION_ALREADY_EXISTS"
                )
        src = self._resolve_fork_source(source)
        events = src.events
        if boundary is None:
            cut = len(events) - 1  # -1: an empty source forks an empty child
        else:
            if not is_safe_int(boundary) or boundary < 0:
                raise SessionForkError(
                    f'fork boundary for session "{src.id}" must be a non-negative safe '
                    f"integer, got {boundary!r}",
                    "INVALID_BOUNDARY",
                )
            if boundary >= len(events):
                last = str(len(events) - 1) if events else "none"
                raise SessionForkError(
                    f'fork boundary {boundary} does not exist in session "{src.id}" '
                    f"(last seq: {last})",
                    "INVALID_BOUNDARY",
                )
            if events[boundary].seq != boundary:  # pragma: no cover - logs are contiguous
                raise SessionForkError(
                    f"fork boundary {boundary} does not match a contiguous event seq in "
                    f'session "{src.id}"',
                    "INVALID_BOUNDARY",
                )
            cut = boundary
        seed: list[SessionEvent] = list(events[: cut + 1])
        open_turn, open_step = _open_brackets(seed)
        if open_step is not None:
            raise SessionForkError(
                f'fork boundary {cut} in session "{src.id}" ends inside open step {open_step} '
                f"of turn {open_turn}; fork at a step boundary",
                "OPEN_STEP",
            )
        if open_turn is not None:
            last_event = seed[-1]
            seed.append(
                SessionEvent(
                    type="turn/end",
                    seq=len(seed),
                    time=last_event.time,
                    data=TurnEnd(turn=open_turn, reason=ForkedReason()),
                )
            )
        sid = self._mint_id() if child_id is None else child_id
        meta: dict[str, Any] = {"parentSession": src.id, "isSeeded": True}
        if src.header.cwd is not UNSET:
            meta["cwd"] = src.header.cwd
        header = self._header_from_meta(sid, meta)
        child = Session.restore(header, seed, mark_seed_end=False, clock=self._clock)
        child._mark_seed_end(inherited=True)
        return self.attach(child)

    def _resolve_fork_source(self, source: Session | str) -> Session:
        sid = source if isinstance(source, str) else source.id
        live = self._live.get(sid)
        if live is None:
            raise SessionForkError(f'session "{sid}" not found', "SESSION_NOT_FOUND")
        if isinstance(source, Session) and live is not source:
            raise SessionForkError(
                f'session "{sid}" is not the live store instance', "SESSION_NOT_LIVE"
            )
        return live

    # -- helpers --------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise SessionNotLiveError("the session store is closed (its plugin was disposed)")

    def _check_free(self, session_id: str) -> None:
        if session_id in self._live:
            raise SessionExistsError(f'session "{session_id}" already exists')

    def _mint_id(self) -> str:
        while True:
            candidate = new_session_id()
            if candidate not in self._live:
                return candidate

    def _header_from_meta(self, session_id: str, meta: Mapping[str, Any] | None) -> SessionHeader:
        meta = dict(meta or {})
        unknown = [k for k in meta if k not in META_KEYS]
        if unknown:
            raise InvalidSessionHeaderError(
                f"session meta has unknown key(s) {', '.join(repr(k) for k in unknown)}; "
                f"allowed keys are {', '.join(META_KEYS)}",
                field=unknown[0],
            )
        raw: dict[str, Any] = {
            "version": SESSION_FORMAT_VERSION,
            "id": session_id,
            "createdAt": meta.pop("createdAt", None),
        }
        if raw["createdAt"] is None:
            raw["createdAt"] = int(self._clock())
        raw.update(meta)
        return header_from_meta(raw)  # the one check of a header being created


def _open_brackets(events: Sequence[SessionEvent]) -> tuple[int | None, int | None]:
    """The (turn, step) open at the end of ``events``."""
    open_turn: int | None = None
    open_step: int | None = None
    for event in events:
        data = event.data
        if event.type == "turn/start" and isinstance(data, TurnStart):
            open_turn, open_step = data.turn, None
        elif event.type == "turn/end" and isinstance(data, TurnEnd):
            open_turn = open_step = None
        elif event.type == "step/start" and isinstance(data, StepStart):
            open_step = data.step
        elif event.type == "step/end" and isinstance(data, StepEnd):
            open_step = None
    return open_turn, open_step

"""``Session``: the append-only, in-memory log that is the single source of truth.

The model's message history is *derived* from this log (:meth:`Session.derive_messages`),
never stored beside it; replay is re-derivation from the same events.

``append`` commits synchronously to memory and then notifies observers. It is
**not durable**: persistence listens and writes behind; only a resolved
``SessionStore.flush`` is a durability barrier (D7).

A Session does not know the plugin host. It has a plain observer list; the
store (``dsh_host._session.store``) wires one observer to ``ctx.emit("session/event", ...)``
when the session is attached, so a Session is fully usable and testable alone.

Invariants, each enforced at the append site:

- ``events[i].seq == i`` — contiguous from 0, no gaps;
- every event is deeply immutable lossless JSON (typed frozen Structs or frozen JSON);
- exactly the surface-eligible types carry ``surfaceOp``; the surface fold of the
  log is always valid (every replace range exists, every shadowed node is cited);
- an observer never sees an event that is not already in ``events``.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar, cast, overload

import msgspec
from msgspec import UNSET

from dsh_host._session.errors import (
    InvalidSeedError,
    InvalidSessionEventError,
    SessionAppendReentryError,
)
from dsh_host._session.events import (
    AssistantMessageData,
    DeveloperMessageData,
    EndSeedData,
    ReplaceOp,
    RequestContextData,
    RequestHeaderData,
    SessionEvent,
    SurfaceOp,
    SystemMessageData,
    ToolResultData,
    coerce_event_data,
    decode_event,
    event_to_builtins,
    event_type_spec,
    parse_surface_marker,
)
from dsh_host._session.header import (
    SESSION_FORMAT_VERSION,
    SessionHeader,
    check_session_id,
    now_ms,
    parse_session_header,
)
from dsh_host._session.messages import (
    AssistantMessage,
    ContentBlock,
    DeveloperMessage,
    EpochHeader,
    Message,
    PluginSource,
    SystemMessage,
    TextBlock,
    UserMessage,
    source_kind,
)
from dsh_host._session.packed import PackedLog
from dsh_host._session.request_header import canonical_header
from dsh_host._session.surface import SurfaceState

__all__ = [
    "EventsView",
    "LogView",
    "MessagesView",
    "Observer",
    "Session",
    "SurfaceView",
    "derive_event_message",
    "derive_messages_from_events",
]

log = logging.getLogger("dsh.session")

_T = TypeVar("_T")

#: A ``session/event`` observer: called after commit with ``(session, event)``.
Observer = Callable[["Session", SessionEvent], object]


def derive_event_message(event: SessionEvent) -> Message | None:
    """The message one event projects to, or None (the single per-event projection rule).

    ``user/message`` → its data; ``assistant/message`` → its message unless the
    content is empty (a max-tokens step that only hosts usage); ``tool/result``
    → its message; ``system/message`` → its message unless empty; ``developer/message``
    (DSH format v4) → a system message (:func:`developer_as_system`) unless it renders
    empty; anything else → None. Content is verbatim: no framing is added here.
    """
    data = event.data
    kind = event.type
    if kind == "user/message":
        return data if isinstance(data, UserMessage) else None
    if kind == "assistant/message":
        if isinstance(data, AssistantMessageData) and data.message.content:
            return data.message
        return None
    if kind == "tool/result":
        return data.message if isinstance(data, ToolResultData) else None
    if kind == "system/message":
        if isinstance(data, SystemMessageData) and data.message.content:
            return data.message
        return None
    if kind == "developer/message":
        if isinstance(data, DeveloperMessageData):
            return developer_as_system(data.message)
        return None
    # A plugin-registered surface type projects its data (if a message) or data.message.
    spec = event_type_spec(kind)
    if spec is not None and spec.surface:
        if isinstance(data, UserMessage | AssistantMessage):
            return data
        message = getattr(data, "message", None)
        if message is not None and getattr(message, "content", None):
            return message  # type: ignore[no-any-return]
    return None


def _developer_block(block: ContentBlock) -> ContentBlock | None:
    if isinstance(block, TextBlock):
        return block
    if isinstance(block, Mapping):
        name = block.get("toolName")
        if block.get("type") == "tool-addition" and isinstance(name, str):
            return TextBlock(text=f"[tool enabled: {name}]")
        if block.get("type") == "tool-removal" and isinstance(name, str):
            return TextBlock(text=f"[tool disabled: {name}]")
    return None


def developer_as_system(message: DeveloperMessage) -> SystemMessage | None:
    """What the model sees of a DSH v4 developer message: a system message with its text
    blocks and one line per tool change (``[tool enabled: NAME]`` / ``[tool disabled:
    NAME]``, DSH's text rendering of those blocks), other blocks left out; None when
    nothing remains (DSH: an empty developer node keeps its surface place and projects no
    message). Same id; the source is kept when this build models its kind, else it is a
    plugin source named by that kind."""
    blocks = tuple(b for b in map(_developer_block, message.content) if b is not None)
    if not blocks:
        return None
    source = message.source
    if isinstance(source, Mapping):
        source = PluginSource(plugin=source_kind(source))
    return SystemMessage(id=message.id, content=blocks, source=source)


def derive_messages_from_events(events: Sequence[SessionEvent]) -> list[Message]:
    """Full (non-incremental) surface derivation of a log: fold, then project each node."""
    from dsh_host._session.surface import fold_surface

    fold = fold_surface(events)
    out: list[Message] = []
    for seq in fold.nodes:
        message = derive_event_message(events[seq])
        if message is not None:
            out.append(message)
    return out


class LogView(Sequence[_T]):
    """An immutable snapshot of an append-only list: its first ``len`` entries, forever.

    The backing list only ever grows (a rebuild allocates a new one), so a view
    of its first *n* entries never changes: taking a snapshot is O(1) however
    long the list is, and a snapshot taken earlier never grows. Compares equal
    to any sequence with the same items; ``list(view)`` gives a mutable copy.
    """

    __slots__ = ("_items", "_length")
    __hash__ = None  # type: ignore[assignment]  # compares by value, like a list

    def __init__(self, items: Sequence[_T], length: int) -> None:
        self._items = items
        self._length = length

    def __len__(self) -> int:
        return self._length

    @property
    def lineage(self) -> object:
        """An identity token: two views share it exactly when both are prefixes of the same
        append-only list. Lets a consumer extend a cache incrementally (a rebuild, such as a
        surface replacement, starts a new lineage)."""
        return self._items

    @overload
    def __getitem__(self, index: int) -> _T: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[_T, ...]: ...

    def __getitem__(self, index: int | slice) -> _T | tuple[_T, ...]:
        if isinstance(index, slice):
            items = self._items
            return tuple(items[i] for i in range(*index.indices(self._length)))
        if index < 0:
            index += self._length
        if not 0 <= index < self._length:
            raise IndexError("view index out of range")
        return self._items[index]

    def __iter__(self) -> Iterator[_T]:
        return itertools.islice(self._items, self._length)

    def iter_from(self, start: int) -> Iterator[_T]:
        """The items from ``start`` on, one by one: what ``view[start:]`` holds without building
        the tuple (a session's older events are decoded a page at a time, D37)."""
        items = self._items
        start = max(start, 0)
        if isinstance(items, PackedLog):
            return cast("Iterator[_T]", items.walk(start, self._length))
        return itertools.islice(items, start, self._length)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, str | bytes):
            return len(other) == self._length and all(
                a == b for a, b in zip(self, other, strict=True)
            )
        return NotImplemented

    def __repr__(self) -> str:
        return f"<{type(self).__name__} of {self._length} items>"


#: Snapshot of a session's events (``Session.events``).
EventsView = LogView[SessionEvent]
#: Snapshot of the derived messages (``Session.derive_messages()``).
MessagesView = LogView[Message]


class SurfaceView:
    """Read-only view of the live surface (the same object on every access)."""

    __slots__ = ("_state",)

    def __init__(self, state: SurfaceState) -> None:
        self._state = state

    @property
    def nodes(self) -> tuple[int, ...]:
        """Current surface seqs in model order."""
        return tuple(self._state.nodes)

    @property
    def replace_generation(self) -> int:
        """Monotonic count of committed replacements."""
        return self._state.replace_generation


SurfaceIntent = SurfaceOp | Mapping[str, Any]


class Session:
    """An append-only event log plus its projections. Build one with :meth:`create` or
    :meth:`restore`; attach it to a ``SessionStore`` to publish it."""

    def __init__(
        self,
        header: SessionHeader,
        *,
        clock: Callable[[], int] = now_ms,
        _token: object = None,
    ) -> None:
        if _token is not _CONSTRUCT:
            raise TypeError("use Session.create(...) or Session.restore(...)")
        self._header = header
        self._clock = clock
        #: Older pages held encoded, re-decoded on access (docs/decisions.md D37).
        self._log = PackedLog()
        self._view: EventsView | None = None
        self._surface = SurfaceState()
        self._surface_view = SurfaceView(self._surface)
        self._observers: list[Observer] = []
        self._publishing = False
        self._first_live_seq = 0
        # Incremental projections.
        self._derived: list[Message] = []
        self._derived_nodes = 0  # how many surface nodes have been projected
        self._derived_generation = 0
        self._append_origin: list[int] = []
        self._request_header: EpochHeader | None = None
        self._request_context: RequestContextData | None = None
        #: Set by the store while this session is live in it (see ``SessionStore``).
        self._store: object | None = None

    # -- construction ---------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        session_id: str,
        *,
        seed: Sequence[SessionEvent | Mapping[str, Any]] | None = None,
        header: SessionHeader | Mapping[str, Any] | None = None,
        clock: Callable[[], int] = now_ms,
    ) -> Session:
        """A new detached session. ``seed`` (borrowed, validated and copied) replays history.

        With a seed — even an empty one — the log gets a ``session/end-seed {}``
        marker after it, unless the seed already ends in one. Without ``header``,
        ``{version, id, createdAt: now}`` is used.
        """
        check_session_id(session_id)
        hdr = cls._make_header(session_id, header, clock)
        session = cls(hdr, clock=clock, _token=_CONSTRUCT)
        if seed is not None:
            admitted = [_admit_borrowed(event, index) for index, event in enumerate(seed)]
            session._load_seed(admitted)
            session._mark_seed_end(inherited=False)
        return session

    @classmethod
    def restore(
        cls,
        header: SessionHeader | Mapping[str, Any],
        events: Iterable[SessionEvent],
        *,
        mark_seed_end: bool = True,
        clock: Callable[[], int] = now_ms,
    ) -> Session:
        """Rebuild a session from stored ``header`` + ``events`` (ownership transfer; no copy).

        A :class:`PackedLog` (what a store's load holds, docs/decisions.md D37) becomes the
        session's log itself; any other iterable is walked once, its older pages packed as
        they arrive, so no list of the whole decoded log is built here.

        ``events`` must be :class:`SessionEvent` values as produced by
        :func:`~dsh_host._session.events.decode_event` (or by another Session);
        they are checked for contiguity, vocabulary and surface validity but not
        copied. Nothing is notified. With ``mark_seed_end`` (the resume path) a
        ``session/end-seed`` marker follows the restored events unless they
        already end in one; pass False for a read-only rebuild.
        """
        hdr = header if isinstance(header, SessionHeader) else parse_session_header(header)
        session = cls(hdr, clock=clock, _token=_CONSTRUCT)
        if isinstance(events, PackedLog):
            session._load_seed(_checked_stored(events), adopt=events)
        else:
            session._load_seed(_checked_stored(events))
        if mark_seed_end:
            session._mark_seed_end(inherited=False)
        return session

    @staticmethod
    def _make_header(
        session_id: str, header: SessionHeader | Mapping[str, Any] | None, clock: Callable[[], int]
    ) -> SessionHeader:
        if header is None:
            return SessionHeader(version=SESSION_FORMAT_VERSION, id=session_id, created_at=clock())
        return parse_session_header(header, session_id=session_id)

    def _load_seed(
        self, events: Iterable[SessionEvent], *, adopt: PackedLog | None = None
    ) -> None:
        """Validate the seed's contiguity and surface, then adopt it (no notification).
        ``adopt``: the :class:`PackedLog` ``events`` walks, which becomes the log as it is
        (its packed pages are not encoded again)."""
        if adopt is not None:
            self._log = adopt
        log_ = self._log
        for index, event in enumerate(events):
            if event.seq != index:
                raise InvalidSeedError(
                    f"seed event at index {index} has seq {event.seq} (expected {index}); "
                    "seed must be contiguous from 0",
                    index=index,
                )
            try:
                parse_surface_marker(
                    event.type,
                    event.surface_op,
                    event.source_event_seqs,
                    where=f"seed {event.type} at index {index}",
                )
                plan = self._surface.plan(event, self._lookup)
            except InvalidSessionEventError as exc:
                raise InvalidSeedError(
                    f"invalid seed event at index {index}: {exc}", index=index
                ) from exc
            if adopt is None:
                log_.append(event)
            self._surface.apply(plan, event.seq)
            self._track(event)
        self._view = None
        self._first_live_seq = len(log_)

    def _mark_seed_end(self, *, inherited: bool) -> None:
        if not inherited and self._log and self._log[-1].type == "session/end-seed":
            return
        data = EndSeedData(inherited=True) if inherited else EndSeedData()
        self._commit(
            SessionEvent(type="session/end-seed", seq=len(self._log), time=self._now(), data=data)
        )

    # -- properties -----------------------------------------------------------------------

    @property
    def id(self) -> str:
        """The session id (from the header)."""
        return self._header.id

    @property
    def header(self) -> SessionHeader:
        """The validated, immutable header."""
        return self._header

    @property
    def seq(self) -> int:
        """The next seq (== number of events)."""
        return len(self._log)

    @property
    def first_live_seq(self) -> int:
        """The first seq appended by this process (== seed length); in memory only."""
        return self._first_live_seq

    @property
    def events(self) -> EventsView:
        """Immutable snapshot of the log; the same object until the next append."""
        view = self._view
        if view is None:
            view = self._view = LogView(self._log, len(self._log))
        return view

    @property
    def surface(self) -> SurfaceView:
        """The live surface (node seqs and replace generation)."""
        return self._surface_view

    @property
    def last_event(self) -> SessionEvent | None:
        """The newest event, or None for an empty log."""
        return self._log[-1] if self._log else None

    # -- observers ------------------------------------------------------------------------

    def add_observer(self, observer: Observer) -> Callable[[], None]:
        """Call ``observer(session, event)`` after each commit; returns a disposer.

        Observers run synchronously in registration order; an observer's
        exception is logged and contained, and an observer must not append to
        this session (that raises :class:`SessionAppendReentryError`).
        """
        self._observers.append(observer)

        def remove() -> None:
            try:
                self._observers.remove(observer)
            except ValueError:
                pass

        return remove

    # -- append ---------------------------------------------------------------------------

    def append(
        self,
        type: str,
        data: Any,
        *,
        surface_op: SurfaceIntent | None = None,
        source_event_seqs: Sequence[int] | None = None,
        ignorable: bool = False,
    ) -> SessionEvent:
        """Append one event and return it (frozen; its ``data`` is the validated snapshot).

        ``data`` is the type's registered Struct or equivalent plain JSON; it is
        copied, so later changes to the caller's object are ignored. Surface
        types need ``surface_op`` (``"append"`` or ``ReplaceOp(start=, end=)``);
        ``source_event_seqs`` cites earlier events. Raises (log unchanged):
        :class:`InvalidSessionEventError` (naming the type) for bad data or
        markers, :class:`UnknownEventTypeError` for an unregistered type not
        marked ``ignorable``, :class:`SurfaceTransitionError` for a replace that
        does not fit the surface, :class:`SessionAppendReentryError` from an observer.

        Appended is not durable: call ``SessionStore.flush`` when it must survive a crash.
        """
        if not isinstance(type, str) or not type:
            raise InvalidSessionEventError(
                f"session event type must be a non-empty string, got {type!r}"
            )
        stored = coerce_event_data(type, data, ignorable=ignorable)
        op, sources = parse_surface_marker(
            type,
            UNSET if surface_op is None else _plain_intent(surface_op),
            UNSET if source_event_seqs is None else list(source_event_seqs),
        )
        if self._publishing:
            raise SessionAppendReentryError()
        event = SessionEvent(
            type=type,
            seq=len(self._log),
            time=self._now(),
            data=stored,
            source_event_seqs=sources,
            surface_op=op,
            ignorable=True if ignorable else UNSET,
        )
        return self._commit(event)

    def _commit(self, event: SessionEvent) -> SessionEvent:
        plan = self._surface.plan(event, self._lookup)  # raises with the log unchanged
        self._log.append(event)  # the commit point
        self._view = None
        self._surface.apply(plan, event.seq)
        self._track(event)
        if self._observers:
            self._publish(event)
        return event

    def _publish(self, event: SessionEvent) -> None:
        self._publishing = True
        try:
            for observer in tuple(self._observers):
                try:
                    observer(self, event)
                except Exception as exc:  # contained: an observer never fails the append
                    log.warning(
                        'session "%s": session/event listener threw: %s',
                        self.id,
                        exc,
                        exc_info=exc,
                    )
        finally:
            self._publishing = False

    def _now(self) -> int:
        return int(self._clock())

    def _lookup(self, seq: int) -> SessionEvent | None:
        return self._log[seq] if 0 <= seq < len(self._log) else None

    def _track(self, event: SessionEvent) -> None:
        """Keep the cheap incremental folds current (append-origin, request header/context)."""
        kind = event.type
        if event.surface_op == "append":
            self._append_origin.append(event.seq)
        elif kind == "request/header":
            data = event.data
            if isinstance(data, RequestHeaderData):
                self._request_header = data.header
        elif kind == "request/context":
            if isinstance(event.data, RequestContextData):
                self._request_context = event.data

    # -- projections ----------------------------------------------------------------------

    def derive_messages(self) -> MessagesView:
        """The messages the model sees: each surface node projected, in surface order.

        Incremental: each new node is projected once and the result is an O(1)
        immutable snapshot, so a call costs O(new nodes); a replacement
        (``replace_generation`` changed) rebuilds from scratch. A snapshot never
        grows with later appends and cannot be reordered in place; ``list()`` it
        for a mutable copy. The messages are shared and immutable.
        """
        state = self._surface
        if state.replace_generation != self._derived_generation:
            self._derived = []  # a new backing list: earlier snapshots keep the old one
            self._derived_nodes = 0
            self._derived_generation = state.replace_generation
        nodes = state.nodes
        if self._derived_nodes < len(nodes):
            log_ = self._log
            derived = self._derived
            for seq in nodes[self._derived_nodes :]:
                message = derive_event_message(log_[seq])
                if message is not None:
                    derived.append(message)
            self._derived_nodes = len(nodes)
        return LogView(self._derived, len(self._derived))

    def append_origin_events(self) -> list[SessionEvent]:
        """Every surface event that entered with ``surfaceOp: "append"``, in log order.

        This is the human transcript's source: it keeps entries a later
        replacement hid from the model. Replacement events are model-only.
        """
        log_ = self._log
        return [log_[seq] for seq in self._append_origin]

    def append_origin_messages(self) -> list[Message]:
        """The messages of :meth:`append_origin_events` (skipping empty assistant anchors)."""
        out: list[Message] = []
        for event in self.append_origin_events():
            message = derive_event_message(event)
            if message is not None:
                out.append(message)
        return out

    def request_header(self) -> EpochHeader | None:
        """The canonical header of the latest ``request/header``, or None."""
        header = self._request_header
        return canonical_header(header) if header is not None else None

    def request_context(self) -> RequestContextData | None:
        """The latest ``request/context`` record, or None."""
        return self._request_context

    def __repr__(self) -> str:
        return f"<Session {self.id!r} with {len(self._log)} events>"


_CONSTRUCT = object()


def _plain_intent(intent: SurfaceIntent) -> Any:
    if intent == "append" or isinstance(intent, ReplaceOp):
        return intent
    if isinstance(intent, Mapping):
        return dict(intent)
    return intent


def _checked_stored(events: Iterable[SessionEvent]) -> Iterator[SessionEvent]:
    """``Session.restore``'s events, each checked as it is adopted (no list of them is built:
    the log packs its older pages as they arrive, docs/decisions.md D37)."""
    for index, event in enumerate(events):
        if not isinstance(event, SessionEvent):
            raise InvalidSeedError(
                f"seed event at index {index} is not a SessionEvent; decode stored records "
                "with decode_event() first",
                index=index,
            )
        _check_known(event, index)
        yield event


def _check_known(event: SessionEvent, index: int) -> None:
    spec = event_type_spec(event.type)
    if spec is None:
        if event.ignorable is not True:
            from dsh_host._session.errors import UnknownEventTypeError

            raise UnknownEventTypeError(
                f'seed event at index {index}: event type "{event.type}" (seq {event.seq}) is '
                "unknown to this harness and not marked ignorable; refusing to interpret the log",
                event_type=event.type,
                seq=event.seq,
            )
        return
    if spec.data_type is not None and not isinstance(event.data, spec.data_type):
        raise InvalidSeedError(
            f"seed {event.type} at index {index} has data of type "
            f"{type(event.data).__qualname__}, expected {spec.data_type.__qualname__}; decode "
            "stored records with decode_event()",
            index=index,
        )


def _admit_borrowed(event: SessionEvent | Mapping[str, Any], index: int) -> SessionEvent:
    """Validate and copy one borrowed seed event (a SessionEvent or a plain mapping)."""
    plain = event_to_builtins(event) if isinstance(event, SessionEvent) else event
    try:
        return decode_event(plain, where=f"seed event at index {index}")
    except InvalidSessionEventError as exc:
        raise InvalidSeedError(str(exc), index=index) from exc
    except msgspec.ValidationError as exc:  # pragma: no cover - decode wraps these
        raise InvalidSeedError(f"seed event at index {index}: {exc}", index=index) from exc

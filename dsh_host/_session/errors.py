"""Errors of the session core.

::

    DshError
    └── SessionError
        ├── InvalidSessionEventError      an event (envelope, data, surface marker) is invalid
        │   ├── UnknownEventTypeError     a type nobody registered, not marked ignorable
        │   └── SurfaceTransitionError    a surface marker does not fit the current surface
        ├── InvalidSeedError              a seed / restored log fails validation (names the index)
        ├── InvalidSessionHeaderError     a header field is missing, unknown or malformed
        ├── InvalidSessionIdError         an id is empty or not a string
        ├── SessionAppendReentryError     an observer appended to the session it was notified for
        ├── SessionStoreError
        │   ├── SessionExistsError        a live session already has this id
        │   ├── SessionNotLiveError       flush/fork of a session not live in this store
        │   └── SessionAttachedError      one Session object entered into two stores
        └── SessionForkError              fork refused; ``code`` says why

Every message names the event type (or header field, or session id) and says what
to do, because these are what a plugin author sees instead of a corrupt log.
"""

from __future__ import annotations

from typing import ClassVar

from dsh_host.errors import DshError

__all__ = [
    "InvalidSeedError",
    "InvalidSessionEventError",
    "InvalidSessionHeaderError",
    "InvalidSessionIdError",
    "SessionAppendReentryError",
    "SessionAttachedError",
    "SessionError",
    "SessionExistsError",
    "SessionForkError",
    "SessionNotLiveError",
    "SessionStoreError",
    "SurfaceTransitionError",
    "UnknownEventTypeError",
]


class SessionError(DshError):
    """Base of every session-core error."""

    code: ClassVar[str] = "SESSION"


class InvalidSessionEventError(SessionError, ValueError):
    """An event was refused; ``event_type`` (and ``seq`` when known) say which."""

    code = "INVALID_SESSION_EVENT"

    def __init__(self, message: str, *, event_type: str | None = None, seq: int | None = None):
        super().__init__(message)
        self.event_type = event_type
        self.seq = seq


class UnknownEventTypeError(InvalidSessionEventError):
    """A type outside the registered vocabulary, without ``ignorable: true``.

    Reconstruction is refused rather than guessed: an event we do not understand
    may change how the rest of the log is interpreted.
    """

    code = "UNKNOWN_EVENT_TYPE"


class SurfaceTransitionError(InvalidSessionEventError):
    """A surface marker is valid in shape but does not fit the current surface."""

    code = "INVALID_SURFACE_TRANSITION"


class InvalidSeedError(SessionError, ValueError):
    """A seed or restored log is not a valid contiguous session log; ``index`` names the event."""

    code = "INVALID_SEED"

    def __init__(self, message: str, *, index: int | None = None) -> None:
        super().__init__(message)
        self.index = index


class InvalidSessionHeaderError(SessionError, ValueError):
    """A session header is invalid; ``field`` names the offending key when there is one."""

    code = "INVALID_SESSION_HEADER"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class InvalidSessionIdError(SessionError, ValueError):
    """A session id is not a non-empty string."""

    code = "INVALID_SESSION_ID"


class SessionAppendReentryError(SessionError, RuntimeError):
    """Misuse: a ``session/event`` observer appended to the session being published.

    Observers see committed events; they must not write. Queue the work and
    append it after the current append returns.
    """

    code = "SESSION_APPEND_REENTRY"

    def __init__(self) -> None:
        super().__init__("session append cannot reenter while another append is being published")


class SessionStoreError(SessionError):
    """Base of store lifecycle errors."""

    code = "SESSION_STORE"


class SessionExistsError(SessionStoreError):
    """A live session already has the requested id."""

    code = "SESSION_ALREADY_EXISTS"


class SessionNotLiveError(SessionStoreError):
    """The session is not live in this store (detached, never entered, or stale)."""

    code = "SESSION_NOT_LIVE"


class SessionAttachedError(SessionStoreError):
    """One Session object cannot be entered into two stores (or twice)."""

    code = "SESSION_ATTACHED"


class SessionForkError(SessionError):
    """``fork`` refused. ``code`` is one of ``SESSION_ALREADY_EXISTS``, ``SESSION_NOT_FOUND``,
    ``SESSION_NOT_LIVE``, ``INVALID_BOUNDARY``, ``OPEN_STEP``."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code  # type: ignore[misc]

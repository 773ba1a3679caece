"""The root of every error dsh raises on purpose.

Catch :class:`DshError` to handle anything the harness reports as a user- or
environment-level problem; anything else escaping dsh is a bug. The tree, as
far as the host core is concerned (subsystems hang their own branches under
:class:`DshError`)::

    DshError
    ├── ConfigError                 bad YAML, bad row, bad plugin config
    │   ├── UnknownPluginError      a row names a plugin nobody installed
    │   └── DuplicateRowIdError     two rows share an id
    ├── PluginRegistrationError     a plugin object is malformed (caught at registration)
    ├── EventBusError
    │   ├── UndeclaredEventError    dispatch or listen on a name nobody declared
    │   ├── EventModeConflictError  one name declared twice with different modes
    │   └── HandlerKindError        e.g. an ``async def`` on an EMIT event
    ├── ServiceError
    │   ├── ServiceUnavailableError a required service is not live
    │   └── ServiceConflictError    two plugins provide the same service
    ├── InactiveContextError        registering on a disposed plugin context
    ├── BootError                   some rows did not become active (strict boot)
    └── AbortedError                a CancelToken was aborted (cooperative cancellation)

Every message names what was wrong, where, and what to do about it, because
these errors are what a user sees instead of a traceback.
"""

from __future__ import annotations

from typing import Any, ClassVar


class DshError(Exception):
    """Base class of every deliberate dsh error.

    ``code`` is a stable machine-readable identifier where the DSH contract
    defines one (``SANDBOX_UNAVAILABLE``, ``TOOL_OUTCOME_UNKNOWN``...).
    """

    code: ClassVar[str] = "DSH_ERROR"


class ConfigError(DshError):
    """A composition (YAML file, row, or plugin config) is invalid."""

    code = "CONFIG"


class UnknownPluginError(ConfigError):
    code = "UNKNOWN_PLUGIN"


class DuplicateRowIdError(ConfigError):
    code = "DUPLICATE_ROW_ID"


class PluginRegistrationError(DshError):
    """A plugin class or object does not have the shape the host requires."""

    code = "PLUGIN_REGISTRATION"


class EventBusError(DshError):
    code = "EVENT_BUS"


class UndeclaredEventError(EventBusError):
    code = "UNDECLARED_EVENT"


class EventModeConflictError(EventBusError):
    code = "EVENT_MODE_CONFLICT"


class HandlerKindError(EventBusError, TypeError):
    """The handler's kind does not match the event's dispatch mode.

    Raised at registration, not at dispatch: an ``async def`` listener on an
    EMIT event would never be awaited, so accepting it would silently drop work.
    """

    code = "HANDLER_KIND"


class ServiceError(DshError):
    code = "SERVICE"


class ServiceUnavailableError(ServiceError, AttributeError):
    """A service was read while nobody provides it (or its provider is inactive)."""

    code = "SERVICE_UNAVAILABLE"


class ServiceConflictError(ServiceError):
    code = "SERVICE_CONFLICT"


class InactiveContextError(DshError):
    """An effect was registered on a context whose plugin is not active."""

    code = "INACTIVE_EFFECT"


class BootError(DshError):
    """A strict boot found rows that did not become active.

    ``problems`` holds one line per row, already formatted for a person.
    """

    code = "BOOT"

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems = problems or []


class AbortedError(DshError):
    """Raised by :meth:`CancelToken.throw_if_aborted`; carries the abort reason."""

    code = "ABORTED"

    def __init__(self, reason: Any = None) -> None:
        super().__init__(f"aborted: {reason!r}" if reason is not None else "aborted")
        self.reason = reason

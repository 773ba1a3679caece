"""The root of every error dsh raises on purpose, and the whole tree drawn in one place.

Catch :class:`DshError` to handle anything the harness reports as a user- or
environment-level problem; anything else escaping dsh is a bug. Each class has
a stable ``code`` where the DSH contract defines one.

The host core's classes are defined in this module; every other branch lives
next to the layer that raises it (the module is the right-hand column), all
rooted here. This drawing covers ``dsh_host`` and every shipped plugin, and
``tests/test_errors.py`` fails when it and the code disagree::

    DshError                                            dsh_host.errors
    ├── AbortError                                       dsh_host.errors
    ├── AgentError                                       dsh_host._agent.errors
    │   ├── AgentBusyError                               dsh_host._agent.errors
    │   ├── AgentClosedError                             dsh_host._agent.errors
    │   ├── AgentConfigError                             dsh_host._agent.errors
    │   ├── ApprovalDecisionError                        dsh_host._agent.errors
    │   ├── ApprovalPendingError                         dsh_host._agent.errors
    │   ├── OutputValidationError                        dsh_host._front.errors
    │   ├── PromptError                                  dsh_host._agent.errors
    │   ├── ResumeError                                  dsh_host._agent.errors
    │   └── TurnFailedError                              dsh_host._front.errors
    ├── ApiError                                         dsh_host._server.runtime
    ├── ApprovalError                                    dsh_user_approval.errors
    │   ├── ApprovalInvariantError                       dsh_user_approval.errors
    │   ├── ApprovalOutsideTurnError                     dsh_user_approval.errors
    │   ├── ApprovalRequestError                         dsh_user_approval.errors
    │   └── InvalidApprovalPolicyError                   dsh_user_approval.errors
    ├── AttachmentError                                  dsh_host._llm.attachments
    ├── AuditError                                       dsh_host._session.audit
    ├── BootError                                        dsh_host.errors
    ├── CliUsageError                                    dsh_host._cli.common
    ├── CommandInterrupted                               dsh_host._cli.common
    ├── CompactionError                                  dsh_host._session.compaction
    │   ├── ManualCompactionError                        dsh_host._session.compaction
    │   └── TargetPressureConfigError                    dsh_compaction_basic.config
    ├── ConfigError                                      dsh_host.errors
    │   ├── BuiltinToolsConfigError                      dsh_builtin_tools.config
    │   ├── DuplicateRowIdError                          dsh_host.errors
    │   ├── HookFileError                                dsh_hooks
    │   ├── McpClientConfigError                         dsh_mcp_client.config
    │   ├── MissingExtraError                            dsh_host.errors
    │   ├── SandboxConfigError                           dsh_sandbox_local.provider
    │   ├── ScriptError                                  dsh_llm_scripted.script
    │   ├── SubagentsConfigError                         dsh_subagents.config
    │   ├── TermsRefused                                 dsh_host._front.runner
    │   ├── ToolRulesError                               dsh_tool_rules.plugin
    │   └── UnknownPluginError                           dsh_host.errors
    ├── EventBusError                                    dsh_host.errors
    │   ├── EventModeConflictError                       dsh_host.errors
    │   ├── HandlerKindError                             dsh_host.errors
    │   └── UndeclaredEventError                         dsh_host.errors
    ├── GuardrailTripwireTriggered                       dsh_host._front.guardrails
    ├── InactiveContextError                             dsh_host.errors
    ├── InvalidSandboxRequestError                       dsh_host._sandbox
    ├── LlmError                                         dsh_host._llm.errors
    ├── McpStartupError                                  dsh_mcp_client.bridge
    ├── NonJsonValueError                                dsh_host._jsonsafe
    ├── PluginRegistrationError                          dsh_host.errors
    ├── SandboxUnavailableError                          dsh_host._sandbox
    ├── ServeUsageError                                  dsh_host._server.command
    ├── ServiceError                                     dsh_host.errors
    │   ├── ServiceConflictError                         dsh_host.errors
    │   └── ServiceUnavailableError                      dsh_host.errors
    ├── SessionError                                     dsh_host._session.errors
    │   ├── InvalidSeedError                             dsh_host._session.errors
    │   ├── InvalidSessionEventError                     dsh_host._session.errors
    │   │   ├── SurfaceTransitionError                   dsh_host._session.errors
    │   │   └── UnknownEventTypeError                    dsh_host._session.errors
    │   ├── InvalidSessionHeaderError                    dsh_host._session.errors
    │   ├── InvalidSessionIdError                        dsh_host._session.errors
    │   ├── SessionAppendReentryError                    dsh_host._session.errors
    │   ├── SessionForkError                             dsh_host._session.errors
    │   └── SessionStoreError                            dsh_host._session.errors
    │       ├── SessionAttachedError                     dsh_host._session.errors
    │       ├── SessionExistsError                       dsh_host._session.errors
    │       └── SessionNotLiveError                      dsh_host._session.errors
    ├── SessionPersistenceError                          dsh_host._persistence.persistence
    │   ├── SessionAlreadyExistsError                    dsh_host._persistence.persistence
    │   ├── SessionAlreadyOwnedError                     dsh_host._persistence.persistence
    │   ├── SessionAppendRejectedError                   dsh_host._persistence.persistence
    │   ├── SessionFormatUnsupportedError                dsh_host._persistence.persistence
    │   ├── SessionGenerationError                       dsh_host._persistence.persistence
    │   │   ├── SessionGenerationConflictError           dsh_host._persistence.persistence
    │   │   └── SessionGenerationSourceChangedError      dsh_host._persistence.persistence
    │   ├── SessionHandleClosedError                     dsh_host._persistence.persistence
    │   ├── SessionHandlePoisonedError                   dsh_host._persistence.persistence
    │   ├── SessionLockUnsafeError                       dsh_host._persistence.persistence
    │   ├── SessionNotFoundError                         dsh_host._persistence.persistence
    │   ├── SessionOwnershipLostError                    dsh_host._persistence.persistence
    │   ├── SessionPersistenceCorruptionError            dsh_host._persistence.persistence
    │   ├── SessionStoreUnavailableError                 dsh_session_persistence_postgres._backend
    │   └── SessionWriteError                            dsh_host._persistence.persistence
    │       └── SessionRollbackError                     dsh_host._persistence.persistence
    └── ToolError                                        dsh_host._tools.errors
        ├── EditMatchError                               dsh_builtin_tools.edit
        ├── FileChangedError                             dsh_builtin_tools.files
        ├── FileFenceError                               dsh_builtin_tools.files
        ├── FileSandboxDeniedError                       dsh_builtin_tools.files
        ├── McpCallError                                 dsh_mcp_client.bridge
        ├── McpOutcomeUnknownError                       dsh_mcp_client.bridge
        ├── McpTimeoutError                              dsh_mcp_client.bridge
        ├── McpToolError                                 dsh_mcp_client.bridge
        ├── McpUnavailableError                          dsh_mcp_client.bridge
        ├── PatternError                                 dsh_builtin_tools.patterns
        ├── ProtectedPathError                           dsh_builtin_tools.files
        ├── SandboxEscalationError                       dsh_host._tools.escalation
        ├── SkillError                                   dsh_skills
        ├── ToolArgsError                                dsh_host._tools.errors
        ├── ToolCallWaits                                dsh_host._tools.errors
        ├── ToolNotFoundError                            dsh_host._tools.errors
        ├── ToolOutputError                              dsh_host._tools.errors
        ├── ToolRegistrationError                        dsh_host._tools.errors
        ├── UnsupportedSchemaError                       dsh_host._tools.errors
        └── WorkdirError                                 dsh_builtin_tools.bash

Every message names what was wrong, where, and what to do about it, because
these errors are what a user sees instead of a traceback.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
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


#: The name dsh is published under on PyPI (``dsh`` there is another project); the command stays
#: ``dsh`` and the import ``dsh_host``. Every install hint is built from it (:func:`install_hint`).
DISTRIBUTION = "dsh-harness"


def install_hint(extra: str) -> str:
    """The command that installs one of dsh's extras: ``pip install 'dsh-harness[mcp]'``."""
    return f"pip install '{DISTRIBUTION}[{extra}]'"


class MissingExtraError(ConfigError, ImportError):
    """A plugin's optional dependency is not installed; the message says which extra brings it."""

    code = "MISSING_EXTRA"

    def __init__(self, extra: str, missing: str) -> None:
        super().__init__(
            f"needs the {extra} extra ({missing} is not installed): {install_hint(extra)}"
        )
        self.extra = extra
        self.missing = missing


@contextmanager
def require_extra(extra: str) -> Iterator[None]:
    """Turn a missing third-party module inside the block into :class:`MissingExtraError`.

    A plugin package whose imports need an optional extra wraps them once, in its
    ``__init__``::

        with require_extra("mcp"):
            from .bridge import ServerBridge

    so loading its row without the extra says what to install instead of
    ``ModuleNotFoundError``. A missing dsh module (``dsh_*``) is a bug, not an extra, and passes
    through unchanged.
    """
    try:
        yield
    except ModuleNotFoundError as exc:
        missing = exc.name or "a module"
        if missing.split(".")[0].startswith("dsh_"):
            raise
        raise MissingExtraError(extra, missing) from exc


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


class AbortError(DshError):
    """Work stopped because it was cancelled; ``reason`` is the cancel reason, if known.

    The one cancellation error: :meth:`CancelToken.throw_if_aborted` raises it
    (``aborted: <reason>``), an adapter raises it when its request is cancelled,
    and a tool body that noticed ``exec.signal`` and stopped early raises it
    (``AbortError()``: ``tool call aborted``; its result then reads exactly like
    the runtime's own ``ABORTED`` result, ``error: {name: "AbortError", code:
    "ABORTED"}``, DSH's name).
    """

    code = "ABORTED"

    def __init__(self, reason: Any = None, *, message: str | None = None) -> None:
        if message is None:
            message = f"aborted: {reason!r}" if reason is not None else "tool call aborted"
        super().__init__(message)
        self.reason = reason

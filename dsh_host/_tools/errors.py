"""Errors of the tools runtime.

Two families, kept apart as httpx keeps them:

* **Operational** errors describe one tool call that failed. The pipeline turns
  each into a *result* the model reads (``Error: <message>``); their ``code``
  travels with it as ``error: {name, code}`` in the durable ``tool/result``.
* **Misuse** errors (registration with a malformed definition, a post-execute
  decision that is not one) are raised to the plugin author at the point of
  the mistake and also derive from ``TypeError``.

::

    DshError
    └── ToolError
        ├── ToolNotFoundError          UNKNOWN_TOOL: no tool of that name is registered
        ├── ToolArgsError              INVALID_ARGS: arguments violate the tool's parameters
        ├── ToolCallWaits              CALL_WAITS: the call waits on calls of another session
        ├── ToolOutputError            INVALID_TOOL_OUTPUT: the body's value violates output
        ├── UnsupportedSchemaError     UNSUPPORTED_SCHEMA: a schema outside the enforced subset
        └── ToolRegistrationError      (also TypeError) a definition cannot be registered

A body that stopped because its call was cancelled raises
:class:`dsh_host.errors.AbortError` (``ABORTED``), the one cancellation error.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Final

from dsh_host.errors import DshError

__all__ = [
    "ABORTED",
    "ABORTED_BEFORE_DISPATCH",
    "CALL_WAITS",
    "INVALID_ARGS",
    "INVALID_TOOL_OUTPUT",
    "RECONCILED_NOT_DONE",
    "RECONCILED_UNKNOWN",
    "UNKNOWN_TOOL",
    "ToolArgsError",
    "ToolCallWaits",
    "ToolError",
    "ToolNotFoundError",
    "ToolOutputError",
    "ToolRegistrationError",
    "UnsupportedSchemaError",
]

#: Cancellation after the tool body was invoked (model text ``Error: tool call aborted``).
ABORTED: Final = "ABORTED"
#: Cancellation before the tool body was invoked.
ABORTED_BEFORE_DISPATCH: Final = "ABORTED_BEFORE_DISPATCH"
UNKNOWN_TOOL: Final = "UNKNOWN_TOOL"
#: A call left waiting on another session's deferred approvals (D36).
CALL_WAITS: Final = "CALL_WAITS"
INVALID_ARGS: Final = "INVALID_ARGS"
INVALID_TOOL_OUTPUT: Final = "INVALID_TOOL_OUTPUT"
#: A reconciler found that the crashed call did not take effect (D26; never logged as a code).
RECONCILED_NOT_DONE: Final = "RECONCILED_NOT_DONE"
#: A reconciler could not tell whether the crashed call took effect (D26).
RECONCILED_UNKNOWN: Final = "RECONCILED_UNKNOWN"


class ToolError(DshError):
    """Base of the tools runtime's errors."""

    code: ClassVar[str] = "TOOL_ERROR"


class ToolNotFoundError(ToolError):
    """The call names a tool nobody registered: ``unknown tool "<name>"``.

    Raised inside dispatch, so an unknown tool still passes through
    pre-execute, guards, the ``tools/execute`` wrappers and post-execute:
    policy listeners see every name that reaches the runtime.
    """

    code = UNKNOWN_TOOL

    def __init__(self, name: str) -> None:
        super().__init__(f'unknown tool "{name}"')
        self.tool_name = name


class ToolCallWaits(ToolError):
    """A tool body cannot finish until calls of another session are decided (D36).

    Raised by a body whose work waits on deferred approvals elsewhere (a sub-agent's child
    session whose turn ended ``awaiting-approval``). Where the call may stay deferred (a
    top-level call of a turn whose approval service defers), the call gets **no result**: a
    ``tool/waits`` event names ``session_id`` and ``call_ids``, the turn ends
    ``awaiting-approval`` listing this call, and continuing the session dispatches the call
    again. Anywhere else it is an ordinary error result with this message, which must say
    who decides and how.
    """

    code = CALL_WAITS

    def __init__(self, message: str, *, session_id: str, call_ids: Sequence[str]) -> None:
        super().__init__(message)
        self.session_id = session_id
        self.call_ids = tuple(call_ids)


class ToolArgsError(ToolError):
    """The model's arguments violate the tool's ``parameters`` schema.

    Message: ``invalid arguments: <v1>; <v2>`` (DSH's text, so the model can
    correct the call the same way under either harness).
    """

    code = INVALID_ARGS

    def __init__(self, violations: Sequence[str]) -> None:
        super().__init__("invalid arguments: " + "; ".join(violations))
        self.violations = tuple(violations)


class ToolOutputError(ToolError):
    """A body (or a post-execute replacement) returned a value its ``output`` does not allow."""

    code = INVALID_TOOL_OUTPUT

    def __init__(self, tool_name: str, violations: Sequence[str]) -> None:
        super().__init__(f'tool "{tool_name}" returned invalid output: ' + "; ".join(violations))
        self.tool_name = tool_name
        self.violations = tuple(violations)


class UnsupportedSchemaError(ToolError, TypeError):
    """A parameters/output schema uses something outside the enforced subset."""

    code = "UNSUPPORTED_SCHEMA"

    def __init__(self, violations: Sequence[str]) -> None:
        super().__init__("unsupported JSON schema: " + "; ".join(violations))
        self.violations = tuple(violations)


class ToolRegistrationError(ToolError, TypeError):
    """Misuse: a tool definition cannot be registered as given (the message says why)."""

    code = "TOOL_REGISTRATION"

"""Errors of the front door (:class:`dsh_host.Agent`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dsh_host._agent.errors import AgentError

if TYPE_CHECKING:
    from .agent import RunResult

__all__ = ["OutputValidationError", "TurnFailedError"]


class OutputValidationError(AgentError):
    """The model gave no valid structured output (``output_type=``) within its retries.

    ``result`` is the run as it ended (``output`` is None); the session log
    holds every rejected attempt with the validation error the model was sent.
    """

    code = "OUTPUT_VALIDATION"

    def __init__(self, message: str, result: RunResult) -> None:
        super().__init__(message)
        self.result = result


class TurnFailedError(AgentError):
    """The turn ended ``error`` (the model could not be reached or answered wrongly, a missing
    API key, a store outage): raised by ``run``, ``continue_turn``, ``run_sync`` and ``stream``
    instead of returning an empty answer.

    The log is flushed first and holds the turn's end; ``result`` is the run as it ended,
    ``failure_code`` the failure's code (``MISSING_CREDENTIAL``, ``AUTH``, ``RATE_LIMIT`` ...).
    The other ends (``aborted``, ``blocked``, ``awaiting-approval``, budgets, step limits) are
    outcomes a caller asked for or must act on, and are returned.
    """

    code = "TURN_FAILED"

    def __init__(self, message: str, failure_code: str, result: RunResult) -> None:
        super().__init__(message)
        self.failure_code = failure_code
        self.result = result

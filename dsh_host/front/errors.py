"""Errors of the front door (:class:`dsh_host.Agent`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dsh_host.agent.errors import AgentError

if TYPE_CHECKING:
    from .agent import RunResult

__all__ = ["OutputValidationError"]


class OutputValidationError(AgentError):
    """The model gave no valid structured output (``output_type=``) within its retries.

    ``result`` is the run as it ended (``output`` is None); the session log
    holds every rejected attempt with the validation error the model was sent.
    """

    code = "OUTPUT_VALIDATION"

    def __init__(self, message: str, result: RunResult) -> None:
        super().__init__(message)
        self.result = result

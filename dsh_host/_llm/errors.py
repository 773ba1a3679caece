"""LLM errors, and the one place an adapter's exception becomes a failure record.

::

    DshError
    └── LlmError                 code is per instance: AUTH, RATE_LIMIT, NO_ADAPTER, ...

An adapter never reports a failure by raising *through* a model stream: the
runtime's final boundary catches whatever it raised and turns it into one
terminal ``finish`` chunk (``error``, or ``aborted`` when the request was
cancelled). Why a chunk and not an exception? The agent loop logs every chunk
it receives; a failure that arrives as a chunk is logged in the same place as
the text that preceded it, and a retry policy can read it without unwinding
the consumer. :func:`failure_of` is the normalization: it decides which facts
of an exception are trusted enough to end up in the session log.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from dsh_host._session.messages import LlmFailure
from dsh_host.errors import DshError

__all__ = [
    "ABORTED_CODE",
    "CONTEXT_WINDOW_EXCEEDED_CODE",
    "EMPTY_RESPONSE_CODE",
    "INVALID_CREDENTIAL_CODE",
    "MODEL_NOT_FOUND_CODE",
    "QUOTA_EXCEEDED_CODE",
    "UNKNOWN_CODE",
    "LlmError",
    "failure_of",
]

log = logging.getLogger("dsh.llm")

#: The code of a cancelled request (also what :class:`~dsh_host.errors.AbortError` carries).
ABORTED_CODE = "ABORTED"
#: The code of an exception the boundary knows nothing about.
UNKNOWN_CODE = "UNKNOWN"
#: A request rejected because the model's context window was exceeded.
CONTEXT_WINDOW_EXCEEDED_CODE = "CONTEXT_WINDOW_EXCEEDED"
#: An exhausted account quota or balance (terminal, unlike ``RATE_LIMIT``).
QUOTA_EXCEEDED_CODE = "QUOTA"
#: A completed response that carried no content block at all.
EMPTY_RESPONSE_CODE = "EMPTY_RESPONSE"
#: The endpoint does not serve the requested model (terminal: naming another model is the fix).
MODEL_NOT_FOUND_CODE = "MODEL_NOT_FOUND"
#: A credential was supplied but cannot be used (blank, or not a legal header value).
INVALID_CREDENTIAL_CODE = "INVALID_CREDENTIAL"

_FALLBACK_MESSAGE = "LLM adapter failed"


class LlmError(DshError):
    """A model-call failure with a stable ``code`` and optional provider facts.

    ``code`` is the thing to route on (retry policies, the turn-end reason);
    ``message`` is for people. ``status``, ``provider_retry_after_ms`` and
    ``request_id`` are facts observed at the provider boundary and travel
    verbatim into the ``finish`` chunk's failure record.
    """

    code = "LLM"

    def __init__(
        self,
        message: str,
        code: str,
        *,
        status: int | None = None,
        provider_retry_after_ms: float | None = None,
        request_id: str | None = None,
    ) -> None:
        if not isinstance(message, str) or not message:
            raise ValueError("LlmError message must be a non-empty string")
        if not isinstance(code, str) or not code:
            raise ValueError("LlmError code must be a non-empty string")
        if status is not None and (
            type(status) is not int or not 100 <= status <= 599
        ):
            raise ValueError(
                f"LlmError status must be an integer from 100 through 599, not {status!r}"
            )
        retry_ms: int | None = None
        if provider_retry_after_ms is not None:
            if not math.isfinite(provider_retry_after_ms) or provider_retry_after_ms <= 0:
                raise ValueError(
                    "LlmError provider_retry_after_ms must be a positive finite number, "
                    f"not {provider_retry_after_ms!r}"
                )
            # The wire type is an integer count of ms; round up so "retry after 0.4 ms"
            # never becomes "retry now".
            retry_ms = math.ceil(provider_retry_after_ms)
        if request_id is not None and (not isinstance(request_id, str) or not request_id):
            raise ValueError("LlmError request_id must be a non-empty string")
        super().__init__(message)
        self.code = code  # type: ignore[misc]  # per-instance code, unlike most DshErrors
        self.status = status
        self.provider_retry_after_ms = retry_ms
        self.request_id = request_id

    @property
    def message(self) -> str:
        return str(self.args[0])

    @property
    def failure(self) -> LlmFailure:
        """The serializable facts of this error, as they appear in a ``finish`` chunk."""
        return _failure(
            self.message,
            self.code,
            self.status,
            self.provider_retry_after_ms,
            self.request_id,
        )


def _failure(
    message: str,
    code: str,
    status: int | None = None,
    retry_after_ms: int | None = None,
    request_id: str | None = None,
) -> LlmFailure:
    facts: dict[str, Any] = {"message": message, "code": code}
    if status is not None:
        facts["status"] = status
    if retry_after_ms is not None:
        facts["provider_retry_after_ms"] = retry_after_ms
    if request_id is not None:
        facts["request_id"] = request_id
    return LlmFailure(**facts)


def _carried_failure(exc: BaseException) -> LlmFailure | None:
    """A ``failure`` record carried by a foreign exception, if it is well-formed."""
    carried = getattr(exc, "failure", None)
    if not isinstance(carried, LlmFailure):
        return None
    if not isinstance(carried.message, str) or not carried.message:
        return None
    if not isinstance(carried.code, str) or not carried.code:
        return None
    return carried


def failure_of(exc: BaseException) -> LlmFailure:
    """Normalize anything an adapter raised into an :class:`LlmFailure`.

    - :class:`LlmError`: its own facts, verbatim;
    - any other :class:`DshError` (e.g. :class:`~dsh_host.errors.AbortError`): its
      ``code`` is a dsh code, so it is kept, with the exception's message;
    - an exception carrying a well-formed ``failure`` record whose ``code`` matches
      its own ``code`` attribute: that record (cross-package copies of LlmError);
    - anything else: code ``UNKNOWN``; a third-party ``code`` is not our taxonomy,
      so it is never trusted.

    The message is the exception's text, or ``LLM adapter failed`` when it has none.
    """
    if isinstance(exc, LlmError):
        return exc.failure
    carried = _carried_failure(exc)
    if carried is not None and getattr(exc, "code", None) == carried.code:
        return carried
    message = _message_of(exc)
    if isinstance(exc, DshError):
        code = getattr(exc, "code", None)
        return _failure(message, code if isinstance(code, str) and code else UNKNOWN_CODE)
    return _failure(message, UNKNOWN_CODE)


def _message_of(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:  # a hostile __str__ must not replace the primary failure
        return _FALLBACK_MESSAGE
    return text if text else _FALLBACK_MESSAGE

"""Provider-neutral helpers for HTTP model adapters.

Kept here rather than in one adapter so every adapter classifies the same
provider answer the same way: a context overflow is ``CONTEXT_WINDOW_EXCEEDED``
and an exhausted balance is ``QUOTA`` (terminal) whichever backend said it,
which is what lets a retry policy route on codes instead of parsing messages.
"""

from __future__ import annotations

import contextlib
import email.utils
import math
import re
import socket
import ssl
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import anyio

from .. import __version__
from .errors import (
    CONTEXT_WINDOW_EXCEEDED_CODE,
    INVALID_CREDENTIAL_CODE,
    MODEL_NOT_FOUND_CODE,
    QUOTA_EXCEEDED_CODE,
    LlmError,
)

if TYPE_CHECKING:
    from dsh_host._cancel import CancelToken

    from .types import RetryPolicy

__all__ = [
    "PROJECT_URL",
    "check_api_key",
    "declined_retry_after_note",
    "drain_tail",
    "exception_chain",
    "http_error_code",
    "is_context_window_exceeded",
    "is_model_not_found",
    "is_quota_exceeded",
    "parse_retry_after_ms",
    "request_id_of",
    "retry_after_text",
    "transport_cause",
    "user_agent",
]

#: Public home of the project, sent as the User-Agent comment.
PROJECT_URL = "https://github.com/deepseek-ai/deepseek-harness"


def user_agent() -> str:
    """The attribution ``User-Agent`` every provider request carries.

    Only public product facts (name, version, home): no user, session or path
    ever goes into it.
    """
    return f"dsh-python/{__version__} (+{PROJECT_URL})"


_LEGAL_API_KEY = re.compile(r"^[\x21-\x7e]+$")


def check_api_key(raw: str, source: str) -> str:
    """Trim and validate a supplied API key; ``source`` names where it came from.

    Blank, or containing anything but printable ASCII without spaces, is
    ``INVALID_CREDENTIAL``. The key itself never appears in the message.
    """
    value = raw.strip()
    if not value:
        raise LlmError(
            f"the API key in {source} is blank; set {source} to the raw key",
            INVALID_CREDENTIAL_CODE,
        )
    if not _LEGAL_API_KEY.match(value):
        raise LlmError(
            f"the API key in {source} contains characters no HTTP header can carry "
            f"(spaces or non-ASCII); set {source} to the raw key alone",
            INVALID_CREDENTIAL_CODE,
        )
    return value


_STRUCTURED_CONTEXT_OVERFLOW = re.compile(
    r"(?:^|[^a-z0-9])context[\s_-](?:length|window)[\s_-]"
    r"(?:exceed(?:ed|s)?|overflow(?:ed)?|limit[\s_-]exceeded)(?:$|[^a-z0-9])",
    re.IGNORECASE,
)
_MAX_CONTEXT = re.compile(
    r"\b(?:maximum|max)(?:\s+(?:allowed|supported))?\s+context\s+(?:length|window)\b",
    re.IGNORECASE,
)
_TOO_LARGE_FOR_CONTEXT = re.compile(
    r"\b(?:request|prompt|input|messages?)\s+(?:is\s+|are\s+)?too\s+(?:large|long)\s+for\s+"
    r"(?:(?:this|the)\s+)?(?:model(?:'s)?\s+)?context(?:\s+window)?\b",
    re.IGNORECASE,
)
_TOO_LONG_FOR_MODEL = re.compile(
    r"\b(?:input|prompt|request)\s+(?:is\s+)?too\s+(?:long|large)\s+for\s+(?:this|the)\s+model\b",
    re.IGNORECASE,
)
_EXCEEDS_MODEL_CONTEXT = re.compile(
    r"\b(?:input|prompt|request|messages?)\b.{0,40}"
    r"\b(?:exceed(?:s|ed)?|overflows?|is\s+larger\s+than)\b.{0,40}"
    r"\b(?:the\s+)?(?:model(?:'s)?\s+)?context(?:\s+(?:length|window))?\b",
    re.IGNORECASE,
)


def is_context_window_exceeded(detail: str) -> bool:
    """True for provider wording that says the request exceeds the model's context."""
    return any(
        pattern.search(detail)
        for pattern in (
            _STRUCTURED_CONTEXT_OVERFLOW,
            _MAX_CONTEXT,
            _TOO_LARGE_FOR_CONTEXT,
            _TOO_LONG_FOR_MODEL,
            _EXCEEDS_MODEL_CONTEXT,
        )
    )


_QUOTA_PATTERNS = tuple(
    re.compile(pattern, re.IGNORECASE)
    for pattern in (
        r"\binsufficient[\s_-]+(?:quota|balance|credits?)\b",
        r"\b(?:quota|usage[\s_-]+limit)[\s_-]+(?:exceeded|exhausted|reached)\b",
        r"\bexceed(?:ed|s)?[\s_-]+(?:(?:your|the)[\s_-]+)?(?:current[\s_-]+)?quota\b",
        r"\b(?:balance|credits?)[\s_-]+(?:exhausted|depleted)\b",
        r"\bout[\s_-]+of[\s_-]+(?:credits?|budget)\b",
    )
)


def is_quota_exceeded(detail: str) -> bool:
    """True for wording of an exhausted quota/balance (terminal), not a rate limit."""
    return any(pattern.search(detail) for pattern in _QUOTA_PATTERNS)


_MODEL_NOT_FOUND = re.compile(
    r"\bmodel[\s_-]*not[\s_-]*(?:found|exists?)\b"
    r"|\b(?:unknown|invalid|unsupported)[\s_-]+model\b"
    r"|\bno[\s_-]+such[\s_-]+model\b"
    r"|\bmodel\b[^.;\n]{0,80}\b(?:does[\s_-]+not[\s_-]+exist|not[\s_-]+found|is[\s_-]+not[\s_-]+"
    r"(?:supported|available|a[\s_-]+valid[\s_-]+model))\b",
    re.IGNORECASE,
)


def is_model_not_found(detail: str) -> bool:
    """True for provider wording that says the requested model does not exist here
    (``model_not_found``, ``The model `x` does not exist``, ``Model Not Exist``, ...)."""
    return _MODEL_NOT_FOUND.search(detail) is not None


def http_error_code(status: int, detail: str = "") -> str:
    """The stable code of a non-2xx provider answer.

    ``detail`` is the provider's error code, type and message joined by spaces.
    401/403 ``AUTH``; 413 ``INVALID_REQUEST``; 400/404 naming an unknown model
    ``MODEL_NOT_FOUND``; quota wording ``QUOTA``; 429 ``RATE_LIMIT``; 400 context
    overflow ``CONTEXT_WINDOW_EXCEEDED`` else ``INVALID_REQUEST``; >=500 ``SERVER``;
    anything else ``HTTP_<status>``.
    """
    if status in (401, 403):
        return "AUTH"
    if status == 413:
        return "INVALID_REQUEST"
    if status in (400, 404) and is_model_not_found(detail):
        return MODEL_NOT_FOUND_CODE
    if is_quota_exceeded(detail):
        return QUOTA_EXCEEDED_CODE
    if status == 429:
        return "RATE_LIMIT"
    if status == 400:
        return CONTEXT_WINDOW_EXCEEDED_CODE if is_context_window_exceeded(detail) else (
            "INVALID_REQUEST"
        )
    if status >= 500:
        return "SERVER"
    return f"HTTP_{status}"


def parse_retry_after_ms(value: str | None, now: float | None = None) -> float | None:
    """A ``Retry-After`` header as milliseconds from ``now`` (epoch seconds).

    Delay-seconds or an HTTP date; zero, negative, past, unparseable or absurd
    values give None (no provider delay), never "retry immediately".
    """
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        if len(value) > 12:  # beyond ~30,000 years: not a real instruction
            return None
        delay = int(value) * 1000.0
        return delay if delay > 0 else None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when is None or when.tzinfo is None:
        return None
    current = time.time() if now is None else now
    delay = (when.timestamp() - current) * 1000.0
    return delay if math.isfinite(delay) and delay > 0 else None


def request_id_of(headers: Mapping[str, str]) -> str | None:
    """The provider request id (``x-request-id``, else Anthropic's ``request-id``, else
    ``x-deepseek-request-id``)."""
    for name in ("x-request-id", "request-id", "x-deepseek-request-id"):
        value = headers.get(name)
        if value:
            return value
    return None


def declined_retry_after_note(policy: RetryPolicy, error: LlmError) -> str | None:
    """What to add to ``error``'s message when ``policy`` will not wait its ``Retry-After``.

    A declined wait is otherwise invisible (the turn just ends with the provider's error);
    the decision is :meth:`RetryPolicy.declines_retry_after`, the same one ``llm-retry`` makes.
    """
    if not policy.declines_retry_after(error.failure):
        return None
    return (
        f"the server asked to wait {retry_after_text(error.provider_retry_after_ms)} before "
        "retrying (Retry-After), longer than this route's retry_policy.backoff.max_delay_ms "
        f"({policy.max_delay_ms:g}ms), so dsh does not retry: try again later, or raise "
        f"max_delay_ms to at least {error.provider_retry_after_ms} to let llm-retry wait"
    )


def retry_after_text(delay_ms: float | None) -> str:
    """A provider delay for people: ``30s``, ``2m 5s``, ``450ms``."""
    if delay_ms is None:
        return "an unknown time"
    if delay_ms < 1000:
        return f"{delay_ms:.0f}ms"
    seconds = round(delay_ms / 1000)
    minutes, seconds = divmod(seconds, 60)
    return f"{minutes}m {seconds}s" if minutes else f"{seconds}s"


def exception_chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and every exception it wraps, nearest first, each once: causes, contexts, the
    members of a group (trio reports every failed address in one) and the exception an SDK
    wrapper keeps as ``original_exception`` (LiteLLM's)."""
    seen: set[int] = set()
    pending: list[BaseException] = [exc]
    while pending:
        current = pending.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        wrapped = getattr(current, "original_exception", None)
        members = getattr(current, "exceptions", ())
        for linked in (*members, current.__cause__, current.__context__, wrapped):
            if isinstance(linked, BaseException):
                pending.append(linked)


def transport_cause(exc: BaseException) -> str:
    """Why a connection failed, from the innermost OS error of the chain, with what to do."""
    reason = str(exc) or type(exc).__name__
    for current in exception_chain(exc):
        if isinstance(current, ConnectionRefusedError):
            return (
                "connection refused (nothing listens there; start the server or fix the port "
                "in base_url)"
            )
        if isinstance(current, socket.gaierror):
            return f"the host name does not resolve ({current.strerror}); check base_url"
        if isinstance(current, ssl.SSLError):
            return f"TLS failed ({current.reason or current}); check the scheme and certificate"
        if isinstance(current, OSError) and current.strerror:
            reason = current.strerror
    return reason


#: after the answer's last event an adapter reads on to the end of the body (normally only the
#: chunked terminator, already on its way) so the kept-alive connection returns to the pool;
#: a server that sends more than this many events, or not within this time, costs only the
#: connection
TAIL_EVENTS = 64
TAIL_SECONDS = 5.0


async def drain_tail(events: AsyncIterator[Any], signal: CancelToken | None) -> None:
    """Read what follows a complete answer in an SDK's event stream, so the HTTP/1.1
    connection can carry the next request instead of being closed with the stream.

    The answer is complete: a failure, a timeout or an abort here only means the connection is
    closed instead of reused, so none is reported.
    """
    scope = signal.linked_scope() if signal is not None else contextlib.nullcontext()
    with anyio.move_on_after(TAIL_SECONDS), scope:
        try:
            for _ in range(TAIL_EVENTS):
                await events.__anext__()
        except Exception:  # StopAsyncIteration (the end: the goal), or a broken tail
            return

"""Request-header folds: the request envelope lives in the log like everything else.

The loop logs a full ``request/header`` inside each step before dispatch when
the header changed (reason ``initial`` / ``resume`` / ``change``); the header in
force is the latest one. These helpers put headers in canonical form and compare
them the way DSH does, so "did the header change?" has one answer.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec
from msgspec import UNSET

from dsh_host._session.events import RequestContextData, RequestHeaderData, SessionEvent
from dsh_host._session.messages import EpochHeader

__all__ = [
    "canonical_header",
    "fold_request_context",
    "fold_request_header",
    "headers_equal",
]


def canonical_header(header: EpochHeader) -> EpochHeader:
    """Drop empty ``system`` and ``tools``; keep ``adapter_defaults`` only if a marker is set."""
    changes: dict[str, object] = {}
    if header.system is not UNSET and header.system == "":
        changes["system"] = UNSET
    if header.tools is not UNSET and len(header.tools) == 0:
        changes["tools"] = UNSET
    defaults = header.adapter_defaults
    if (
        defaults is not UNSET
        and defaults.reasoning_effort is not True
        and (defaults.max_tokens is not True)
    ):
        changes["adapter_defaults"] = UNSET
    return msgspec.structs.replace(header, **changes) if changes else header


def headers_equal(a: EpochHeader, b: EpochHeader) -> bool:
    """Equality of canonical headers: field-wise config, markers, system, tool schema JSON."""
    if a is b:
        return True
    ca, cb = canonical_header(a), canonical_header(b)
    if ca.config != cb.config or ca.adapter_defaults != cb.adapter_defaults:
        return False
    if ca.system != cb.system:
        return False
    tools_a = () if ca.tools is UNSET else ca.tools
    tools_b = () if cb.tools is UNSET else cb.tools
    if len(tools_a) != len(tools_b):
        return False
    encode = msgspec.json.encode
    return all(
        x is y or encode(x, enc_hook=dict) == encode(y, enc_hook=dict)
        for x, y in zip(tools_a, tools_b, strict=True)
    )


def fold_request_header(
    events: Iterable[SessionEvent], from_: EpochHeader | None = None
) -> EpochHeader | None:
    """The canonical header of the last ``request/header`` event, else ``from_``."""
    result = from_
    for event in events:
        if event.type == "request/header" and isinstance(event.data, RequestHeaderData):
            result = event.data.header
    return canonical_header(result) if result is not None else None


def fold_request_context(events: Iterable[SessionEvent]) -> RequestContextData | None:
    """The last ``request/context`` record, or None."""
    result: RequestContextData | None = None
    for event in events:
        if event.type == "request/context" and isinstance(event.data, RequestContextData):
            result = event.data
    return result

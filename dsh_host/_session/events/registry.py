"""The event-type registry: which types exist, their data Struct, surface eligibility."""

from __future__ import annotations

import builtins
import re
from collections.abc import Callable
from typing import Final, NamedTuple

import msgspec

from dsh_host._session.messages import (
    UserMessage,
)

from .data import (
    ApprovalAsked,
    ApprovalDecided,
    ApprovalPolicyChanged,
    AssistantAttemptData,
    AssistantMessageData,
    DeveloperMessageData,
    EndSeedData,
    LlmRetryData,
    LlmRetryStartedData,
    RequestContextData,
    RequestHeaderData,
    RunTerms,
    StepEnd,
    StepStart,
    SystemMessageData,
    TodoWrite,
    ToolCallData,
    ToolResultData,
    TurnEnd,
    TurnStart,
)

# --- the registry --------------------------------------------------------------------------


class EventTypeSpec(NamedTuple):
    """What the registry knows about one event type."""

    type: str  #: the event type
    data_type: builtins.type[msgspec.Struct] | None  #: data Struct, or None for opaque frozen JSON
    surface: bool  #: surface-eligible (must carry surfaceOp)


_REGISTRY: dict[str, EventTypeSpec] = {}

#: The three core surface types (DSH v3's ``system/message`` is also eligible).
CORE_SURFACE_TYPES: Final = frozenset({"user/message", "assistant/message", "tool/result"})

#: Exactly DSH v3's known-type list (0.1.5-rc.2 / 0.1.6-alpha.2 ``KNOWN_SESSION_EVENT_TYPES``,
#: 56 names). A log holding another type without ``ignorable: true`` is refused by DSH, so this
#: harness neither writes nor reads one: older generations' ``assistant/chunk`` and
#: ``tool/code-dispatch*`` exist only inside migration (as plain rows), never as events.
DSH_V3_KNOWN_EVENT_TYPES: Final = frozenset(
    {
        "agent-preset/selected",
        "agent/inbox/spliced",
        "approval/asked",
        "approval/decided",
        "approval/policy",
        "assistant/attempt",
        "assistant/message",
        "command/done",
        "command/run",
        "compaction/end",
        "compaction/prune",
        "compaction/start",
        "compaction/summary",
        "deliverables/presented",
        "feedback/message-delete",
        "feedback/message-put",
        "feedback/record",
        "goal/change",
        "hook/invoked",
        "hook/result",
        "llm/retry",
        "llm/retry-started",
        "model/selection",
        "permission/preset",
        "plan/mode",
        "request/context",
        "request/header",
        "sandbox/mode",
        "schedule/change",
        "session-log-deepseek/delivery-accepted",
        "session/end-seed",
        "session/title",
        "session/title-llm-request",
        "step/end",
        "step/start",
        "subagent/catalog",
        "subagent/descriptor",
        "subagent/model-selection-policy",
        "system/message",
        "team/member",
        "team/message/delivered",
        "team/message/queued",
        "team/task",
        "todo/write",
        "tool-workflow/agent-end",
        "tool-workflow/agent-start",
        "tool-workflow/run-end",
        "tool-workflow/run-start",
        "tool/call",
        "tool/ptc-dispatch",
        "tool/ptc-dispatch-start",
        "tool/result",
        "turn/end",
        "turn/start",
        "user/message",
        "web/deepseek-search-llm-request",
    }
)

#: The event types DSH's format v4 knows beyond v3's list (DSH 0.1.7 / 0.2
#: ``KNOWN_SESSION_EVENT_TYPES``: 59 names, v3's 56 plus these). A v3 log never holds one
#: without ``ignorable: true`` (DSH 0.1.5 refuses it, so the JSONL plugin neither reads nor
#: writes one there); a v4 log may (docs/format.md §10.1).
DSH_V4_ONLY_EVENT_TYPES: Final = frozenset(
    {"developer/message", "image/offload", "workspace/changes"}
)

_TYPE_RE: Final = re.compile(r"^[a-z0-9][a-z0-9._-]*(/[a-z0-9][a-z0-9._-]*)+$")


def register_event_type(
    type: str,
    data_type: type[msgspec.Struct] | None,
    *,
    surface: bool = False,
) -> Callable[[], None]:
    """Add ``type`` to the vocabulary; returns a disposer that removes it again.

    ``data_type`` is the frozen Struct ``data`` decodes into, or None to keep
    the payload as opaque frozen JSON. Registering the same spec twice is a
    no-op; a conflicting spec is an error (two plugins must not disagree about
    what an event means). A ``surface`` type's data must be a message or carry
    a ``message`` field: that is what the surface projects.
    """
    if not isinstance(type, str) or not _TYPE_RE.match(type):
        raise ValueError(
            f"event type {type!r} is not a valid name: use lower-case segments joined by '/', "
            "e.g. 'my-plugin/thing'"
        )
    if data_type is not None and not (
        isinstance(data_type, builtins.type) and issubclass(data_type, msgspec.Struct)
    ):
        raise TypeError(f"event type {type!r}: data_type must be a msgspec Struct class or None")
    if type == "request/header-delta":
        raise ValueError("request/header-delta is a retired legacy type and cannot be registered")
    spec = EventTypeSpec(type, data_type, surface)
    existing = _REGISTRY.get(type)
    if existing is not None:
        if existing == spec:
            return lambda: None
        raise ValueError(
            f"event type {type!r} is already registered as {existing}; "
            "pick a type name in your own namespace"
        )
    _REGISTRY[type] = spec

    def dispose() -> None:
        if _REGISTRY.get(type) == spec:
            del _REGISTRY[type]

    return dispose


def event_type_spec(type: str) -> EventTypeSpec | None:
    """The registry entry of ``type``, or None when nobody registered it."""
    return _REGISTRY.get(type)


def is_known_event_type(type: str) -> bool:
    """True when ``type`` is registered."""
    return type in _REGISTRY


def is_surface_type(type: str) -> bool:
    """True when events of ``type`` must carry a surface marker."""
    spec = _REGISTRY.get(type)
    return spec is not None and spec.surface


def registered_event_types() -> frozenset[str]:
    """A snapshot of the registered vocabulary."""
    return frozenset(_REGISTRY)


_CORE: tuple[tuple[str, type[msgspec.Struct] | None, bool], ...] = (
    ("turn/start", TurnStart, False),
    ("turn/end", TurnEnd, False),
    ("step/start", StepStart, False),
    ("step/end", StepEnd, False),
    ("user/message", UserMessage, True),
    ("assistant/message", AssistantMessageData, True),
    ("tool/result", ToolResultData, True),
    ("system/message", SystemMessageData, True),
    # DSH format v4 only (read and continued in a v4 log; the agent loop never writes it)
    ("developer/message", DeveloperMessageData, True),
    ("assistant/attempt", AssistantAttemptData, False),
    ("tool/call", ToolCallData, False),
    ("todo/write", TodoWrite, False),
    ("request/header", RequestHeaderData, False),
    ("request/context", RequestContextData, False),
    ("session/end-seed", EndSeedData, False),
    ("approval/asked", ApprovalAsked, False),
    ("approval/decided", ApprovalDecided, False),
    ("approval/policy", ApprovalPolicyChanged, False),
    ("llm/retry", LlmRetryData, False),
    ("llm/retry-started", LlmRetryStartedData, False),
    # beyond DSH, always written ignorable: true (DSH keeps it without interpreting it)
    ("run/terms", RunTerms, False),
)

for _type, _data, _surface in _CORE:
    register_event_type(_type, _data, surface=_surface)
for _type in sorted(DSH_V3_KNOWN_EVENT_TYPES | DSH_V4_ONLY_EVENT_TYPES):
    if _type not in _REGISTRY:
        register_event_type(_type, None)

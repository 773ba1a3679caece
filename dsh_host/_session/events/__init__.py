"""Session events: the envelope, the core vocabulary, the type registry, and the wire codec.

One module per concern, re-exported here (``from dsh_host._session.events import ...``):
:mod:`.envelope` (``SessionEvent``, surface markers), :mod:`.reasons` (turn-end
reasons), :mod:`.data` (the core data Structs), :mod:`.registry` (the open type
registry and DSH v3's vocabulary), :mod:`.coerce` (data shape checks and the typed
fast path, shared by append and decode) and :mod:`.codec` (decoding and encoding).

A :class:`SessionEvent` is one immutable log entry::

    {type, seq, time, data, sourceEventSeqs?, surfaceOp?, ignorable?}

``data`` is a typed frozen Struct for every type registered with a data Struct
(the core vocabulary below), and deeply frozen JSON (``MappingProxyType`` /
``tuple``) for types registered as opaque (``register_event_type(t, None)``, e.g.
the DSH types this project does not model yet) and for unknown types marked
``ignorable: true``.

The vocabulary is open: plugins call :func:`register_event_type` for their own
types (the returned disposer undoes it). A reader that meets a type nobody
registered refuses the event unless it carries ``ignorable: true`` — an event we
do not understand may change how the rest of the log must be interpreted.

Decoding is two-phase: the envelope first (``data`` kept raw), then ``data``
through the registry, so one unknown payload shape never poisons the envelope
check and each error can name the event type.

Surface eligibility is a property of the type: ``user/message``,
``assistant/message`` and ``tool/result`` (and DSH v3's ``system/message``, so
DSH logs load) must carry ``surfaceOp``; every other type must not carry
``surfaceOp`` or ``sourceEventSeqs``.
"""

from __future__ import annotations

from .codec import (
    decode_accepted_line,
    decode_event,
    decode_event_line,
    decode_events,
    encode_event,
    event_to_builtins,
    parse_surface_marker,
    to_builtins,
)
from .coerce import (
    coerce_event_data,
    system_message_problem,
)
from .data import (
    ApprovalAsked,
    ApprovalDecided,
    ApprovalPolicyChanged,
    AssistantAttemptData,
    AssistantChunkData,
    AssistantMessageData,
    DeveloperMessageData,
    EndSeedData,
    LlmRetryData,
    LlmRetryStartedData,
    RequestContextData,
    RequestHeaderData,
    StepEnd,
    StepStart,
    SystemMessageData,
    TodoItem,
    TodoWrite,
    ToolCallData,
    ToolErrorData,
    ToolResultData,
    TurnEnd,
    TurnStart,
)
from .envelope import (
    ReplaceOp,
    SessionEvent,
    SurfaceOp,
)
from .reasons import (
    AbortedReason,
    AgentCancelCause,
    BlockedReason,
    CompletedReason,
    DisposedCancel,
    ErrorReason,
    ForkedReason,
    HookCancel,
    InterruptedReason,
    LegacyCancel,
    MaxTokensReason,
    MaxTurnRequestsReason,
    ParentCancel,
    TurnEndCancelCause,
    TurnEndReason,
    UnknownTurnEndReason,
    UserCancel,
    register_turn_end_reason,
    turn_end_kind,
)
from .registry import (
    CORE_SURFACE_TYPES,
    DSH_V3_KNOWN_EVENT_TYPES,
    DSH_V4_ONLY_EVENT_TYPES,
    EventTypeSpec,
    event_type_spec,
    is_known_event_type,
    is_surface_type,
    register_event_type,
    registered_event_types,
)

__all__ = [
    "CORE_SURFACE_TYPES",
    "DSH_V3_KNOWN_EVENT_TYPES",
    "DSH_V4_ONLY_EVENT_TYPES",
    "AbortedReason",
    "AgentCancelCause",
    "ApprovalAsked",
    "ApprovalDecided",
    "ApprovalPolicyChanged",
    "AssistantAttemptData",
    "AssistantChunkData",
    "AssistantMessageData",
    "BlockedReason",
    "CompletedReason",
    "DeveloperMessageData",
    "DisposedCancel",
    "EndSeedData",
    "ErrorReason",
    "EventTypeSpec",
    "ForkedReason",
    "HookCancel",
    "InterruptedReason",
    "LegacyCancel",
    "LlmRetryData",
    "LlmRetryStartedData",
    "MaxTokensReason",
    "MaxTurnRequestsReason",
    "ParentCancel",
    "ReplaceOp",
    "RequestContextData",
    "RequestHeaderData",
    "SessionEvent",
    "StepEnd",
    "StepStart",
    "SurfaceOp",
    "SystemMessageData",
    "TodoItem",
    "TodoWrite",
    "ToolCallData",
    "ToolErrorData",
    "ToolResultData",
    "TurnEnd",
    "TurnEndCancelCause",
    "TurnEndReason",
    "TurnStart",
    "UnknownTurnEndReason",
    "UserCancel",
    "coerce_event_data",
    "decode_accepted_line",
    "decode_event",
    "decode_event_line",
    "decode_events",
    "encode_event",
    "event_to_builtins",
    "event_type_spec",
    "is_known_event_type",
    "is_surface_type",
    "parse_surface_marker",
    "register_event_type",
    "register_turn_end_reason",
    "registered_event_types",
    "system_message_problem",
    "to_builtins",
    "turn_end_kind",
]

"""Session events: the envelope, the core vocabulary, the type registry, and the wire codec.

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

import builtins
import json
import re
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal, NamedTuple, TypeAlias

import msgspec
import msgspec.inspect
from msgspec import UNSET, UnsetType

from dsh_host.jsonsafe import (
    MAX_SAFE_INTEGER,
    FrozenJson,
    NonJsonValueError,
    check_json,
    freeze_json,
    is_safe_int,
    json_dec_hook,
    json_enc_hook,
    to_json_builtins,
)
from dsh_host.session.errors import InvalidSessionEventError, UnknownEventTypeError
from dsh_host.session.messages import (
    AssistantMessage,
    AssistantStreamRecord,
    EpochHeader,
    LlmFailure,
    NonNegativeInt,
    PositiveInt,
    StreamChunk,
    SystemMessage,
    TokenUsage,
    ToolResultBlock,
    ToolResultMessage,
    UserMessage,
    Wire,
)

__all__ = [
    "CORE_SURFACE_TYPES",
    "DSH_V3_KNOWN_EVENT_TYPES",
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
    "ToolError",
    "ToolResultData",
    "TurnEnd",
    "TurnEndCancelCause",
    "TurnEndReason",
    "TurnStart",
    "UnknownTurnEndReason",
    "UserCancel",
    "coerce_event_data",
    "decode_event",
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


# --- surface markers -----------------------------------------------------------------------


class ReplaceOp(Wire, frozen=True, kw_only=True):
    """``{op: "replace", startSeq, endSeq}``: shadow the surface nodes ``start..end`` (inclusive).

    On the wire the range is ``startSeq``/``endSeq``, as DSH v3 requires (its v3 admission
    refuses a replace spelled otherwise); the older ``start``/``end`` spelling (DSH v2, and
    logs earlier dsh builds wrote) is still read.
    """

    op: Literal["replace"] = "replace"  #: always "replace"
    start: NonNegativeInt = msgspec.field(name="startSeq")  #: seq of the first shadowed node
    end: NonNegativeInt = msgspec.field(name="endSeq")  #: seq of the last shadowed node


#: How a surface event entered the surface: appended at the tail, or replacing a range.
SurfaceOp: TypeAlias = Literal["append"] | ReplaceOp


# --- the envelope --------------------------------------------------------------------------


class SessionEvent(msgspec.Struct, frozen=True, kw_only=True, rename="camel", gc=False):
    """One immutable entry of a session log.

    Invariants (enforced by :class:`~dsh_host.session.session.Session`, not by
    construction): ``seq`` equals the event's index; ``surface_op`` is present
    exactly on surface-eligible types; ``source_event_seqs`` only on those.
    """

    type: str  #: event type, e.g. ``turn/start``
    seq: int  #: position in the log (== index), contiguous from 0
    time: int  #: Unix epoch milliseconds (may step backwards)
    data: Any  #: typed frozen Struct, or frozen JSON for opaque/ignorable types
    source_event_seqs: tuple[int, ...] | UnsetType = UNSET  #: cited earlier events (surface only)
    surface_op: SurfaceOp | UnsetType = UNSET  #: required on surface types, forbidden elsewhere
    ignorable: Literal[True] | UnsetType = UNSET  #: a reader may keep it without understanding it
    #: The record's JSON exactly as decoded, kept only when the typed fields would encode it
    #: differently (keys this build does not model, e.g. DSH's ``TokenUsage.totalTokens``; a
    #: marker an unknown ignorable type carried), or when built in an exact key order (repair
    #: closers in DSH's). :func:`encode_event` writes it and :func:`event_to_builtins` returns
    #: it, so every view and every copy shows what the log holds. Never encode a SessionEvent
    #: with msgspec directly.
    wire: bytes | UnsetType = UNSET


# --- turn end reasons (kind-tagged, open) --------------------------------------------------


class UserCancel(Wire, frozen=True, kw_only=True, tag="user", tag_field="kind"):
    """The user cancelled."""


class ParentCancel(Wire, frozen=True, kw_only=True, tag="parent", tag_field="kind"):
    """The parent agent cancelled."""


class HookCancel(Wire, frozen=True, kw_only=True, tag="hook", tag_field="kind"):
    """A hook cancelled."""

    reason: str  #: the hook's reason


class DisposedCancel(Wire, frozen=True, kw_only=True, tag="disposed", tag_field="kind"):
    """The agent was disposed."""


class LegacyCancel(Wire, frozen=True, kw_only=True, tag="legacy", tag_field="kind"):
    """Imported from an old record that carried no cause."""


#: Why an active agent driver was cancelled.
AgentCancelCause: TypeAlias = UserCancel | ParentCancel | HookCancel | DisposedCancel
#: A durable cancellation cause (adds ``legacy`` for imports).
TurnEndCancelCause: TypeAlias = AgentCancelCause | LegacyCancel


class CompletedReason(Wire, frozen=True, kw_only=True, tag="completed", tag_field="kind"):
    """Normal end (or an empty entered turn)."""


class AbortedReason(Wire, frozen=True, kw_only=True, tag="aborted", tag_field="kind"):
    """Cancellation interrupted the live turn."""

    reason: TurnEndCancelCause  #: who cancelled


class BlockedReason(Wire, frozen=True, kw_only=True, tag="blocked", tag_field="kind"):
    """Pre-step rejected the turn."""


class ErrorReason(Wire, frozen=True, kw_only=True, tag="error", tag_field="kind"):
    """The turn failed; non-LLM errors are flattened to ``code: "UNKNOWN"``."""

    error: LlmFailure  #: the failure


class MaxTokensReason(Wire, frozen=True, kw_only=True, tag="max-tokens", tag_field="kind"):
    """Some step hit the output ceiling (sticky for the turn)."""


class MaxTurnRequestsReason(
    Wire, frozen=True, kw_only=True, tag="max-turn-requests", tag_field="kind"
):
    """The turn reached the agent's step limit (``maxStepsPerTurn``) and still wanted to go on.

    Written by the loop's loop guard, not by DSH: DSH's ``TurnEndReasonMap``
    reserves ACP's ``max_turn_requests`` for the producer that first emits it,
    spelled like ``max-tokens``. A reader that does not know the kind keeps it
    as an :class:`UnknownTurnEndReason` (the union is merge-extensible).
    """

    limit: PositiveInt  #: the step limit that was reached


class InterruptedReason(Wire, frozen=True, kw_only=True, tag="interrupted", tag_field="kind"):
    """Written only by crash repair (resume), never by the loop."""


class ForkedReason(Wire, frozen=True, kw_only=True, tag="forked", tag_field="kind"):
    """Written only into a fork seed, closing a turn open at the fork boundary."""


class UnknownTurnEndReason(Mapping[str, Any]):
    """A turn-end reason of a kind nobody registered: kept verbatim, never an error.

    The reason union is merge-extensible, so an unknown kind is a valid value
    (written by a plugin or a newer harness); every match over reasons needs a
    default branch that lands here. It is a read-only mapping of its JSON.
    """

    __slots__ = ("_json",)

    def __init__(self, value: Mapping[str, Any]) -> None:
        frozen = freeze_json(value, "turn/end reason")
        if not isinstance(frozen, Mapping) or not isinstance(frozen.get("kind"), str):
            raise ValueError("a turn/end reason must be a mapping with a string `kind`")
        self._json: Mapping[str, Any] = frozen

    @property
    def kind(self) -> str:
        """The reason's kind tag."""
        return str(self._json["kind"])

    def __getitem__(self, key: str) -> Any:
        return self._json[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._json)

    def __len__(self) -> int:
        return len(self._json)

    def __repr__(self) -> str:
        return f"UnknownTurnEndReason({dict(self._json)!r})"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, UnknownTurnEndReason):
            return dict(self._json) == dict(other._json)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.kind)


#: Why a turn ended (kind-tagged; plugins add kinds with :func:`register_turn_end_reason`).
TurnEndReason: TypeAlias = (
    CompletedReason
    | AbortedReason
    | BlockedReason
    | ErrorReason
    | MaxTokensReason
    | MaxTurnRequestsReason
    | InterruptedReason
    | ForkedReason
    | UnknownTurnEndReason
)

_TURN_END_REASONS: dict[str, type[msgspec.Struct]] = {
    cls.__struct_config__.tag: cls  # type: ignore[misc]
    for cls in (
        CompletedReason,
        AbortedReason,
        BlockedReason,
        ErrorReason,
        MaxTokensReason,
        MaxTurnRequestsReason,
        InterruptedReason,
        ForkedReason,
    )
}


def turn_end_kind(reason: TurnEndReason) -> str:
    """The ``kind`` of any turn-end reason, registered or not (for a match's default branch)."""
    if isinstance(reason, UnknownTurnEndReason):
        return reason.kind
    return str(reason.__struct_config__.tag)


def register_turn_end_reason(reason_type: type[msgspec.Struct]) -> Callable[[], None]:
    """Teach decoding a plugin's turn-end kind (a Struct with ``tag_field="kind"``).

    Returns a disposer. Unregistered kinds still decode, as
    :class:`UnknownTurnEndReason`.
    """
    config = reason_type.__struct_config__
    kind = config.tag
    if config.tag_field != "kind" or not isinstance(kind, str):
        raise TypeError(f"{reason_type.__qualname__} must be a Struct with tag_field='kind'")
    existing = _TURN_END_REASONS.get(kind)
    if existing is not None and existing is not reason_type:
        raise ValueError(f"turn/end reason kind {kind!r} is already registered by {existing!r}")
    _TURN_END_REASONS[kind] = reason_type

    def dispose() -> None:
        if _TURN_END_REASONS.get(kind) is reason_type:
            del _TURN_END_REASONS[kind]

    return dispose


if TYPE_CHECKING:
    _AnyTurnEndReason = TurnEndReason
else:

    class _AnyReasonMeta(type):
        def __instancecheck__(cls, instance: object) -> bool:
            return True

    class _AnyTurnEndReason(metaclass=_AnyReasonMeta):
        """Annotation that routes reason decoding through :func:`_dec_hook` (open union)."""


def _decode_turn_end_reason(obj: Any) -> Any:
    if not isinstance(obj, Mapping):
        raise msgspec.ValidationError("a turn/end reason must be an object with a `kind`")
    kind = obj.get("kind")
    if not isinstance(kind, str):
        raise msgspec.ValidationError("a turn/end reason must have a string `kind`")
    reason_type = _TURN_END_REASONS.get(kind)
    if reason_type is None:
        return UnknownTurnEndReason(obj)
    return msgspec.convert(obj, reason_type, dec_hook=_dec_hook)


def _dec_hook(tp: type, obj: Any) -> Any:
    if tp is _AnyTurnEndReason:  # type: ignore[comparison-overlap]
        return _decode_turn_end_reason(obj)
    return json_dec_hook(tp, obj)


def _enc_hook(value: Any) -> Any:
    if isinstance(value, UnknownTurnEndReason):
        return dict(value._json)
    if isinstance(value, Mapping):
        return dict(value)
    return json_enc_hook(value)


# --- core data Structs ---------------------------------------------------------------------


class TurnStart(Wire, frozen=True, kw_only=True):
    """``turn/start``: opens turn ``turn`` (1, 2, ... per session)."""

    turn: PositiveInt  #: the turn number


class TurnEnd(Wire, frozen=True, kw_only=True):
    """``turn/end``: closes turn ``turn``."""

    turn: PositiveInt  #: the turn number
    reason: _AnyTurnEndReason  #: why it ended (match with a default branch)


class StepStart(Wire, frozen=True, kw_only=True):
    """``step/start``: one model call plus the tool executions it requested."""

    turn: PositiveInt  #: the turn number
    step: PositiveInt  #: the step number within the turn (from 1)


class StepEnd(Wire, frozen=True, kw_only=True):
    """``step/end``: always written, even when the step failed."""

    turn: PositiveInt  #: the turn number
    step: PositiveInt  #: the step number within the turn


class AssistantMessageData(Wire, frozen=True, kw_only=True):
    """``assistant/message``: the assembled message of one step, with its embedded stream."""

    turn: PositiveInt  #: the turn number
    step: PositiveInt  #: the step number
    message: AssistantMessage  #: what the model said (projected unless content is empty)
    stream: tuple[AssistantStreamRecord, ...] | UnsetType = UNSET  #: compact timed raw stream
    usage: TokenUsage | UnsetType = UNSET  #: token accounting of the step, when reported
    interrupted: Literal[True] | UnsetType = UNSET  #: the delivered prefix of a cancelled step


class AssistantChunkData(Wire, frozen=True, kw_only=True):
    """``assistant/chunk`` (pre-v3 logs): one raw stream chunk as its own event.

    Not in the v3 vocabulary (DSH v3 refuses it), so not registered: migration
    folds these rows into ``assistant/message`` streams.
    """

    turn: PositiveInt  #: the turn number
    step: PositiveInt  #: the step number
    chunk: StreamChunk  #: the chunk


class AssistantAttemptData(Wire, frozen=True, kw_only=True):
    """``assistant/attempt`` (DSH v3): a model attempt that committed no surface message."""

    turn: PositiveInt  #: the turn number
    step: PositiveInt  #: the step number
    stream: tuple[AssistantStreamRecord, ...]  #: the attempt's compact stream


class SystemMessageData(Wire, frozen=True, kw_only=True):
    """``system/message`` (DSH v3): a system prompt node on the surface."""

    turn: PositiveInt  #: the turn number
    step: PositiveInt  #: the step number
    message: SystemMessage  #: the prompt (empty content projects nothing)


class ToolCallData(Wire, frozen=True, kw_only=True):
    """``tool/call``: the scheduler began processing a call (appended before pre-execute)."""

    turn: PositiveInt  #: the turn number
    step: PositiveInt  #: the step number
    call_id: str  #: pairs the call with its ``tool/result``
    name: str  #: tool name
    arguments: str  #: the model's raw JSON string, unparsed


class ToolError(Wire, frozen=True, kw_only=True):
    """Internal failure identity of a tool result (e.g. ``TOOL_OUTCOME_UNKNOWN``)."""

    name: str  #: error class name, e.g. ``ToolOutcomeUnknownError``
    code: str  #: stable code, e.g. ``TOOL_OUTCOME_UNKNOWN``


class ToolResultData(Wire, frozen=True, kw_only=True):
    """``tool/result``: the model-facing result of one call."""

    turn: PositiveInt  #: the turn number
    step: PositiveInt  #: the step number
    message: ToolResultMessage  #: what the model sees
    error: ToolError | UnsetType = UNSET  #: internal failure identity
    meta: FrozenJson | UnsetType = UNSET  #: tool-private presentation payload (frozen JSON)


class TodoItem(Wire, frozen=True, kw_only=True):
    """One todo entry."""

    content: str  #: what to do
    status: Literal["pending", "in_progress", "completed"]  #: progress


class TodoWrite(Wire, frozen=True, kw_only=True):
    """``todo/write``: a whole-list snapshot; the last write wins."""

    todos: tuple[TodoItem, ...]  #: the list


class RequestHeaderData(Wire, frozen=True, kw_only=True):
    """``request/header``: the full request envelope, appended inside the step before dispatch."""

    header: EpochHeader  #: the envelope
    reason: Literal["initial", "resume", "change", "series"]  #: why it was logged
    starts_series: Literal[True] | UnsetType = UNSET  #: DSH v3: a changed header begins a series


class RequestContextData(Wire, frozen=True, kw_only=True):
    """``request/context``: route metadata, logged when it changes."""

    provider: str  #: adapter route
    model: str  #: provider model id
    context_window: NonNegativeInt | UnsetType = UNSET  #: advertised context size
    system_prompt_update: str | UnsetType = UNSET  #: DSH v3 route capability marker


class EndSeedData(Wire, frozen=True, kw_only=True):
    """``session/end-seed``: the boundary after a constructor seed (only the Session writes it)."""

    inherited: Literal[True] | UnsetType = UNSET  #: present on a fork child's cut


class ApprovalAsked(Wire, frozen=True, kw_only=True):
    """``approval/asked``: a tool call needs an approval decision."""

    id: str  #: the ask id (one ``approval/decided`` follows)
    tool_name: str  #: the tool being asked about
    call_id: str | UnsetType = UNSET  #: the call, if any
    reason: str | UnsetType = UNSET  #: why approval is needed
    #: beyond DSH: lowercase hex sha256 of the call's raw argument string (the grant's binding)
    args_digest: str | UnsetType = UNSET
    #: beyond DSH: ``pre-execute`` when asked by the tools pipeline before the body could start
    #: (an undecided or refused ask of that stage proves the body never ran); absent otherwise
    stage: Literal["pre-execute"] | UnsetType = UNSET


class ApprovalDecided(Wire, frozen=True, kw_only=True):
    """``approval/decided``: the outcome of one ask."""

    id: str  #: the ask id
    outcome: Literal["allowed-once", "rejected", "cancelled", "unavailable"]  #: the decision
    #: beyond DSH, set on a deferred decision (D19): the call it binds, with its ``argsDigest``,
    call_id: str | UnsetType = UNSET
    args_digest: str | UnsetType = UNSET
    #: who/where the decision came from (e.g. ``dsh approvals decide by ann@host (pid 7)``),
    decided_by: str | UnsetType = UNSET
    #: and the person's optional reason
    reason: str | UnsetType = UNSET


class ApprovalPolicyChanged(Wire, frozen=True, kw_only=True):
    """``approval/policy``: the approval policy in force (last one wins)."""

    policy: Literal["ask", "never"]  #: the policy
    source: Literal["delegation"] | UnsetType = UNSET  #: set when inherited by delegation


_Text = Annotated[str, msgspec.Meta(min_length=1)]
#: whole milliseconds are written as integers, as DSH writes them
_Delay = Annotated[int, msgspec.Meta(ge=0)] | Annotated[float, msgspec.Meta(ge=0)]


class LlmRetryData(Wire, frozen=True, kw_only=True):
    """``llm/retry`` (DSH ``LlmRetryEventData``): one model-request retry was scheduled.

    Written by ``llm-retry`` before its wait; non-surface (the model never sees
    it). Normal mode carries ``max_retries``; always mode omits it (unbounded).
    """

    retry_id: _Text  #: shared by every retry of one step's chain
    turn: PositiveInt  #: the turn of the failed request
    step: PositiveInt  #: the step of the failed request
    provider: _Text  #: the route that served the failed request
    mode: Literal["normal", "always"]  #: the provider policy's mode
    policy_key: _Text  #: canonical key of the resolved provider policy
    retry: PositiveInt  #: 1 for the first retry of this chain
    max_retries: NonNegativeInt | UnsetType = UNSET  #: normal mode's budget
    delay_ms: _Delay  #: the scheduled wait in milliseconds
    failure: LlmFailure  #: the failure being retried, verbatim

    def __post_init__(self) -> None:
        if self.mode == "normal" and self.max_retries is UNSET:
            raise ValueError("a normal-mode llm/retry needs maxRetries")
        if self.mode == "always" and self.max_retries is not UNSET:
            raise ValueError("an always-mode llm/retry has no maxRetries")


class LlmRetryStartedData(Wire, frozen=True, kw_only=True):
    """``llm/retry-started``: the wait of one ``llm/retry`` completed; the request follows."""

    retry_id: _Text  #: the scheduled retry's id
    turn: PositiveInt  #: its turn
    step: PositiveInt  #: its step
    retry: PositiveInt  #: its retry number


# --- the registry --------------------------------------------------------------------------


class EventTypeSpec(NamedTuple):
    """What the registry knows about one event type."""

    type: str  #: the event type
    data_type: builtins.type[msgspec.Struct] | None  #: data Struct, or None for opaque frozen JSON
    surface: bool  #: surface-eligible (must carry surfaceOp)


_REGISTRY: dict[str, EventTypeSpec] = {}

#: The three core surface types of the spec (DSH v3's ``system/message`` is also eligible).
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
)

for _type, _data, _surface in _CORE:
    register_event_type(_type, _data, surface=_surface)
for _type in sorted(DSH_V3_KNOWN_EVENT_TYPES):
    if _type not in _REGISTRY:
        register_event_type(_type, None)


# --- data coercion (append and decode share it) --------------------------------------------

_MESSAGE_ROLES: Final = {
    "user/message": "user",
    "assistant/message": "assistant",
    "tool/result": "user",
    "system/message": "system",
}


def _check_message_shape(type: str, data: Any, subject: str) -> None:
    """The message-shape checks of DSH's seed validation, with its exact texts.

    Run before the typed conversion so a malformed message is reported in
    terms of the message, not of msgspec's type paths.
    """
    if type == "user/message":
        message = data
    else:
        if not isinstance(data, Mapping):
            raise InvalidSessionEventError(f"{subject} data must be an object", event_type=type)
        message = data.get("message")
    if not isinstance(message, Mapping):
        raise InvalidSessionEventError(f"{subject} lacks an identified message", event_type=type)
    mid = message.get("id")
    if not isinstance(mid, str) or not mid:
        raise InvalidSessionEventError(f"{subject} lacks an identified message", event_type=type)
    role = _MESSAGE_ROLES[type]
    if message.get("role") != role:
        raise InvalidSessionEventError(
            f'{subject} message must have role "{role}"', event_type=type
        )
    source = message.get("source")
    if (
        not isinstance(source, Mapping)
        or not isinstance(source.get("kind"), str)
        or not source.get("kind")
    ):
        raise InvalidSessionEventError(f"{subject} message has invalid source", event_type=type)
    content = message.get("content")
    if not isinstance(content, list | tuple):
        raise InvalidSessionEventError(f"{subject} message has invalid content", event_type=type)
    if type == "assistant/message":
        if (
            source.get("kind") != "model"
            or not isinstance(source.get("provider"), str)
            or not source.get("provider")
            or not isinstance(source.get("model"), str)
            or not source.get("model")
        ):
            raise InvalidSessionEventError(
                f"{subject} message must have model source", event_type=type
            )
    elif type == "tool/result":
        call_id = source.get("callId")
        if source.get("kind") != "tool" or not isinstance(call_id, str) or not call_id:
            raise InvalidSessionEventError(
                f"{subject} message must have tool source", event_type=type
            )
        if (
            len(content) != 1
            or not isinstance(content[0], Mapping)
            or content[0].get("type") != "tool-result"
        ):
            raise InvalidSessionEventError(
                f"{subject} message must contain one tool-result block", event_type=type
            )
        if content[0].get("toolCallId") != call_id:
            raise InvalidSessionEventError(
                f"{subject} message has mismatched tool call ids", event_type=type
            )


# --- DSH v3's admission of system/message (payload.ts ``assertSystem``) ---------------------
#
# DSH refuses a whole v3 log holding a system/message it would not have written: data keys
# exactly {turn, step, message}, a message of exactly {id, role, source, content} with role
# "system" and a plugin source, and the released rules for its content and plugin source. The
# reader applies this before the torn-tail rule (a refused row is never a droppable tail), and
# append applies it so this harness never writes a row DSH cannot open.

_PLUGIN_FORMS: Final = ("instructions", "catalog", "snapshot", "notice", "relay", "recall")
_IMAGE_MEDIA: Final = ("image/png", "image/jpeg", "image/webp", "image/gif")


class _Shape(Exception):
    """Internal: the first rule a value breaks."""


def _exact_keys(
    value: Any, required: tuple[str, ...], optional: tuple[str, ...], label: str
) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _Shape(f"{label} must be an object")
    for key in required:
        if key not in value:
            raise _Shape(f"{label} lacks required field {key}")
    for key in value:
        if key not in required and key not in optional:
            raise _Shape(f"{label} has unexpected field {key}")
    return value


def _nonempty_str(value: Any, label: str) -> None:
    if not isinstance(value, str) or not value:
        raise _Shape(f"{label} must be a non-empty string")


def _count(value: Any, label: str, *, positive: bool = False) -> None:
    if not is_safe_int(value) or value < (1 if positive else 0):
        raise _Shape(f"{label} must be a {'positive' if positive else 'non-negative'} integer")


def _check_content_shape(blocks: Any, label: str) -> None:
    """DSH's released content rules: known block types are closed, any other is opaque."""
    if not isinstance(blocks, list | tuple):
        raise _Shape(f"{label} must be an array")
    for index, block in enumerate(blocks):
        where = f"{label}[{index}]"
        if not isinstance(block, Mapping):
            raise _Shape(f"{where} must be an object")
        kind = block.get("type")
        if kind in ("text", "reasoning"):
            _exact_keys(block, ("type", "text"), (), where)
            if not isinstance(block["text"], str):
                raise _Shape(f"{where} text must be a string")
        elif kind == "image":
            _exact_keys(block, ("type", "attachment"), (), where)
            attachment = _exact_keys(
                block["attachment"],
                ("attachmentId", "mediaType", "bytes", "width", "height"),
                ("name", "originalDimensions"),
                f"{where} attachment",
            )
            _nonempty_str(attachment["attachmentId"], f"{where} attachmentId")
            if attachment["mediaType"] not in _IMAGE_MEDIA:
                raise _Shape(f"{where} mediaType must be one of {', '.join(_IMAGE_MEDIA)}")
            _count(attachment["bytes"], f"{where} bytes")
            _count(attachment["width"], f"{where} width", positive=True)
            _count(attachment["height"], f"{where} height", positive=True)
        elif kind == "tool-call":
            _exact_keys(block, ("type", "id", "name", "arguments"), (), where)
            _nonempty_str(block["id"], f"{where} id")
            _nonempty_str(block["name"], f"{where} name")
            if not isinstance(block["arguments"], str):
                raise _Shape(f"{where} arguments must be a string")
        elif kind == "tool-result":
            _exact_keys(block, ("type", "toolCallId", "content"), ("isError",), where)
            _nonempty_str(block["toolCallId"], f"{where} toolCallId")
            _check_content_shape(block["content"], f"{where} content")
            if "isError" in block and not isinstance(block["isError"], bool):
                raise _Shape(f"{where} isError must be a boolean")
        else:
            _nonempty_str(kind, f"{where} type")


def _check_plugin_source(source: Mapping[str, Any], label: str) -> None:
    optional: tuple[str, ...] = ("form", "sections", "summary")
    if source.get("plugin") == "compact":
        optional += ("compactionId", "sourceCommandId")
    _exact_keys(source, ("kind", "plugin"), optional, label)
    _nonempty_str(source["plugin"], f"{label} plugin")
    if source["plugin"] == "compact":
        _nonempty_str(source.get("compactionId"), f"{label} compactionId")
    form = source.get("form")
    if form is None and "form" not in source:
        return
    if form not in _PLUGIN_FORMS:
        raise _Shape(f"{label} form must be one of {', '.join(_PLUGIN_FORMS)}")
    if form == "snapshot":
        sections = source.get("sections")
        if not isinstance(sections, list | tuple):
            raise _Shape(f"{label} sections must be an array")
        for index, section in enumerate(sections):
            item = _exact_keys(section, ("name", "text"), (), f"{label} sections[{index}]")
            _nonempty_str(item["name"], f"{label} sections[{index}] name")
            if not isinstance(item["text"], str):
                raise _Shape(f"{label} sections[{index}] text must be a string")
    elif "sections" in source:
        raise _Shape(f"{label} sections require snapshot form")
    if form == "notice":
        if not isinstance(source.get("summary"), str):
            raise _Shape(f"{label} summary must be a string")
    elif "summary" in source:
        raise _Shape(f"{label} summary requires notice form")


def system_message_problem(data: Any) -> str | None:
    """Why DSH v3 refuses this ``system/message`` data (plain JSON), or None when it admits it."""
    try:
        body = _exact_keys(data, ("turn", "step", "message"), (), "system/message data")
        _count(body["turn"], "system/message turn", positive=True)
        _count(body["step"], "system/message step", positive=True)
        message = _exact_keys(
            body["message"], ("id", "role", "source", "content"), (), "system message"
        )
        if not isinstance(message["id"], str) or not message["id"] or message["role"] != "system":
            raise _Shape("system message requires an id and system role")
        source = message["source"]
        if (
            not isinstance(source, Mapping)
            or source.get("kind") != "plugin"
            or not isinstance(source.get("plugin"), str)
            or not source.get("plugin")
        ):
            raise _Shape("system message requires plugin source")
        _check_content_shape(message["content"], "system message content")
        _check_plugin_source(source, "system message source")
    except _Shape as shape:
        return str(shape)
    return None


def _check_legacy(type: str, data: Any, subject: str) -> None:
    if type == "request/header-delta":
        raise InvalidSessionEventError(
            f"{subject} uses unsupported legacy request/header-delta format", event_type=type
        )
    if type == "request/header" and isinstance(data, Mapping) and data.get("reason") == "fallback":
        raise InvalidSessionEventError(
            f'{subject} uses unsupported legacy request/header reason "fallback"', event_type=type
        )
    if type == "request/header" and isinstance(data, Mapping):
        header = data.get("header")
        if isinstance(header, Mapping) and "system" in header:
            # A v3 reader refuses a log holding it, so it must not be written in the first place.
            raise InvalidSessionEventError(
                f"{subject} carries header.system, which DSH v3 retired: the system prompt is "
                "a system/message event (append one instead; the request header holds config, "
                "adapterDefaults and tools only)",
                event_type=type,
            )


def _refuse_system_message(plain: Any, subject: str) -> None:
    problem = system_message_problem(plain)
    if problem is not None:
        raise InvalidSessionEventError(
            f"{subject} is refused by DSH v3 (so this harness neither reads nor writes it): "
            f"{problem}",
            event_type="system/message",
        )


def coerce_event_data(
    type: str, data: Any, *, subject: str | None = None, ignorable: bool = False
) -> Any:
    """Validate ``data`` for ``type`` and return the immutable value the log stores.

    ``data`` may be the registered Struct or the equivalent plain JSON. The
    result is detached from the caller's object (later mutation of the input
    changes nothing) and deeply frozen. ``subject`` prefixes error messages
    (default ``session event "<type>"``).
    """
    spec = _REGISTRY.get(type)
    if spec is not None and spec.data_type is not None and builtins.type(data) is spec.data_type:
        fast = _coerce_typed_fast(type, data, spec.data_type)
        if fast is not None:
            return fast
    subject = subject if subject is not None else f'session event "{type}"'
    try:
        plain = to_json_builtins(data, f"{subject} data")
    except NonJsonValueError as exc:
        raise InvalidSessionEventError(
            f"{subject} carries non-JSON-serializable data: {exc.problem} at {exc.path}",
            event_type=type,
        ) from exc
    return _coerce_plain(type, plain, subject, ignorable)


# --- the typed fast path --------------------------------------------------------------------
#
# Appending a Struct of the registered type is the hot path (the loop does it for every
# event). msgspec's C encoder/decoder round trip validates every declared type and
# returns a fresh, tuple-based copy in ~2 us; what it cannot see is the lossless-JSON
# domain *inside* open values (FrozenJson fields, floats): it would write NaN as null
# and int keys as strings. So a check-only scan first visits exactly the fields whose
# declared type can hold such values (computed once per Struct type), and only those.
# Any doubt (a problem found, an exotic value, a lone surrogate) returns None and the
# caller takes the general path, which produces the precise error message.


class _Doubt(Exception):
    """Internal: the fast path declines; the general path decides (and explains)."""


_SCAN_PLAN: dict[builtins.type, tuple[str, ...]] = {}
_ROUND_TRIP: dict[builtins.type, msgspec.json.Decoder[Any]] = {}
#: Types whose values never need scanning: JSON-safe scalars and Structs with an empty plan.
_CLOSED: set[builtins.type] = {str, bool, builtins.type(None)}


def _type_needs_scan(info: msgspec.inspect.Type, seen: set[builtins.type]) -> bool:
    mi = msgspec.inspect
    if isinstance(info, mi.StrType | mi.BoolType | mi.LiteralType | mi.NoneType):
        return False
    if isinstance(info, mi.IntType):
        # Safe when the declared bounds (checked by the decoder) are within ±(2**53-1).
        low = info.ge if info.ge is not None else info.gt
        high = info.le if info.le is not None else info.lt
        return not (
            low is not None
            and high is not None
            and low >= -MAX_SAFE_INTEGER
            and high <= MAX_SAFE_INTEGER
        )
    if isinstance(info, mi.StructType):
        if info.cls in seen:
            return False
        seen.add(info.cls)
        return any(_type_needs_scan(f.type, seen) for f in info.fields)
    if isinstance(info, mi.VarTupleType | mi.ListType):
        return _type_needs_scan(info.item_type, seen)
    if isinstance(info, mi.UnionType):
        return any(_type_needs_scan(t, seen) for t in info.types)
    return True  # FloatType, CustomType (FrozenJson), AnyType, everything else


def _scan_plan(tp: builtins.type) -> tuple[str, ...]:
    plan = _SCAN_PLAN.get(tp)
    if plan is None:
        info = msgspec.inspect.type_info(tp)
        assert isinstance(info, msgspec.inspect.StructType)
        plan = tuple(f.name for f in info.fields if _type_needs_scan(f.type, {tp}))
        _SCAN_PLAN[tp] = plan
        if not plan:
            _CLOSED.add(tp)
    return plan


def _scan(value: Any) -> None:
    """Check-only visit of the parts of a typed payload the round trip cannot vouch for."""
    tp = builtins.type(value)
    plan = _SCAN_PLAN.get(tp)
    if plan is None:
        if isinstance(value, msgspec.Struct):
            plan = _scan_plan(tp)
        elif tp is tuple or tp is list:
            for item in value:
                if builtins.type(item) not in _CLOSED:
                    _scan(item)
            return
        else:
            try:
                check_json(value, "value")
            except NonJsonValueError as exc:
                raise _Doubt from exc
            return
    for attr in plan:
        item = getattr(value, attr)
        if item is not UNSET and builtins.type(item) not in _CLOSED:
            _scan(item)


def _coerce_typed_fast(type: str, data: Any, data_type: builtins.type) -> Any:
    """The validated frozen copy of a typed payload, or None when the general path must decide."""
    decoder = _ROUND_TRIP.get(data_type)
    if decoder is None:
        decoder = _ROUND_TRIP[data_type] = msgspec.json.Decoder(data_type, dec_hook=_dec_hook)
    try:
        _scan(data)
        result = decoder.decode(_ENCODER.encode(data))
    except (_Doubt, msgspec.ValidationError, msgspec.DecodeError, UnicodeEncodeError, TypeError):
        return None
    except NonJsonValueError:
        return None
    if type == "tool/result" and not _tool_result_consistent(result):
        return None
    if type == "request/header" and getattr(result.header, "system", UNSET) is not UNSET:
        return None  # retired in v3: the general path refuses it with its message
    if type == "system/message" and system_message_problem(
        msgspec.to_builtins(result, enc_hook=_enc_hook)
    ):
        return None  # the general path refuses it with its message
    return result


def _tool_result_consistent(data: Any) -> bool:
    message = getattr(data, "message", None)
    if not isinstance(message, ToolResultMessage) or len(message.content) != 1:
        return False
    block = message.content[0]
    return isinstance(block, ToolResultBlock) and block.tool_call_id == message.source.call_id


def _coerce_plain(type: str, plain: Any, subject: str, ignorable: bool) -> Any:
    """Coerce already validated plain JSON (fresh, owned) into the stored value."""
    _check_legacy(type, plain, subject)
    spec = _REGISTRY.get(type)
    if spec is None:
        if not ignorable:
            raise UnknownEventTypeError(
                f'{subject}: event type "{type}" is unknown to this harness and not marked '
                "ignorable; register it with register_event_type() (or mark the event "
                "ignorable: true if readers may keep it without understanding it)",
                event_type=type,
            )
        return freeze_json(plain, f"{subject} data")
    if spec.data_type is None:
        return freeze_json(plain, f"{subject} data")
    if type in _MESSAGE_ROLES:
        _check_message_shape(type, plain, subject)
    if type == "system/message":
        _refuse_system_message(plain, subject)
    try:
        return msgspec.convert(plain, spec.data_type, dec_hook=_dec_hook)
    except msgspec.ValidationError as exc:
        raise InvalidSessionEventError(
            f"{subject} data does not match {spec.data_type.__qualname__}: {exc}",
            event_type=type,
        ) from exc


# --- surface marker parsing ----------------------------------------------------------------


def parse_surface_marker(
    type: str, surface_op: Any, source_event_seqs: Any, *, where: str | None = None
) -> tuple[SurfaceOp | UnsetType, tuple[int, ...] | UnsetType]:
    """Check the event-local shape of the surface marker and return it typed.

    This is the shape check only (eligibility, marker form, source list form);
    whether a replace range exists is the surface's job. ``surface_op`` and
    ``source_event_seqs`` are plain values or ``UNSET``.
    """
    spec = _REGISTRY.get(type)
    surface = spec is not None and spec.surface
    if surface and surface_op == "append" and source_event_seqs is UNSET:
        return "append", UNSET  # the common case, decided without building a label
    if not surface and surface_op is UNSET and source_event_seqs is UNSET:
        return UNSET, UNSET
    label = where or f'session event "{type}"'
    if not surface:
        if surface_op is not UNSET:
            raise InvalidSessionEventError(
                f"{label} is not surface-eligible and cannot carry surfaceOp", event_type=type
            )
        if source_event_seqs is not UNSET:
            raise InvalidSessionEventError(
                f"{label} is not surface-eligible and cannot carry sourceEventSeqs",
                event_type=type,
            )
        return UNSET, UNSET
    op: SurfaceOp
    if surface_op is UNSET or surface_op is None:
        raise InvalidSessionEventError(
            f"{label} is surface-eligible and requires a surfaceOp marker", event_type=type
        )
    if surface_op == "append":
        op = "append"
    elif isinstance(surface_op, ReplaceOp):
        op = surface_op
    elif isinstance(surface_op, Mapping):
        op = _parse_replace(type, surface_op, label)
    else:
        raise InvalidSessionEventError(f"{label} carries an invalid surfaceOp", event_type=type)
    sources: tuple[int, ...] | UnsetType = UNSET
    if source_event_seqs is not UNSET:
        if not isinstance(source_event_seqs, list | tuple):
            raise InvalidSessionEventError(
                f"{label}: sourceEventSeqs must be an array when present", event_type=type
            )
        for s in source_event_seqs:
            if not is_safe_int(s) or s < 0:
                raise InvalidSessionEventError(
                    f"{label} sourceEventSeqs must densely contain non-negative safe integers",
                    event_type=type,
                )
        sources = tuple(source_event_seqs)
    return op, sources


def _parse_replace(type: str, op: Mapping[str, Any], label: str) -> ReplaceOp:
    keys = set(op)
    if keys == {"op", "start", "end"}:
        start, end = op["start"], op["end"]
    elif keys == {"op", "startSeq", "endSeq"}:
        # DSH v3's spelling, which is also what this build writes.
        start, end = op["startSeq"], op["endSeq"]
    else:
        raise InvalidSessionEventError(
            f"{label} carries an invalid replace surfaceOp", event_type=type
        )
    if (
        op["op"] != "replace"
        or not is_safe_int(start)
        or not is_safe_int(end)
        or start < 0
        or end < 0
    ):
        raise InvalidSessionEventError(
            f"{label} carries an invalid replace surfaceOp", event_type=type
        )
    return ReplaceOp(start=start, end=end)


# --- wire codec ----------------------------------------------------------------------------


class _RawEnvelope(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    type: str
    seq: int
    time: int
    data: msgspec.Raw
    source_event_seqs: Any = UNSET
    surface_op: Any = UNSET
    ignorable: Any = UNSET


class _PlainEnvelope(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    type: str
    seq: int
    time: int
    data: Any
    source_event_seqs: Any = UNSET
    surface_op: Any = UNSET
    ignorable: Any = UNSET


_ENVELOPE_DECODER: Final = msgspec.json.Decoder(_RawEnvelope)
_ENCODER: Final = msgspec.json.Encoder(enc_hook=_enc_hook)
_SURROGATE_RE: Final = re.compile("[\ud800-\udfff]")


def _envelope_error(detail: str, where: str) -> InvalidSessionEventError:
    return InvalidSessionEventError(f"{where} has an invalid event envelope: {detail}")


def _check_envelope(env: _RawEnvelope | _PlainEnvelope, where: str) -> None:
    if not is_safe_int(env.seq) or env.seq < 0:
        raise _envelope_error(f"seq must be a non-negative safe integer, got {env.seq!r}", where)
    if not is_safe_int(env.time):
        raise _envelope_error(f"time must be a safe integer, got {env.time!r}", where)
    if env.ignorable is not UNSET and env.ignorable is not True:
        raise _envelope_error(f"ignorable must be exactly true, got {env.ignorable!r}", where)


def decode_event(
    raw: bytes | str | Mapping[str, Any],
    *,
    where: str = "session event",
    parsed_plain: bool = False,
    exact: bool = False,
) -> SessionEvent:
    """Decode one event from JSON text or an already parsed mapping (two-phase).

    Phase 1 checks the envelope (known keys only; ``seq`` a non-negative safe
    integer; ``time`` a safe integer; ``data`` present; ``ignorable`` exactly
    ``true``). Phase 2 decodes ``data`` through the registry. Raises
    :class:`UnknownEventTypeError` for an unregistered type without
    ``ignorable: true``, and :class:`InvalidSessionEventError` otherwise;
    messages start with ``where`` (e.g. ``seed event at index 3``).

    ``parsed_plain=True`` vouches that ``raw`` is a ``dict`` just produced by a
    strict JSON parser with JavaScript number semantics (integral floats already
    ints, no non-finite numbers) whose ``data`` holds no integer outside
    ±(2**53-1), and that the caller hands it over (nothing else holds it): its
    ``data`` is then used as is instead of being walked and copied by
    :func:`to_json_builtins`, which on such a value would only copy it. A reader
    that cannot vouch (it saw a long digit run in the row) leaves it False.

    The returned event keeps the record as :attr:`SessionEvent.wire` when its
    typed fields hold less than the record (compared as JSON values, so key
    order alone never counts); ``exact=True`` (a mapping built in a key order
    that matters, e.g. DSH's repair closers) also keeps it when only the order
    differs.
    """
    plain_data: Any
    record: Any = None
    if isinstance(raw, bytes | str | bytearray | memoryview):
        try:
            env: _RawEnvelope | _PlainEnvelope = _ENVELOPE_DECODER.decode(raw)
        except msgspec.ValidationError as exc:
            raise _envelope_error(str(exc), where) from exc
        except msgspec.DecodeError as exc:
            # msgspec refuses escaped lone surrogates ("\ud800"), which JavaScript writers
            # emit; the stdlib parser accepts them, so retry through the mapping path.
            try:
                parsed = json.loads(raw)
            except (ValueError, TypeError):
                raise InvalidSessionEventError(f"{where} is not valid JSON: {exc}") from exc
            if not isinstance(parsed, dict):
                raise _envelope_error("the record is not a JSON object", where) from exc
            return decode_event(parsed, where=where)
        _check_envelope(env, where)
        assert isinstance(env, _RawEnvelope)
        try:
            plain_data = msgspec.json.decode(env.data)
            record = msgspec.json.decode(raw)
        except msgspec.DecodeError as exc:  # pragma: no cover - envelope decode checked it
            raise _envelope_error(f"data is not JSON: {exc}", where) from exc
    elif isinstance(raw, Mapping):
        try:
            env = msgspec.convert(dict(raw), _PlainEnvelope)
        except msgspec.ValidationError as exc:
            raise _envelope_error(str(exc), where) from exc
        _check_envelope(env, where)
        try:
            if parsed_plain and type(raw) is dict:
                plain_data = env.data
                record = raw
            else:
                plain_data = to_json_builtins(env.data, f"{where} data")
                record = {
                    key: plain_data if key == "data" else to_json_builtins(value, where)
                    for key, value in raw.items()
                }
        except NonJsonValueError as exc:
            raise InvalidSessionEventError(
                f"{where} is not losslessly JSON-serializable: {exc.problem} at {exc.path}",
                event_type=env.type,
                seq=env.seq,
            ) from exc
    else:
        raise TypeError(f"decode_event expects bytes, str or a mapping, got {type(raw)!r}")
    subject = f'{where} "{env.type}" (seq {env.seq})'
    ignorable = env.ignorable is True
    try:
        data = _coerce_plain(env.type, plain_data, subject, ignorable)
        if not is_known_event_type(env.type):
            # Unknown ignorable records keep their metadata opaque and never join the surface.
            return _keep_wire(
                SessionEvent(
                    type=env.type,
                    seq=env.seq,
                    time=env.time,
                    data=data,
                    ignorable=True,
                ),
                record,
                exact,
            )
        surface_op, sources = parse_surface_marker(
            env.type,
            _plain_marker(env.surface_op),
            _plain_marker(env.source_event_seqs),
            where=subject,
        )
    except InvalidSessionEventError as exc:
        exc.seq = env.seq
        raise
    return _keep_wire(
        SessionEvent(
            type=env.type,
            seq=env.seq,
            time=env.time,
            data=data,
            source_event_seqs=sources,
            surface_op=surface_op,
            ignorable=True if ignorable else UNSET,
        ),
        record,
        exact,
    )


def _keep_wire(event: SessionEvent, record: Any, exact: bool) -> SessionEvent:
    """``event``, carrying ``record`` as its wire form when the typed fields would lose it."""
    typed = encode_event(event)
    wire = _json_bytes(record)
    if wire == typed:
        return event  # the common case: the record is what this build writes
    if not exact:
        try:
            same = msgspec.json.decode(typed) == record
        except msgspec.DecodeError:  # an escaped lone surrogate
            same = json.loads(typed) == record
        if same:
            return event  # only the key order differs
    return msgspec.structs.replace(event, wire=wire)


def _json_bytes(value: Any) -> bytes:
    """Compact JSON as a JavaScript writer prints it (a lone surrogate escaped, not an error)."""
    try:
        return _ENCODER.encode(value)
    except UnicodeEncodeError:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        return _SURROGATE_RE.sub(lambda m: f"\\u{ord(m.group()):04x}", text).encode("utf-8")


def _plain_marker(value: Any) -> Any:
    if isinstance(value, msgspec.Raw):  # pragma: no cover - defensive
        return msgspec.json.decode(value)
    return value


def decode_events(lines: Iterator[bytes | str] | list[bytes] | list[str]) -> list[SessionEvent]:
    """Decode a sequence of JSON event records (no contiguity check; see ``Session.restore``)."""
    return [decode_event(line) for line in lines]


def encode_event(event: SessionEvent) -> bytes:
    """Encode one event as compact JSON (camelCase keys, absent optionals omitted).

    Byte-compatible with a JavaScript writer: non-ASCII kept raw, and a lone
    surrogate escaped as ``\\udXXX`` instead of failing UTF-8 encoding. An
    event that carries its :attr:`~SessionEvent.wire` form is that form.
    """
    if event.wire is not UNSET:
        return event.wire
    try:
        return _ENCODER.encode(event)
    except UnicodeEncodeError:
        return _json_bytes(event_to_builtins(event))


def to_builtins(value: object) -> Any:
    """Any event payload or message as plain JSON values (frozen mappings included).

    What views print: ``msgspec.to_builtins`` alone refuses the read-only
    mappings a frozen payload holds (a runtime-context snapshot's ``sections``).
    """
    return msgspec.to_builtins(value, enc_hook=_enc_hook)


def event_to_builtins(event: SessionEvent) -> dict[str, Any]:
    """The event as plain JSON values (dicts, lists, scalars), e.g. for comparisons."""
    out: dict[str, Any]
    if event.wire is not UNSET:
        try:
            out = msgspec.json.decode(event.wire)
        except msgspec.DecodeError:  # an escaped lone surrogate: the stdlib parser reads it
            out = json.loads(event.wire)
        return out
    try:
        out = msgspec.json.decode(_ENCODER.encode(event))
    except UnicodeEncodeError:  # lone surrogates: the stdlib codec carries them
        out = json.loads(json.dumps(msgspec.to_builtins(event, enc_hook=_enc_hook)))
    return out

"""The core vocabulary: the typed ``data`` Struct of each core event type."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import UNSET, UnsetType

from dsh_host._jsonsafe import (
    FrozenJson,
)
from dsh_host._session.messages import (
    AssistantMessage,
    AssistantStreamRecord,
    DeveloperMessage,
    EpochHeader,
    LlmFailure,
    NonNegativeInt,
    PositiveInt,
    StreamChunk,
    SystemMessage,
    TokenUsage,
    ToolResultMessage,
    Wire,
)

from .reasons import _AnyTurnEndReason

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


class DeveloperMessageData(Wire, frozen=True, kw_only=True):
    """``developer/message`` (DSH format v4 only): a developer node on the surface.

    ``header_seq`` (``headerSeq``) names the ``request/header`` whose tool definitions the
    message's ``tool-addition`` blocks refer to; DSH requires it exactly when there are
    additions (checked at the JSONL v4 boundary, docs/format.md §10.1).
    """

    turn: PositiveInt  #: the turn number
    step: PositiveInt  #: the step number
    header_seq: NonNegativeInt | UnsetType = UNSET  #: the request header of the additions
    message: DeveloperMessage  #: the developer message (empty content projects nothing)


class ToolCallData(Wire, frozen=True, kw_only=True):
    """``tool/call``: the scheduler began processing a call (appended before pre-execute)."""

    turn: PositiveInt  #: the turn number
    step: PositiveInt  #: the step number
    call_id: str  #: pairs the call with its ``tool/result``
    name: str  #: tool name
    arguments: str  #: the model's raw JSON string, unparsed


class ToolErrorData(Wire, frozen=True, kw_only=True):
    """Internal failure identity of a tool result (e.g. ``TOOL_OUTCOME_UNKNOWN``)."""

    name: str  #: error class name, e.g. ``ToolOutcomeUnknownError``
    code: str  #: stable code, e.g. ``TOOL_OUTCOME_UNKNOWN``


class ToolResultData(Wire, frozen=True, kw_only=True):
    """``tool/result``: the model-facing result of one call."""

    turn: PositiveInt  #: the turn number
    step: PositiveInt  #: the step number
    message: ToolResultMessage  #: what the model sees
    error: ToolErrorData | UnsetType = UNSET  #: internal failure identity
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
    #: beyond DSH, the context the call was asked in (a decision holds only in the same one):
    #: the sandbox mode and network of the session's terms, the sha256 of the tool's definition
    #: (name, description, parameters) and of the composition's rows
    sandbox_mode: str | UnsetType = UNSET
    network: str | UnsetType = UNSET
    tool_digest: str | UnsetType = UNSET
    composition_digest: str | UnsetType = UNSET


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
    #: beyond DSH, on a deferred decision: the context it was made in (as ``approval/asked``)
    sandbox_mode: str | UnsetType = UNSET
    network: str | UnsetType = UNSET
    tool_digest: str | UnsetType = UNSET
    composition_digest: str | UnsetType = UNSET


class ModelRoute(Wire, frozen=True, kw_only=True):
    """``run/terms``' model: the route the agent requests (never an endpoint or a key)."""

    provider: str  #: the provider route (``deepseek-official``, ``scripted``, ``demo``, ...)
    model: str  #: the model name on that route
    #: the spec that builds the model on its own (``openai-compatible:M``,
    #: ``scripted:/abs/path.yml``, ``demo``); absent when a composition's row configured it
    spec: str | UnsetType = UNSET


class SandboxTerms(Wire, frozen=True, kw_only=True):
    """``run/terms``' sandbox: the tools' file-effect mode and the network policy."""

    mode: str  #: ``read-only``, ``workspace-write`` or ``danger-full-access``
    network: str  #: ``deny`` or ``allow``


class ApprovalTerms(Wire, frozen=True, kw_only=True):
    """``run/terms``' approval: the policy and what an unanswered ask becomes."""

    policy: str  #: ``ask`` or ``never``
    unanswered: str  #: ``fail`` or ``defer``


class CompositionTerms(Wire, frozen=True, kw_only=True):
    """``run/terms``' composition: its name and the SHA-256 of its rows (canonical JSON)."""

    name: str  #: the file it came from, a server's composition name, or ``python``
    digest: str  #: lowercase hex sha256 of the rows as loaded (before per-command flags)


class RunTerms(Wire, frozen=True, kw_only=True):
    """``run/terms`` (beyond DSH, written ``ignorable: true``): how the session runs.

    Appended when a session is created (``reason: created``) and whenever a command
    explicitly changes a term (``override``, with ``changed`` naming the terms) or a
    session that predates the record is first continued (``assumed``). Each event holds
    the whole terms; the last one is in force. ``by`` names the entry point.
    """

    reason: Literal["created", "override", "assumed"]  #: why this record was written
    by: str  #: the entry point that wrote it (``dsh run``, ``dsh serve``, ``Agent``, ...)
    model: ModelRoute | None  #: the model route (None: the session names no model)
    workspace: str | None  #: where the tools work (None: no tools row)
    sandbox: SandboxTerms | None  #: None: no tools row
    approval: ApprovalTerms | None  #: None: no approval row
    composition: CompositionTerms  #: the composition's identity
    changed: tuple[str, ...] | UnsetType = UNSET  #: ``override``: the terms it changed


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

"""The messages the model sees, and the stream records they are assembled from.

These are the value types shared by the session log, the LLM adapters and the
agent loop. They are frozen msgspec Structs whose JSON field names are DSH's
camelCase names (``toolCallId``, ``isError``, ``replayState``...), so a log
written here and one written by DSH are the same JSON. Optional fields default
to ``UNSET`` and are omitted on encode (never ``null``); containers are tuples,
so a message cannot be mutated after it was appended.

Tagged unions (msgspec ``tag_field``):

- :data:`ContentBlock` on ``type``: ``text | reasoning | image | tool-call | tool-result``,
  and any other non-empty type kept as an :data:`Opaque` frozen mapping (DSH's block map is
  merge-extensible: ``file``, plugin blocks);
- :data:`MessageSource` on ``kind``: ``user | plugin | model | tool``; a ``user/message``
  source of any other non-empty kind (``skill-catalog``, ``agent-instructions``, ``cron``...)
  is kept as an :data:`Opaque` frozen mapping;
- :data:`StreamChunk` on ``type``: ``block-start | text-delta | reasoning-delta |
  tool-call-delta | block-end | usage | finish``;
- :data:`FinishReason` on ``kind``: ``stop | tool-calls | max-tokens | aborted | error``;
- :data:`AssistantStreamRecord` on ``type``: ``chunk | text-chunks | reasoning-chunks |
  tool-call-chunks`` (DSH v3's compact embedded stream on ``assistant/message``).

Open JSON payloads that belong to somebody else (an image ``attachment``, an
adapter's ``replayState``, a tool schema's ``parameters``) are typed
:data:`~dsh_host._jsonsafe.FrozenJson`: decoded as deeply frozen JSON.

Construction does not validate (msgspec never does); the session validates a
message when it is appended, by round-tripping it through these types.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal, TypeAlias

import msgspec
from msgspec import UNSET, Meta, UnsetType

from dsh_host._jsonsafe import MAX_SAFE_INTEGER, FrozenJson, freeze_json, json_dec_hook

__all__ = [
    "USAGE_KEYS",
    "AbortedFinish",
    "AdapterDefaults",
    "AssistantMessage",
    "AssistantStreamRecord",
    "BlockEndChunk",
    "BlockStartChunk",
    "ChunkRecord",
    "ContentBlock",
    "DeveloperMessage",
    "EpochHeader",
    "ErrorFinish",
    "FinishChunk",
    "FinishReason",
    "ImageBlock",
    "KnownContentBlock",
    "LlmCallConfig",
    "LlmFailure",
    "MaxTokensFinish",
    "Message",
    "MessageId",
    "MessageSource",
    "ModelSource",
    "NonNegativeInt",
    "Opaque",
    "PluginSource",
    "PositiveInt",
    "ReasoningBlock",
    "ReasoningChunksRecord",
    "ReasoningDeltaChunk",
    "SafeInt",
    "StopFinish",
    "StreamChunk",
    "SystemMessage",
    "TextBlock",
    "TextChunksRecord",
    "TextDeltaChunk",
    "TokenUsage",
    "ToolCallBlock",
    "ToolCallChunksRecord",
    "ToolCallDeltaChunk",
    "ToolCallsFinish",
    "ToolResultBlock",
    "ToolResultMessage",
    "ToolSchema",
    "ToolSource",
    "UsageChunk",
    "UserMessage",
    "UserSource",
    "Wire",
    "block_type",
    "new_message_id",
    "source_kind",
]

#: A message identity: a non-empty string, minted once (a UUID) and preserved everywhere.
MessageId = str

#: Non-negative safe integer (seq, index, token count).
NonNegativeInt = Annotated[int, Meta(ge=0, le=MAX_SAFE_INTEGER)]
#: Positive safe integer (turn and step numbers start at 1).
PositiveInt = Annotated[int, Meta(ge=1, le=MAX_SAFE_INTEGER)]
#: Safe integer, possibly negative (epoch ms may step backwards).
SafeInt = Annotated[int, Meta(ge=-MAX_SAFE_INTEGER, le=MAX_SAFE_INTEGER)]
_NonEmpty = Annotated[str, Meta(min_length=1)]


def new_message_id() -> MessageId:
    """Mint a fresh message id (a random UUID, as DSH does)."""
    return str(uuid.uuid4())


class Wire(msgspec.Struct, frozen=True, kw_only=True, rename="camel", gc=False):
    """Base of every wire type: immutable, camelCase on the wire, keyword-only.

    Optional fields use ``UNSET`` (always omitted on encode) rather than
    ``omit_defaults``, so a field whose value happens to equal its default
    (``role: "user"``) is still written.

    ``gc=False``: instances are immutable trees (frozen Structs, tuples, frozen
    JSON), so they cannot form reference cycles, and keeping a 100k-event log
    out of the cyclic garbage collector roughly doubles append throughput
    (``bench/session_append.py``). Subclasses must keep it that way: no field
    may hold a mutable object that could point back at its owner.
    """


# --- content blocks ------------------------------------------------------------------------


class TextBlock(Wire, frozen=True, kw_only=True, tag="text", tag_field="type"):
    """Visible text."""

    text: str  #: the text, verbatim


class ReasoningBlock(Wire, frozen=True, kw_only=True, tag="reasoning", tag_field="type"):
    """Model reasoning (thinking) text."""

    text: str  #: the reasoning text, verbatim


class ImageBlock(Wire, frozen=True, kw_only=True, tag="image", tag_field="type"):
    """An image; ``attachment`` is an opaque JSON record owned by the producer."""

    attachment: FrozenJson  #: opaque attachment reference (frozen JSON)


class ToolCallBlock(Wire, frozen=True, kw_only=True, tag="tool-call", tag_field="type"):
    """A tool invocation requested by the model."""

    id: str  #: the call id; pairs the call with its result
    name: str  #: the tool name as the model wrote it
    arguments: str  #: the model's raw JSON arguments string, never parsed here
    #: The id the provider sent, kept only when the harness replaced it (empty, or already
    #: used in the session): ``id`` is then a harness-minted one. ``providerId`` on the wire;
    #: DSH reads the block by its own keys and keeps this one.
    provider_id: str | UnsetType = UNSET


class ToolResultBlock(Wire, frozen=True, kw_only=True, tag="tool-result", tag_field="type"):
    """The result of one tool call, as the model sees it."""

    tool_call_id: str  #: the ``ToolCallBlock.id`` this answers
    content: tuple[ContentBlock, ...]  #: what the tool returned (text, images, ...)
    is_error: bool | UnsetType = UNSET  #: True when the call failed


#: A content block of a type this build models (type-tagged).
KnownContentBlock = TextBlock | ReasoningBlock | ImageBlock | ToolCallBlock | ToolResultBlock

#: A content block or message source of a kind this build does not model, kept verbatim as
#: deeply frozen JSON (a read-only mapping; ``block["type"]`` / ``source["kind"]`` is its
#: non-empty tag). DSH's ``ContentBlockMap`` and ``MessageSourceMap`` are merge-extensible
#: (``file`` blocks, ``skill-catalog`` / ``agent-instructions`` / ``cron`` sources, plugin
#: kinds), so an unknown kind is a valid value, never corruption: every match over blocks or
#: sources needs a default branch. Adapters skip opaque blocks, as DSH's do.
Opaque: TypeAlias = Mapping[str, Any]

if TYPE_CHECKING:
    #: One content block of a message: a modelled block, or an opaque one.
    ContentBlock: TypeAlias = KnownContentBlock | Opaque
else:

    class _OpenMeta(type):
        """Makes every value an instance, so msgspec accepts what the decode hook returns."""

        def __instancecheck__(cls, instance: object) -> bool:
            return True

    class ContentBlock(metaclass=_OpenMeta):
        """Annotation of an open content-block field (decoded through ``json_dec_hook``)."""

        @staticmethod
        def __json_decode__(obj: Any) -> Any:
            return _open_value(obj, "type", "content block", _BLOCK_TAGS)

    class _OpenUserSource(metaclass=_OpenMeta):
        """Annotation of ``UserMessage.source`` (decoded through ``json_dec_hook``)."""

        @staticmethod
        def __json_decode__(obj: Any) -> Any:
            return _open_value(obj, "kind", "message source", _SOURCE_TAGS)


# --- message sources -----------------------------------------------------------------------


class UserSource(Wire, frozen=True, kw_only=True, tag="user", tag_field="kind"):
    """A direct human prompt."""


class PluginSource(Wire, frozen=True, kw_only=True, tag="plugin", tag_field="kind"):
    """Context injected by a plugin (instructions, catalog, notice...)."""

    plugin: str  #: the plugin that produced the message
    form: str | UnsetType = UNSET  #: instructions|catalog|snapshot|notice|relay|recall
    sections: FrozenJson | UnsetType = UNSET  #: snapshot sections (opaque JSON)
    summary: str | UnsetType = UNSET  #: short notice summary (<= 120 chars)
    #: a compaction checkpoint (``plugin: "compact"``): the owning ``compaction/*`` transaction
    compaction_id: str | UnsetType = UNSET
    #: a compaction checkpoint a human command started: that command's id
    source_command_id: str | UnsetType = UNSET


class ModelSource(Wire, frozen=True, kw_only=True, tag="model", tag_field="kind"):
    """An assistant message produced by a model."""

    provider: _NonEmpty  #: the adapter route that produced it
    model: _NonEmpty  #: the provider's model id
    replay_state: FrozenJson | UnsetType = UNSET  #: adapter-private replay envelope


class ToolSource(Wire, frozen=True, kw_only=True, tag="tool", tag_field="kind"):
    """A tool result message."""

    call_id: _NonEmpty  #: the tool call this message answers


#: Where a message came from (kind-tagged), for the kinds this build models.
MessageSource = UserSource | PluginSource | ModelSource | ToolSource

if TYPE_CHECKING:
    _OpenUserSource: TypeAlias = MessageSource | Opaque


def _tags(*types: type[msgspec.Struct]) -> dict[str, type[msgspec.Struct]]:
    return {str(t.__struct_config__.tag): t for t in types}


_BLOCK_TAGS: Final = _tags(TextBlock, ReasoningBlock, ImageBlock, ToolCallBlock, ToolResultBlock)
_SOURCE_TAGS: Final = _tags(UserSource, PluginSource, ModelSource, ToolSource)


def _open_value(obj: Any, tag: str, what: str, known: dict[str, type[msgspec.Struct]]) -> Any:
    if not isinstance(obj, dict):
        raise msgspec.ValidationError(f"a {what} must be an object with a string `{tag}`")
    value = obj.get(tag)
    if not isinstance(value, str) or not value:
        raise msgspec.ValidationError(f"a {what} must have a non-empty string `{tag}`")
    typed = known.get(value)
    if typed is not None:  # a Struct class: msgspec caches its decoder (a union it would not)
        return msgspec.convert(obj, typed, dec_hook=json_dec_hook)
    return freeze_json(obj, what)


def block_type(block: ContentBlock) -> str:
    """The ``type`` tag of a content block, modelled or opaque."""
    if isinstance(block, msgspec.Struct):
        return str(block.__struct_config__.tag)
    return str(block["type"])


def source_kind(source: MessageSource | Opaque) -> str:
    """The ``kind`` tag of a message source, modelled or opaque."""
    if isinstance(source, msgspec.Struct):
        return str(source.__struct_config__.tag)
    return str(source["kind"])


# --- messages ------------------------------------------------------------------------------


class UserMessage(Wire, frozen=True, kw_only=True):
    """A user-role message: a prompt, injected context, or a goal round (``user/message`` data)."""

    id: _NonEmpty  #: message identity
    role: Literal["user"] = "user"  #: always "user"
    content: tuple[ContentBlock, ...]  #: projected to the model verbatim
    #: ``source.kind`` tells prompts and injected context apart (an unknown kind is opaque)
    source: _OpenUserSource


class AssistantMessage(Wire, frozen=True, kw_only=True):
    """The assembled message of one model step."""

    id: _NonEmpty  #: message identity
    role: Literal["assistant"] = "assistant"  #: always "assistant"
    content: tuple[ContentBlock, ...]  #: text / reasoning / tool-call blocks in stream order
    source: ModelSource  #: which provider and model produced it


class ToolResultMessage(Wire, frozen=True, kw_only=True):
    """The model-facing result of one tool call (``tool/result`` data ``message``).

    Invariant (checked at append): ``content`` is exactly one ``tool-result``
    block whose ``tool_call_id`` equals ``source.call_id``.
    """

    id: _NonEmpty  #: message identity
    role: Literal["user"] = "user"  #: tool results travel in the user role
    content: tuple[ContentBlock, ...]  #: exactly one ToolResultBlock
    source: ToolSource  #: the answered call


class SystemMessage(Wire, frozen=True, kw_only=True):
    """A system prompt on the surface (DSH v3 ``system/message``; our loop does not write it)."""

    id: _NonEmpty  #: message identity
    role: Literal["system"] = "system"  #: always "system"
    content: tuple[ContentBlock, ...]  #: the prompt text blocks
    source: MessageSource  #: usually a plugin source


class DeveloperMessage(Wire, frozen=True, kw_only=True):
    """A developer-role message (DSH format v4 ``developer/message`` data ``message``).

    DSH 0.1.7+ records tool additions and removals as ``tool-addition`` /
    ``tool-removal`` blocks (opaque here, ``toolName`` inside) of a developer message.
    It is not a :data:`Message`: the surface projects it as a :class:`SystemMessage`
    (``derive_event_message``), as DSH's text routes do.
    """

    id: _NonEmpty  #: message identity
    role: Literal["developer"] = "developer"  #: always "developer"
    content: tuple[ContentBlock, ...]  #: text and tool-change blocks
    #: the producer's source (a v4 producer kind; an unknown kind is opaque)
    source: _OpenUserSource


#: Any message the surface can project.
Message = UserMessage | AssistantMessage | ToolResultMessage | SystemMessage


# --- usage, failures, finish reasons -------------------------------------------------------

#: The token counts of a ``usage`` wire object (``UsageTotals.to_wire`` of
#: :mod:`dsh_host._session.usage`): uncached input, output, cache reads and writes, reasoning
#: (a part of output), billed calls. Here, so the list cache checks a remembered ``usage``
#: without loading the ledger (docs/decisions.md D44).
USAGE_KEYS: Final = (
    "inputTokens",
    "outputTokens",
    "cacheReadTokens",
    "cacheWriteTokens",
    "reasoningTokens",
    "requests",
)


class TokenUsage(Wire, frozen=True, kw_only=True):
    """Disjoint token counts of one model call (uncached input only in ``input_tokens``)."""

    input_tokens: NonNegativeInt  #: uncached input tokens
    output_tokens: NonNegativeInt  #: generated tokens
    cache_read_tokens: NonNegativeInt | UnsetType = UNSET  #: input served from cache
    cache_write_tokens: NonNegativeInt | UnsetType = UNSET  #: input written to cache
    reasoning_tokens: NonNegativeInt | UnsetType = UNSET  #: part of output spent reasoning


class LlmFailure(Wire, frozen=True, kw_only=True):
    """A structured model failure (also the payload of ``turn/end {kind: "error"}``)."""

    message: _NonEmpty  #: human-readable description
    code: _NonEmpty  #: stable code (``RATE_LIMIT``, ``UNKNOWN``...)
    status: Annotated[int, Meta(ge=100, le=599)] | UnsetType = UNSET  #: HTTP status, if any
    provider_retry_after_ms: Annotated[int, Meta(gt=0, le=MAX_SAFE_INTEGER)] | UnsetType = UNSET
    request_id: str | UnsetType = UNSET  #: provider request id


class StopFinish(Wire, frozen=True, kw_only=True, tag="stop", tag_field="kind"):
    """The model finished normally."""


class ToolCallsFinish(Wire, frozen=True, kw_only=True, tag="tool-calls", tag_field="kind"):
    """The model stopped to call tools."""


class MaxTokensFinish(Wire, frozen=True, kw_only=True, tag="max-tokens", tag_field="kind"):
    """The output-token ceiling was hit; truncated tool calls are dropped."""


class AbortedFinish(Wire, frozen=True, kw_only=True, tag="aborted", tag_field="kind"):
    """The request was cancelled."""

    failure: LlmFailure  #: what the adapter reported


class ErrorFinish(Wire, frozen=True, kw_only=True, tag="error", tag_field="kind"):
    """The request failed."""

    failure: LlmFailure  #: what the adapter reported


#: Why a model stream ended (kind-tagged).
FinishReason = StopFinish | ToolCallsFinish | MaxTokensFinish | AbortedFinish | ErrorFinish


# --- stream chunks -------------------------------------------------------------------------


class BlockStartChunk(Wire, frozen=True, kw_only=True, tag="block-start", tag_field="type"):
    """A content block opens at ``index``."""

    index: NonNegativeInt  #: block position
    block_type: str  #: ``text`` / ``reasoning`` / ``tool-call`` / ...


class TextDeltaChunk(Wire, frozen=True, kw_only=True, tag="text-delta", tag_field="type"):
    """Text appended to block ``index``."""

    index: NonNegativeInt  #: block position
    text: str  #: the delta


class ReasoningDeltaChunk(Wire, frozen=True, kw_only=True, tag="reasoning-delta", tag_field="type"):
    """Reasoning text appended to block ``index``."""

    index: NonNegativeInt  #: block position
    text: str  #: the delta


class ToolCallDeltaChunk(Wire, frozen=True, kw_only=True, tag="tool-call-delta", tag_field="type"):
    """A fragment of a tool call's raw arguments."""

    index: NonNegativeInt  #: block position
    id: str  #: call id
    name: str | UnsetType = UNSET  #: tool name (usually on the first delta only)
    arguments_delta: str  #: raw argument text fragment


class BlockEndChunk(Wire, frozen=True, kw_only=True, tag="block-end", tag_field="type"):
    """The authoritative, complete block at ``index`` (first close wins)."""

    index: NonNegativeInt  #: block position
    block: ContentBlock  #: the complete block


class UsageChunk(Wire, frozen=True, kw_only=True, tag="usage", tag_field="type"):
    """Token accounting; comes before ``finish``."""

    usage: TokenUsage  #: the latest usage


class FinishChunk(Wire, frozen=True, kw_only=True, tag="finish", tag_field="type"):
    """The last chunk of a stream."""

    reason: FinishReason  #: why the stream ended
    replay_state: FrozenJson | UnsetType = UNSET  #: adapter-private replay envelope


#: One model stream chunk (type-tagged).
StreamChunk = (
    BlockStartChunk
    | TextDeltaChunk
    | ReasoningDeltaChunk
    | ToolCallDeltaChunk
    | BlockEndChunk
    | UsageChunk
    | FinishChunk
)


# --- compact embedded stream (DSH v3 assistant/message ``stream``) ------------------------


class ChunkRecord(Wire, frozen=True, kw_only=True, tag="chunk", tag_field="type"):
    """One chunk kept verbatim (block-start, block-end, usage, finish, lone deltas)."""

    time: SafeInt  #: epoch ms when the chunk arrived
    chunk: StreamChunk  #: the chunk


class TextChunksRecord(Wire, frozen=True, kw_only=True, tag="text-chunks", tag_field="type"):
    """A run of text deltas on one block: member k arrived at ``time0 + sum(dt[:k])``."""

    time0: SafeInt  #: arrival time of the first delta
    index: NonNegativeInt  #: block position
    dt: tuple[SafeInt, ...]  #: the n-1 gaps between member times (ms)
    texts: tuple[str, ...]  #: the deltas, boundaries preserved


class ReasoningChunksRecord(
    Wire, frozen=True, kw_only=True, tag="reasoning-chunks", tag_field="type"
):
    """A run of reasoning deltas on one block."""

    time0: SafeInt  #: arrival time of the first delta
    index: NonNegativeInt  #: block position
    dt: tuple[SafeInt, ...]  #: the n-1 gaps between member times (ms)
    texts: tuple[str, ...]  #: the deltas, boundaries preserved


class ToolCallChunksRecord(
    Wire, frozen=True, kw_only=True, tag="tool-call-chunks", tag_field="type"
):
    """A run of tool-call argument deltas on one block."""

    time0: SafeInt  #: arrival time of the first delta
    index: NonNegativeInt  #: block position
    dt: tuple[SafeInt, ...]  #: the n-1 gaps between member times (ms)
    id: str  #: call id
    name: str | UnsetType = UNSET  #: tool name, when the run carried it
    args: tuple[str, ...]  #: the argument fragments


#: One record of the compact stream embedded in ``assistant/message`` (type-tagged).
AssistantStreamRecord = (
    ChunkRecord | TextChunksRecord | ReasoningChunksRecord | ToolCallChunksRecord
)


# --- tool schema (request header) ----------------------------------------------------------


class ToolSchema(Wire, frozen=True, kw_only=True):
    """A tool as the model sees it in a request."""

    name: str  #: tool name
    description: str  #: what it does, for the model
    parameters: FrozenJson  #: JSON Schema object (frozen JSON)


class LlmCallConfig(Wire, frozen=True, kw_only=True):
    """The call configuration of a request; equality is field-wise (``stop`` element-wise)."""

    provider: _NonEmpty  #: adapter route
    model: _NonEmpty  #: provider model id
    reasoning_effort: _NonEmpty | UnsetType = UNSET  #: e.g. ``off|low|high|max``
    temperature: int | float | UnsetType = UNSET  #: sampling temperature
    max_tokens: Annotated[int, Meta(gt=0, le=MAX_SAFE_INTEGER)] | UnsetType = UNSET  #: ceiling
    stop: tuple[str, ...] | UnsetType = UNSET  #: stop sequences


class AdapterDefaults(Wire, frozen=True, kw_only=True):
    """Which config fields the adapter filled in (each marker is exactly ``true``)."""

    reasoning_effort: Literal[True] | UnsetType = UNSET  #: effort came from the adapter
    max_tokens: Literal[True] | UnsetType = UNSET  #: max_tokens came from the adapter


class EpochHeader(Wire, frozen=True, kw_only=True):
    """The full request envelope logged by ``request/header`` (everything but the messages)."""

    config: LlmCallConfig  #: call configuration
    adapter_defaults: AdapterDefaults | UnsetType = UNSET  #: adapter-materialized fields
    system: str | UnsetType = UNSET  #: system prompt (omitted when empty)
    tools: tuple[ToolSchema, ...] | UnsetType = UNSET  #: tool schemas (omitted when empty)

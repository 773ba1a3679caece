"""The one surface a plugin author imports: ``from dsh_host.sdk import ...``.

Everything a shipped plugin uses of the host is re-exported here, grouped by seam, and the
plugins import nothing else of ``dsh_host`` (``tests/test_layers.py`` enforces it), so the
modules behind these names can move without breaking a plugin (D25 in docs/decisions.md):

- **plugins and services**: :class:`Plugin` (metadata as class attributes, ``Config`` a
  ``msgspec.Struct``, ``apply(ctx, config)``), :class:`Context`, and a typed
  :class:`ServiceKey` for every service -- ``ctx.get(APPROVAL)`` is an
  :class:`ApprovalProvider` or None to mypy, ``ctx.service(SESSIONS)`` a :class:`SessionStore`;
  provide with ``ctx.provide(SANDBOX, provider)`` (checked against the key's type);
- **events**: the typed keys (``ctx.on(TOOLS_EXECUTE, around)`` checks ``around``);
- **storage**: :class:`SessionStorage` (docs/storage.md), its optional capabilities as
  runtime-checkable protocols (:class:`SupportsReadFrom`, :class:`SupportsCurrentRevision`,
  :class:`SupportsHeldBy`, :class:`SupportsRoot`, :class:`SupportsStoredEnds`), and
  :func:`wire_storage`, the one call a storage plugin's ``apply`` makes;
- **model adapters**: :class:`LlmAdapter`, :class:`ProviderAdapter` and the wire helpers;
- **tools**: :class:`ToolDefinition`, the pipeline's decisions, :class:`ToolError`;
- **errors** a plugin may raise: :class:`ConfigError` at ``apply``, :class:`ToolError` from a
  tool body, the storage errors of the persistence contract, :class:`LlmError` from an adapter.

Names are imported on first use (PEP 562), so importing this module loads nothing: a storage
plugin that ``dsh sessions list`` boots does not pay for the agent, the tools or the model
layer. The ``if TYPE_CHECKING:`` block is what type checkers read; ``_DEFINED_IN`` is what
runs; ``tests/test_public_api.py`` checks they list the same names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dsh_host._lazy import lazy_names as _lazy_names

if TYPE_CHECKING:
    # -- Plugins, services, events, cancellation
    from dsh_host._plugin import (  # noqa: I001 (grouped by seam, not sorted)
        ModelRoute as ModelRoute,
        NoConfig as NoConfig,
        Plugin as Plugin,
        RunTermKeys as RunTermKeys,
        StoreUrl as StoreUrl,
    )
    from dsh_host._context import (
        Context as Context,
        Host as Host,
        ServiceKey as ServiceKey,
    )
    from dsh_host._bus import (
        Emit as Emit,
        EventMode as EventMode,
        Next as Next,
        Parallel as Parallel,
        Serial as Serial,
        StreamNext as StreamNext,
        StreamWaterfall as StreamWaterfall,
        Waterfall as Waterfall,
    )
    from dsh_host._cancel import (
        CancelToken as CancelToken,
        fuse as fuse,
    )
    from dsh_host.errors import (
        AbortError as AbortError,
        ConfigError as ConfigError,
        DshError as DshError,
        require_extra as require_extra,
    )

    # -- Service and event keys
    from dsh_host._session.keys import (
        COMPACTION as COMPACTION,
        SESSIONS as SESSIONS,
        SESSION_CREATED as SESSION_CREATED,
        SESSION_DISPOSED as SESSION_DISPOSED,
        SESSION_EVENT as SESSION_EVENT,
        SESSION_EVENTS as SESSION_EVENTS,
        SESSION_FLUSH as SESSION_FLUSH,
        TELEMETRY as TELEMETRY,
        TOKEN_METER as TOKEN_METER,
        TOOL_RESULT_PRUNER as TOOL_RESULT_PRUNER,
    )
    from dsh_host._persistence.keys import SESSION_PERSISTENCE as SESSION_PERSISTENCE
    from dsh_host._llm.keys import (
        LLM as LLM,
        LLM_STREAM as LLM_STREAM,
    )
    from dsh_host._tools.keys import (
        APPROVAL as APPROVAL,
        APPROVAL_REQUEST as APPROVAL_REQUEST,
        TOOLS as TOOLS,
        TOOLS_CHANGE as TOOLS_CHANGE,
        TOOLS_EVENTS as TOOLS_EVENTS,
        TOOLS_EXECUTE as TOOLS_EXECUTE,
        TOOLS_POST_EXECUTE as TOOLS_POST_EXECUTE,
        TOOLS_PRE_EXECUTE as TOOLS_PRE_EXECUTE,
        TOOLS_RESULT as TOOLS_RESULT,
    )
    from dsh_host._agent.keys import (
        AGENT as AGENT,
        AGENT_CHUNK as AGENT_CHUNK,
        AGENT_ERROR as AGENT_ERROR,
        AGENT_EVENTS as AGENT_EVENTS,
        AGENT_PRE_STEP as AGENT_PRE_STEP,
        AGENT_REQUEST as AGENT_REQUEST,
        AGENT_REQUEST_ERROR as AGENT_REQUEST_ERROR,
        AGENT_STEP_END as AGENT_STEP_END,
        AGENT_STEP_START as AGENT_STEP_START,
        AGENT_TURN_END as AGENT_TURN_END,
        AGENT_TURN_START as AGENT_TURN_START,
        AGENT_TURN_STOPPING as AGENT_TURN_STOPPING,
        SUBAGENTS as SUBAGENTS,
        SYSTEM_PROMPT_ASSEMBLE as SYSTEM_PROMPT_ASSEMBLE,
    )

    # -- The session log: sessions, messages, events
    from dsh_host._session.approvals import (
        AWAITING_APPROVAL as AWAITING_APPROVAL,
        WAITS_EVENT as WAITS_EVENT,
        DeferredCall as DeferredCall,
        args_digest as args_digest,
        awaiting_call_ids as awaiting_call_ids,
        context_of_ask as context_of_ask,
        deferred_calls as deferred_calls,
    )
    from dsh_host._session.compaction import (
        CompactionEngine as CompactionEngine,
        CompactionError as CompactionError,
        CompactionResult as CompactionResult,
        CompactionTrigger as CompactionTrigger,
        ManualCompactionError as ManualCompactionError,
        ResultPruner as ResultPruner,
        balanced_cuts as balanced_cuts,
        compact_checkpoint_source as compact_checkpoint_source,
        is_compact_checkpoint_source as is_compact_checkpoint_source,
    )
    from dsh_host._session.errors import (
        InvalidSessionIdError as InvalidSessionIdError,
    )
    from dsh_host._session.events.codec import (
        decode_event_line as decode_event_line,
        encode_event as encode_event,
        event_to_builtins as event_to_builtins,
    )
    from dsh_host._session.events.coerce import (
        system_message_problem as system_message_problem,
    )
    from dsh_host._session.events.data import (
        LlmRetryData as LlmRetryData,
        LlmRetryStartedData as LlmRetryStartedData,
        ToolResultData as ToolResultData,
        TurnStart as TurnStart,
    )
    from dsh_host._session.events.envelope import (
        ReplaceOp as ReplaceOp,
        SessionEvent as SessionEvent,
    )
    from dsh_host._session.events.reasons import (
        register_turn_end_reason as register_turn_end_reason,
    )
    from dsh_host._session.folds import (
        LogFold as LogFold,
    )
    from dsh_host._session.lineage import (
        DELEGATION_EVENT as DELEGATION_EVENT,
        DelegationLink as DelegationLink,
        delegating_call as delegating_call,
        delegation_link as delegation_link,
        session_link as session_link,
    )
    from dsh_host._session.header import (
        HEADER_KEYS as HEADER_KEYS,
        SessionHeader as SessionHeader,
        check_session_id as check_session_id,
        parse_session_header as parse_session_header,
    )
    from dsh_host._session.messages import (
        AbortedFinish as AbortedFinish,
        AssistantMessage as AssistantMessage,
        BlockEndChunk as BlockEndChunk,
        BlockStartChunk as BlockStartChunk,
        ContentBlock as ContentBlock,
        ErrorFinish as ErrorFinish,
        FinishChunk as FinishChunk,
        FinishReason as FinishReason,
        ImageBlock as ImageBlock,
        LlmCallConfig as LlmCallConfig,
        LlmFailure as LlmFailure,
        MaxTokensFinish as MaxTokensFinish,
        Message as Message,
        PluginSource as PluginSource,
        ReasoningBlock as ReasoningBlock,
        ReasoningDeltaChunk as ReasoningDeltaChunk,
        StopFinish as StopFinish,
        StreamChunk as StreamChunk,
        SystemMessage as SystemMessage,
        TextBlock as TextBlock,
        TextDeltaChunk as TextDeltaChunk,
        TokenUsage as TokenUsage,
        ToolCallBlock as ToolCallBlock,
        ToolCallDeltaChunk as ToolCallDeltaChunk,
        ToolCallsFinish as ToolCallsFinish,
        ToolResultBlock as ToolResultBlock,
        ToolSchema as ToolSchema,
        UsageChunk as UsageChunk,
        UserMessage as UserMessage,
        UserSource as UserSource,
        Wire as Wire,
        new_message_id as new_message_id,
    )
    from dsh_host._session.prices import (
        ModelPrice as ModelPrice,
        PriceTable as PriceTable,
        parse_prices as parse_prices,
    )
    from dsh_host._session.repair import (
        TOOL_OUTCOME_UNKNOWN as TOOL_OUTCOME_UNKNOWN,
    )
    from dsh_host._session.packed import (
        PackedLog as PackedLog,
    )
    from dsh_host._session.session import (
        Session as Session,
        derive_event_message as derive_event_message,
    )
    from dsh_host._session.store import (
        SessionStore as SessionStore,
    )
    from dsh_host._session.terms import (
        recorded_terms as recorded_terms,
    )
    from dsh_host._session.tokens import (
        ContextPressure as ContextPressure,
        TokenMeasurement as TokenMeasurement,
        TokenMeter as TokenMeter,
        TokenSurfaceNode as TokenSurfaceNode,
        estimate_content as estimate_content,
        estimate_header as estimate_header,
        estimate_message as estimate_message,
    )
    from dsh_host._session.usage import (
        RequestCost as RequestCost,
        UsageTotals as UsageTotals,
    )

    # -- The storage seam (docs/storage.md)
    from dsh_host._persistence.storage import (
        MemoryStorage as MemoryStorage,
        Pending as Pending,
        SessionStorage as SessionStorage,
        SupportsCurrentRevision as SupportsCurrentRevision,
        SupportsHeldBy as SupportsHeldBy,
        SupportsReadFrom as SupportsReadFrom,
        SupportsRoot as SupportsRoot,
        SupportsStoredEnds as SupportsStoredEnds,
        encode_json as encode_json,
    )
    from dsh_host._persistence.lock import (
        LOCK_NAME as LOCK_NAME,
        SessionLock as SessionLock,
        held_by_text as held_by_text,
        lock_holder as lock_holder,
    )
    from dsh_host._persistence.persistence import (
        ArtifactLocation as ArtifactLocation,
        SessionAlreadyExistsError as SessionAlreadyExistsError,
        SessionAlreadyOwnedError as SessionAlreadyOwnedError,
        SessionAppendRejectedError as SessionAppendRejectedError,
        SessionFormatUnsupportedError as SessionFormatUnsupportedError,
        SessionGenerationConflictError as SessionGenerationConflictError,
        SessionGenerationSourceChangedError as SessionGenerationSourceChangedError,
        SessionHandleClosedError as SessionHandleClosedError,
        SessionListing as SessionListing,
        SessionLoad as SessionLoad,
        SessionLockUnsafeError as SessionLockUnsafeError,
        SessionNotFoundError as SessionNotFoundError,
        SessionOwnershipLostError as SessionOwnershipLostError,
        SessionPersistenceCorruptionError as SessionPersistenceCorruptionError,
        SessionPersistenceError as SessionPersistenceError,
        SessionRollbackError as SessionRollbackError,
        SessionWriteError as SessionWriteError,
        TornTail as TornTail,
        UnreadableListing as UnreadableListing,
        decode_stored_event as decode_stored_event,
        decode_stored_header as decode_stored_header,
        decode_stored_rows as decode_stored_rows,
        pack_stored_rows as pack_stored_rows,
    )
    from dsh_host._persistence.backend import (
        PersistenceService as PersistenceService,
    )
    from dsh_host._persistence.binding import (
        wire_storage as wire_storage,
    )
    from dsh_host._persistence.write_behind import (
        WINDOW_SECONDS as WINDOW_SECONDS,
        Spawn as Spawn,
        header_meta as header_meta,
    )

    # -- The model-adapter seam
    from dsh_host._llm.assembler import (
        BlockAssembler as BlockAssembler,
    )
    from dsh_host._llm.convert import (
        BlockKind as BlockKind,
        EventBlock as EventBlock,
        answer_end as answer_end,
        completed_reason as completed_reason,
        disjoint_usage as disjoint_usage,
        or_default as or_default,
        refuse_images as refuse_images,
        replay_entries as replay_entries,
        stopped as stopped,
        text_of as text_of,
        token_count as token_count,
        tool_result_text as tool_result_text,
        unsupported_effort as unsupported_effort,
    )
    from dsh_host._llm.errors import (
        CONTEXT_WINDOW_EXCEEDED_CODE as CONTEXT_WINDOW_EXCEEDED_CODE,
        MODEL_NOT_FOUND_CODE as MODEL_NOT_FOUND_CODE,
        QUOTA_EXCEEDED_CODE as QUOTA_EXCEEDED_CODE,
        LlmError as LlmError,
    )
    from dsh_host._llm.provider import (
        ProviderAdapter as ProviderAdapter,
        ProviderSettings as ProviderSettings,
        SdkAdapter as SdkAdapter,
        SdkErrors as SdkErrors,
        linked as linked,
        missing_sdk as missing_sdk,
        register_adapter as register_adapter,
        request_headers as request_headers,
        resolve_base_url as resolve_base_url,
        sdk_client_options as sdk_client_options,
        status_failure as status_failure,
    )
    from dsh_host._llm.runtime import (
        LlmRuntime as LlmRuntime,
    )
    from dsh_host._llm.types import (
        DEFAULT_RETRYABLE_CODES as DEFAULT_RETRYABLE_CODES,
        LlmAdapter as LlmAdapter,
        LlmRequest as LlmRequest,
        ModelInfo as ModelInfo,
        ProviderInfo as ProviderInfo,
        RetryPolicy as RetryPolicy,
        RetryPolicyConfig as RetryPolicyConfig,
    )
    from dsh_host._llm.wire import (
        drain_tail as drain_tail,
        exception_chain as exception_chain,
        http_error_code as http_error_code,
        is_context_window_exceeded as is_context_window_exceeded,
        request_id_of as request_id_of,
        transport_cause as transport_cause,
    )

    # -- The tool seam
    from dsh_host._tools.beneath import (
        BeneathPathError as BeneathPathError,
        beneath_parts as beneath_parts,
        open_beneath as open_beneath,
        open_dirs_beneath as open_dirs_beneath,
    )
    from dsh_host._tools.errors import (
        ToolCallWaits as ToolCallWaits,
        ToolError as ToolError,
    )
    from dsh_host._tools.escalation import (
        ESCALATION_TARGETS as ESCALATION_TARGETS,
        EscalationFailure as EscalationFailure,
        SandboxEscalationError as SandboxEscalationError,
        approve_escalation as approve_escalation,
        check_escalation_available as check_escalation_available,
        escalation_hint_marker as escalation_hint_marker,
        sandbox_denial_marker as sandbox_denial_marker,
        validate_escalation_args as validate_escalation_args,
    )
    from dsh_host._tools.schema import (
        SCHEMA_TYPES as SCHEMA_TYPES,
        check_object_schema as check_object_schema,
    )
    from dsh_host._tools.runtime import (
        ToolRuntime as ToolRuntime,
    )
    from dsh_host._tools.types import (
        Accept as Accept,
        ApprovalProvider as ApprovalProvider,
        ApprovalRequest as ApprovalRequest,
        Ask as Ask,
        Block as Block,
        Deny as Deny,
        PostExecuteContext as PostExecuteContext,
        PostToolDecision as PostToolDecision,
        PreToolDecision as PreToolDecision,
        ToolAgent as ToolAgent,
        ToolDefinition as ToolDefinition,
        ToolErrorInfo as ToolErrorInfo,
        ToolExecution as ToolExecution,
        ToolExecutionResult as ToolExecutionResult,
        ToolOutput as ToolOutput,
        ToolResultEvent as ToolResultEvent,
        aborted_before_dispatch_result as aborted_before_dispatch_result,
        text_output as text_output,
    )

    # -- The agent's extension points
    from dsh_host._agent.budget import (
        BudgetExceededReason as BudgetExceededReason,
        over_budget as over_budget,
    )
    from dsh_host._agent.errors import (
        AgentBusyError as AgentBusyError,
        ApprovalDecisionError as ApprovalDecisionError,
    )
    from dsh_host._agent.loop import (
        error_chain as error_chain,
    )
    from dsh_host._agent.types import (
        AgentErrorEvent as AgentErrorEvent,
        AgentOptions as AgentOptions,
        AssembleContext as AssembleContext,
        AssembledContext as AssembledContext,
        AssembledSection as AssembledSection,
        ChunkReceived as ChunkReceived,
        Enter as Enter,
        PreStepContext as PreStepContext,
        PreStepDecision as PreStepDecision,
        PromptAssembly as PromptAssembly,
        Reject as Reject,
        RequestErrorAction as RequestErrorAction,
        RequestErrorContext as RequestErrorContext,
        RequestProposal as RequestProposal,
        Retry as Retry,
        StepEnded as StepEnded,
        StepStarted as StepStarted,
        TextProvider as TextProvider,
        TurnEnded as TurnEnded,
        TurnStarted as TurnStarted,
        TurnStoppingContext as TurnStoppingContext,
        pre_step_decision as pre_step_decision,
        request_error_action as request_error_action,
    )
    from dsh_host._agent.service import (
        AgentService as AgentService,
    )

    # -- Sandbox, processes, JSON, directories
    from dsh_host._sandbox import (
        CONFINED_SANDBOX_MODES as CONFINED_SANDBOX_MODES,
        DEFAULT_ENV_ALLOW as DEFAULT_ENV_ALLOW,
        DEFAULT_PROTECTED_NAMES as DEFAULT_PROTECTED_NAMES,
        SANDBOX as SANDBOX,
        SANDBOX_MODES as SANDBOX_MODES,
        ConfinedArgv as ConfinedArgv,
        InvalidSandboxRequestError as InvalidSandboxRequestError,
        RunnerFailureRule as RunnerFailureRule,
        SandboxMode as SandboxMode,
        SandboxPolicy as SandboxPolicy,
        SandboxProvider as SandboxProvider,
        SandboxUnavailableError as SandboxUnavailableError,
        allowed_environment as allowed_environment,
        call_policy as call_policy,
        confined_writable_roots as confined_writable_roots,
        harness_secret_paths as harness_secret_paths,
        harness_state_conflict as harness_state_conflict,
        read_only_cover as read_only_cover,
        writable_roots as writable_roots,
    )
    from dsh_host._spawn import (
        FdReceiveStream as FdReceiveStream,
        SpawnedProcess as SpawnedProcess,
        open_process as open_process,
    )
    from dsh_host._jsonsafe import (
        MAX_SAFE_INTEGER as MAX_SAFE_INTEGER,
        is_safe_int as is_safe_int,
        js_number as js_number,
        json_enc_hook as json_enc_hook,
        may_hold_unsafe_int as may_hold_unsafe_int,
        parse_js_float as parse_js_float,
        thaw_json as thaw_json,
        to_json_builtins as to_json_builtins,
    )
    from dsh_host._filewatch import StatMemo as StatMemo, Watched as Watched
    from dsh_host._lazy import lazy_names as lazy_names
    from dsh_host._userdirs import (
        config_home as config_home,
        default_session_root as default_session_root,
        trust_store_file as trust_store_file,
    )
    from dsh_host._persistence import offload as offload

    # -- The chat-completions wire the OpenAI-compatible adapters share, attachments, v4 events
    from dsh_host._session.events import (
        DSH_V4_ONLY_EVENT_TYPES as DSH_V4_ONLY_EVENT_TYPES,
        AssistantMessageData as AssistantMessageData,
        ToolCallData as ToolCallData,
        TurnEnd as TurnEnd,
        decode_event as decode_event,
    )
    from dsh_host._llm.attachments import (
        MAX_IMAGE_BYTES as MAX_IMAGE_BYTES,
        Attachment as Attachment,
        AttachmentError as AttachmentError,
        attached as attached,
        image_block as image_block,
        image_media_type as image_media_type,
        tool_result_images as tool_result_images,
    )
    from dsh_host._llm.chat import (
        ChunkTranslator as ChunkTranslator,
        DONE as DONE,
        chat_tools as chat_tools,
        map_finish_reason as map_finish_reason,
        map_usage as map_usage,
        serialize_messages as serialize_messages,
    )

    # -- What the sub-agents plugin reads of the log, the repair and the sandbox ceiling
    from dsh_host._agent.prompt import (
        PERSONA_SECTION as PERSONA_SECTION,
    )
    from dsh_host._session.repair import (
        TOOL_NOT_STARTED as TOOL_NOT_STARTED,
        TOOL_NOT_STARTED_TEXT as TOOL_NOT_STARTED_TEXT,
        TOOL_OUTCOME_UNKNOWN_TEXT as TOOL_OUTCOME_UNKNOWN_TEXT,
        interrupted_tool_result_id as interrupted_tool_result_id,
        interrupted_turn_closers as interrupted_turn_closers,
    )
    from dsh_host._sandbox import (
        capped_mode as capped_mode,
    )

    # -- What a file store's header codec shares with the core (one header rule)
    from dsh_host._persistence.persistence import (
        format_refusal as format_refusal,
    )
    from dsh_host._session.header import (
        header_from_meta as header_from_meta,
    )

#: Where each name is defined (the module it is imported from on first use).
_DEFINED_IN: dict[str, tuple[str, ...]] = {
    "dsh_host._agent.prompt": ("PERSONA_SECTION",),
    # -- The chat-completions wire the OpenAI-compatible adapters share, attachments, v4 events
    "dsh_host._llm.chat": (
        "ChunkTranslator", "DONE", "chat_tools", "map_finish_reason", "map_usage",
        "serialize_messages",
    ),
    "dsh_host._llm.attachments": (
        "MAX_IMAGE_BYTES", "Attachment", "AttachmentError", "attached", "image_block",
        "image_media_type", "tool_result_images",
    ),
    "dsh_host._session.events": (
        "AssistantMessageData", "DSH_V4_ONLY_EVENT_TYPES", "ToolCallData", "TurnEnd",
        "decode_event",
    ),
    # -- Plugins, services, events, cancellation
    "dsh_host._plugin": ("ModelRoute", "NoConfig", "Plugin", "RunTermKeys", "StoreUrl"),
    "dsh_host._context": ("Context", "Host", "ServiceKey"),
    "dsh_host._bus": (
        "Emit", "EventMode", "Next", "Parallel", "Serial", "StreamNext", "StreamWaterfall",
        "Waterfall",
    ),
    "dsh_host._cancel": ("CancelToken", "fuse"),
    "dsh_host.errors": ("AbortError", "ConfigError", "DshError", "require_extra"),
    # -- Service and event keys
    "dsh_host._session.keys": (
        "COMPACTION", "SESSIONS", "SESSION_CREATED", "SESSION_DISPOSED", "SESSION_EVENT",
        "SESSION_EVENTS", "SESSION_FLUSH", "TELEMETRY", "TOKEN_METER",
        "TOOL_RESULT_PRUNER",
    ),
    "dsh_host._persistence.keys": ("SESSION_PERSISTENCE",),
    "dsh_host._llm.keys": ("LLM", "LLM_STREAM"),
    "dsh_host._tools.keys": (
        "APPROVAL", "APPROVAL_REQUEST", "TOOLS", "TOOLS_CHANGE", "TOOLS_EVENTS", "TOOLS_EXECUTE",
        "TOOLS_POST_EXECUTE", "TOOLS_PRE_EXECUTE", "TOOLS_RESULT",
    ),
    "dsh_host._agent.keys": (
        "AGENT", "AGENT_CHUNK", "AGENT_ERROR", "AGENT_EVENTS", "AGENT_PRE_STEP", "AGENT_REQUEST",
        "AGENT_REQUEST_ERROR", "AGENT_STEP_END", "AGENT_STEP_START", "AGENT_TURN_END",
        "AGENT_TURN_START", "AGENT_TURN_STOPPING", "SUBAGENTS", "SYSTEM_PROMPT_ASSEMBLE",
    ),
    # -- The session log: sessions, messages, events
    "dsh_host._session.approvals": (
        "AWAITING_APPROVAL", "WAITS_EVENT", "DeferredCall", "args_digest", "awaiting_call_ids",
        "context_of_ask", "deferred_calls",
    ),
    "dsh_host._session.compaction": (
        "CompactionEngine", "CompactionError", "CompactionResult", "CompactionTrigger",
        "ManualCompactionError", "ResultPruner", "balanced_cuts", "compact_checkpoint_source",
        "is_compact_checkpoint_source",
    ),
    "dsh_host._session.errors": ("InvalidSessionIdError",),
    "dsh_host._session.events.codec": ("decode_event_line", "encode_event", "event_to_builtins"),
    "dsh_host._session.events.coerce": ("system_message_problem",),
    "dsh_host._session.events.data": (
        "LlmRetryData", "LlmRetryStartedData", "ToolResultData", "TurnStart",
    ),
    "dsh_host._session.events.envelope": ("ReplaceOp", "SessionEvent"),
    "dsh_host._session.events.reasons": ("register_turn_end_reason",),
    "dsh_host._session.folds": ("LogFold",),
    "dsh_host._session.lineage": (
        "DELEGATION_EVENT", "DelegationLink", "delegating_call", "delegation_link",
        "session_link",
    ),
    "dsh_host._session.header": ("header_from_meta",
        "HEADER_KEYS", "SessionHeader", "check_session_id", "parse_session_header",
    ),
    "dsh_host._session.messages": (
        "AbortedFinish", "AssistantMessage", "BlockEndChunk", "BlockStartChunk", "ContentBlock",
        "ErrorFinish", "FinishChunk", "FinishReason", "ImageBlock", "LlmCallConfig", "LlmFailure",
        "MaxTokensFinish", "Message", "PluginSource", "ReasoningBlock", "ReasoningDeltaChunk",
        "StopFinish", "StreamChunk", "SystemMessage", "TextBlock", "TextDeltaChunk", "TokenUsage",
        "ToolCallBlock", "ToolCallDeltaChunk", "ToolCallsFinish", "ToolResultBlock", "ToolSchema",
        "UsageChunk", "UserMessage", "UserSource", "Wire", "new_message_id",
    ),
    "dsh_host._session.prices": ("ModelPrice", "PriceTable", "parse_prices"),
    "dsh_host._session.repair": (
        "TOOL_NOT_STARTED", "TOOL_NOT_STARTED_TEXT", "TOOL_OUTCOME_UNKNOWN",
        "TOOL_OUTCOME_UNKNOWN_TEXT", "interrupted_tool_result_id", "interrupted_turn_closers",
    ),
    "dsh_host._session.packed": ("PackedLog",),
    "dsh_host._session.session": ("Session", "derive_event_message"),
    "dsh_host._session.store": ("SessionStore",),
    "dsh_host._session.terms": ("recorded_terms",),
    "dsh_host._session.tokens": (
        "ContextPressure", "TokenMeasurement", "TokenMeter", "TokenSurfaceNode", "estimate_content",
        "estimate_header", "estimate_message",
    ),
    "dsh_host._session.usage": ("RequestCost", "UsageTotals"),
    # -- The storage seam (docs/storage.md)
    "dsh_host._persistence.storage": (
        "MemoryStorage", "Pending", "SessionStorage", "SupportsCurrentRevision", "SupportsHeldBy",
        "SupportsReadFrom", "SupportsRoot", "SupportsStoredEnds", "encode_json",
    ),
    "dsh_host._persistence.lock": ("LOCK_NAME", "SessionLock", "held_by_text", "lock_holder"),
    "dsh_host._persistence.persistence": (
        "format_refusal",
        "ArtifactLocation", "SessionAlreadyExistsError", "SessionAlreadyOwnedError",
        "SessionAppendRejectedError", "SessionFormatUnsupportedError",
        "SessionGenerationConflictError", "SessionGenerationSourceChangedError",
        "SessionHandleClosedError", "SessionListing", "SessionLoad", "SessionLockUnsafeError",
        "SessionNotFoundError",
        "SessionOwnershipLostError", "SessionPersistenceCorruptionError", "SessionPersistenceError",
        "SessionRollbackError", "SessionWriteError", "TornTail", "UnreadableListing",
        "decode_stored_event", "decode_stored_header", "decode_stored_rows", "pack_stored_rows",
    ),
    "dsh_host._persistence.backend": ("PersistenceService",),
    "dsh_host._persistence.binding": ("wire_storage",),
    "dsh_host._persistence.write_behind": ("WINDOW_SECONDS", "Spawn", "header_meta"),
    # -- The model-adapter seam
    "dsh_host._llm.assembler": ("BlockAssembler",),
    "dsh_host._llm.convert": (
        "BlockKind", "EventBlock", "answer_end", "completed_reason", "disjoint_usage", "or_default",
        "refuse_images", "replay_entries", "stopped", "text_of", "token_count", "tool_result_text",
        "unsupported_effort",
    ),
    "dsh_host._llm.errors": (
        "CONTEXT_WINDOW_EXCEEDED_CODE", "MODEL_NOT_FOUND_CODE", "QUOTA_EXCEEDED_CODE", "LlmError",
    ),
    "dsh_host._llm.provider": (
        "ProviderAdapter", "ProviderSettings", "SdkAdapter", "SdkErrors", "linked", "missing_sdk",
        "register_adapter", "request_headers", "resolve_base_url", "sdk_client_options",
        "status_failure",
    ),
    "dsh_host._llm.runtime": ("LlmRuntime",),
    "dsh_host._llm.types": (
        "DEFAULT_RETRYABLE_CODES", "LlmAdapter", "LlmRequest", "ModelInfo", "ProviderInfo",
        "RetryPolicy", "RetryPolicyConfig",
    ),
    "dsh_host._llm.wire": (
        "drain_tail", "exception_chain", "http_error_code", "is_context_window_exceeded",
        "request_id_of", "transport_cause",
    ),
    # -- The tool seam
    "dsh_host._tools.beneath": (
        "BeneathPathError", "beneath_parts", "open_beneath", "open_dirs_beneath",
    ),
    "dsh_host._tools.errors": ("ToolCallWaits", "ToolError"),
    "dsh_host._tools.escalation": (
        "ESCALATION_TARGETS", "EscalationFailure", "SandboxEscalationError", "approve_escalation",
        "check_escalation_available", "escalation_hint_marker", "sandbox_denial_marker",
        "validate_escalation_args",
    ),
    "dsh_host._tools.schema": ("SCHEMA_TYPES", "check_object_schema"),
    "dsh_host._tools.runtime": ("ToolRuntime",),
    "dsh_host._tools.types": (
        "Accept", "ApprovalProvider", "ApprovalRequest", "Ask", "Block", "Deny",
        "PostExecuteContext", "PostToolDecision", "PreToolDecision", "ToolAgent", "ToolDefinition",
        "ToolErrorInfo", "ToolExecution", "ToolExecutionResult", "ToolOutput", "ToolResultEvent",
        "aborted_before_dispatch_result", "text_output",
    ),
    # -- The agent's extension points
    "dsh_host._agent.budget": ("BudgetExceededReason", "over_budget"),
    "dsh_host._agent.errors": ("AgentBusyError", "ApprovalDecisionError"),
    "dsh_host._agent.loop": ("error_chain",),
    "dsh_host._agent.types": (
        "AgentErrorEvent", "AgentOptions", "AssembleContext", "AssembledContext",
        "AssembledSection", "ChunkReceived", "Enter", "PreStepContext", "PreStepDecision",
        "PromptAssembly", "Reject", "RequestErrorAction", "RequestErrorContext", "RequestProposal",
        "Retry", "StepEnded", "StepStarted", "TextProvider", "TurnEnded", "TurnStarted",
        "TurnStoppingContext", "pre_step_decision", "request_error_action",
    ),
    "dsh_host._agent.service": ("AgentService",),
    # -- Sandbox, processes, JSON, directories
    "dsh_host._sandbox": ("capped_mode",
        "CONFINED_SANDBOX_MODES", "DEFAULT_ENV_ALLOW", "DEFAULT_PROTECTED_NAMES", "SANDBOX",
        "SANDBOX_MODES", "ConfinedArgv", "InvalidSandboxRequestError", "RunnerFailureRule",
        "SandboxMode", "SandboxPolicy", "SandboxProvider", "SandboxUnavailableError",
        "allowed_environment", "call_policy", "confined_writable_roots", "harness_secret_paths",
        "harness_state_conflict", "read_only_cover", "writable_roots",
    ),
    "dsh_host._spawn": ("FdReceiveStream", "SpawnedProcess", "open_process"),
    "dsh_host._jsonsafe": (
        "MAX_SAFE_INTEGER", "is_safe_int", "js_number", "json_enc_hook", "may_hold_unsafe_int",
        "parse_js_float", "thaw_json", "to_json_builtins",
    ),
    "dsh_host._filewatch": ("StatMemo", "Watched"),
    "dsh_host._lazy": ("lazy_names",),
    "dsh_host._userdirs": ("config_home", "default_session_root", "trust_store_file"),
}
#: Modules re-exported whole (``offload.run_sync``: a blocking call off the event loop).
_SUBMODULES = {"offload": "dsh_host._persistence.offload"}

_MODULE_OF = {name: module for module, names in _DEFINED_IN.items() for name in names}

__all__ = sorted([*_MODULE_OF, *_SUBMODULES])


__getattr__ = _lazy_names(__name__, _MODULE_OF, _SUBMODULES)


def __dir__() -> list[str]:
    return __all__

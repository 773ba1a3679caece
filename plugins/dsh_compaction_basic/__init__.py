"""``compaction-basic``: the token-pressure and summarization backend (``ctx.compaction``).

After DSH's ``@deepseek-ai/dsh-compaction-basic``. Before each step (``agent/pre-step``) it
measures the next request through ``ctx.tokenMeter`` against the routed model's context window;
past ``threshold_ratio`` it first lets the optional ``ctx.toolResultPruner`` shrink oversized
tool results, remeasures, and if still over, summarizes the oldest whole units (keeping a recent
tail of ``retain_ratio`` of the window and never splitting a tool call from its result) through
one ``llm/stream`` request that replays the conversation's own prefix, then replaces them with one
``user/message`` checkpoint inside a ``compaction/start`` … ``compaction/end`` bracket. A provider
``CONTEXT_WINDOW_EXCEEDED`` (``agent/request-error``) forces one maximal balanced reduction and a
retry once the surface changed. ``compact_now()`` does the same for an idle agent (``/compact``).
The shadowed events stay in the log: the transcript keeps them, the model stops seeing them.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from dsh_host.sdk import (
    COMPACTION,
    CONTEXT_WINDOW_EXCEEDED_CODE,
    LLM,
    SESSIONS,
    TOKEN_METER,
    TOOL_RESULT_PRUNER,
    AbortError,
    AgentBusyError,
    CancelToken,
    CompactionEngine,
    CompactionResult,
    CompactionTrigger,
    Context,
    LlmError,
    ManualCompactionError,
    Message,
    Plugin,
    PreStepContext,
    PreStepDecision,
    RequestErrorContext,
    Retry,
    Session,
    TokenMeter,
)

from .config import (
    BasicCompactionConfig,
    ModelCompactionPolicy,
    TargetPolicy,
    TargetPressureConfigError,
    resolve_spec,
    resolve_target_policy,
)
from .region import (
    SurfaceChangedError,
    assert_no_active_compaction,
    compact_surface_region,
    select_compactable_range,
)
from .summarizer import (
    CHECKPOINT_PREAMBLE,
    COMPACTION_INSTRUCTION,
    SUMMARY_CLOSE_TAG,
    SUMMARY_OPEN_TAG,
    SummaryResult,
    frame_summary,
    header_tools,
    summarize_with_llm,
)

__all__ = [
    "CHECKPOINT_PREAMBLE",
    "COMPACTION_INSTRUCTION",
    "SUMMARY_CLOSE_TAG",
    "SUMMARY_OPEN_TAG",
    "BasicCompaction",
    "BasicCompactionConfig",
    "BasicCompactionEngine",
    "ModelCompactionPolicy",
    "SurfaceChangedError",
    "TargetPressureConfigError",
    "frame_summary",
]

log = logging.getLogger("dsh.compaction")


def _routed(session: Session) -> tuple[str, str] | None:
    header = session.request_header()
    if header is None or not header.config.provider or not header.config.model:
        return None
    return header.config.provider, header.config.model


class BasicCompactionEngine(CompactionEngine):
    """The ``compaction`` service of a ``compaction-basic`` row."""

    def __init__(self, ctx: Context, config: BasicCompactionConfig) -> None:
        self._ctx = ctx
        self.config = config
        self._warned: set[str] = set()
        #: per agent: the (turn, step) of the last overflow recovery and its retry count
        self._overflow: weakref.WeakKeyDictionary[Any, tuple[int, int, int]] = (
            weakref.WeakKeyDictionary()
        )
        #: (the config they were resolved from, {(provider, model): policy}): the check before
        #: every step asks for the routed target's policy (docs/decisions.md D49)
        self._policies: tuple[BasicCompactionConfig, dict[tuple[str, str], TargetPolicy]] = (
            config,
            {},
        )

    @property
    def _meter(self) -> TokenMeter:
        meter: TokenMeter = self._ctx.service(TOKEN_METER)
        return meter

    def policy_for(self, provider: str, model: str) -> TargetPolicy:
        """The defaults with the target's override merged over them, resolved once per target
        while :attr:`config` is the same object (a policy is immutable)."""
        config, known = self._policies
        if config is not self.config:
            config, known = self._policies = (self.config, {})
        policy = known.get((provider, model))
        if policy is None:
            policy = known[(provider, model)] = resolve_target_policy(config, provider, model)
        return policy

    # -- the summarizer hook --------------------------------------------------------------
    async def summarize(
        self, messages: Sequence[Message], agent: Any, signal: CancelToken | None
    ) -> SummaryResult:
        """One summary request (override for a template or remote summarizer)."""
        session: Session = agent.session
        routed = _routed(session)
        options = agent.options
        # An exact-target override applies to the routed conversation; otherwise the defaults.
        policy = self.policy_for(*(routed or ("", "")))
        target: tuple[str, str] | None = None
        if policy.summarization_provider:
            target = (policy.summarization_provider, policy.summarization_model)
        elif routed is not None:
            target = routed
        elif options.provider and options.model:
            target = (options.provider, options.model)
        if target is None:
            raise TargetPressureConfigError(
                "",
                "no provider/model available for summarization: set both compaction-basic "
                "summarization fields, route one request, or set both agent provider and model",
            )
        return await summarize_with_llm(
            self._ctx.service(LLM),
            provider=target[0],
            model=target[1],
            max_tokens=policy.max_tokens,
            messages=messages,
            tools=header_tools(session.request_header()),
            session=session,
            signal=signal,
        )

    # -- the seam -------------------------------------------------------------------------
    async def compact_region(
        self, start: int, end: int, agent: Any, signal: CancelToken | None = None
    ) -> CompactionResult:
        return await compact_surface_region(
            agent.session,
            self._meter,
            lambda messages: self.summarize(messages, agent, signal),
            start,
            end,
            owner="current-turn",
        )

    async def compact_if_needed(
        self, agent: Any, trigger: CompactionTrigger, signal: CancelToken
    ) -> CompactionResult | None:
        session: Session = agent.session
        routed = _routed(session)
        if routed is None:
            return None
        policy = self.policy_for(*routed)
        meter = self._meter
        pruner = self._ctx.get(TOOL_RESULT_PRUNER)
        if trigger == "context-overflow":
            if pruner is not None:
                pruner.prune_session(session)
            span = select_compactable_range(session, meter.measure(session), 0)
            if span is None:
                return None
            return await self.compact_region(span[0], span[1], agent, signal)

        window = await self._context_window(policy, signal)
        assert_no_active_compaction(session, "automatic pressure compaction")
        spec = resolve_spec(policy, window)
        measured = meter.measure(session)
        if measured.total_tokens < spec.threshold_tokens:
            return None
        if pruner is not None:
            pruner.prune_session(session)
            measured = meter.measure(session)
            if measured.total_tokens < spec.threshold_tokens:
                return None
        result: CompactionResult | None = None
        for _attempt in range(policy.compaction_retries + 1):
            span = select_compactable_range(session, measured, spec.retain_tokens)
            if span is None:
                return result
            result = await self.compact_region(span[0], span[1], agent, signal)
            measured = meter.measure(session)
            if measured.total_tokens < spec.threshold_tokens:
                return result
        raise ValueError(
            f"compaction still above threshold after {policy.compaction_retries + 1} "
            f"compaction attempts ({measured.total_tokens} estimated tokens >= threshold "
            f"{spec.threshold_tokens})"
        )

    async def compact_now(
        self,
        agent: Any,
        signal: CancelToken | None = None,
        source_command_id: str | None = None,
    ) -> CompactionResult | None:
        """Compact one useful balanced older span of an idle agent (``/compact``).

        Writes nothing when there is no compactable history (returns None). Holds the agent's
        turn admission while it runs and flushes the closed bracket before returning. Expected
        failures raise :class:`~dsh_host._session.compaction.ManualCompactionError` (DSH's
        codes).
        """
        if signal is not None:
            signal.throw_if_aborted()

        async def task(token: CancelToken) -> CompactionResult | None:
            session: Session = agent.session
            span = select_compactable_range(session, self._meter.measure(session), 0)
            if span is None:
                return None
            try:
                return await compact_surface_region(
                    session,
                    self._meter,
                    lambda messages: self.summarize(messages, agent, token),
                    span[0],
                    span[1],
                    owner=None,
                    source_command_id=source_command_id,
                    flush=lambda: self._flush(session),
                )
            except AbortError:
                if signal is not None and signal.aborted:
                    raise
                raise ManualCompactionError(
                    "cancelled", "manual compaction was cancelled"
                ) from None
            except ManualCompactionError as error:
                if token.aborted and not (signal is not None and signal.aborted):
                    raise ManualCompactionError(
                        "cancelled", "manual compaction was cancelled"
                    ) from error
                raise

        try:
            result: CompactionResult | None = await agent.run_maintenance(task, signal=signal)
            return result
        except AgentBusyError as error:
            raise ManualCompactionError(
                "busy", "manual compaction requires an idle agent with no waking queued work"
            ) from error

    # -- helpers --------------------------------------------------------------------------
    async def _flush(self, session: Session) -> None:
        store = self._ctx.get(SESSIONS)
        if store is not None and store.is_live(session):
            await store.flush(session)

    async def _context_window(self, policy: TargetPolicy, signal: CancelToken) -> int:
        try:
            info = await self._ctx.service(LLM).resolve_model(policy.provider, policy.model, signal)
        except LlmError as error:
            raise TargetPressureConfigError(
                policy.key, f"compaction-basic: no context capacity for {policy.key}: {error}"
            ) from error
        if info.context_window is None:
            raise TargetPressureConfigError(
                policy.key,
                f"compaction-basic: no context capacity for {policy.key}; configure "
                "context_window on that adapter model",
                no_window=True,
            )
        window: int = info.context_window
        return window

    # -- automatic listeners --------------------------------------------------------------
    async def before_step(
        self, payload: PreStepContext, next_: Callable[[], Awaitable[PreStepDecision]]
    ) -> PreStepDecision:
        if not payload.signal.aborted:
            try:
                result = await self.compact_if_needed(payload.agent, "pressure", payload.signal)
                if result is not None:
                    _log_result(result, "step pressure")
            except TargetPressureConfigError as error:
                # Once per target; a route that declares no window is common (a local or
                # scripted model), so that case is not a warning.
                if error.target_key not in self._warned:
                    self._warned.add(error.target_key)
                    level = logging.INFO if error.no_window else logging.WARNING
                    log.log(level, "step compaction skipped: %s; continuing the turn", error)
            except Exception as error:
                log.warning("step compaction failed: %s; continuing the turn", error)
        return await next_()

    async def on_request_error(
        self, payload: RequestErrorContext, next_: Callable[[], Awaitable[Any]]
    ) -> Any:
        signal = payload.signal
        if payload.failure.code != CONTEXT_WINDOW_EXCEEDED_CODE or signal.aborted:
            return await next_()
        agent = payload.agent
        session: Session = agent.session
        routed = _routed(session)
        if routed is None:
            return await next_()
        policy = self.policy_for(*routed)
        turn, step, used = self._overflow.get(agent, (0, 0, 0))
        if (turn, step) != (payload.turn, payload.step):
            used = 0  # a successful reply (a new step) starts a fresh recovery sequence
        if used >= policy.max_overflow_retries:
            return await next_()
        generation = session.surface.replace_generation
        try:
            result = await self.compact_if_needed(agent, "context-overflow", signal)
        except Exception as error:
            if not signal.aborted and session.surface.replace_generation > generation:
                log.warning(
                    "context-overflow compaction failed after durable surface progress: %s; "
                    "retrying from the replacement surface",
                    error,
                )
                self._overflow[agent] = (payload.turn, payload.step, used + 1)
                return Retry()
            log.warning(
                "context-overflow compaction failed: %s; %s",
                error,
                "cancellation prevents retry"
                if signal.aborted
                else "preserving the original request error",
            )
            return await next_()
        if signal.aborted or session.surface.replace_generation <= generation:
            return await next_()
        if result is not None:
            _log_result(result, "context overflow recovery")
        self._overflow[agent] = (payload.turn, payload.step, used + 1)
        return Retry()


def _log_result(result: CompactionResult, trigger: str) -> None:
    log.info(
        "compaction (%s): shadowed %d surface nodes (seqs %d-%d, ~%d tokens)",
        trigger,
        len(result.shadowed_seqs),
        result.shadowed_range[0],
        result.shadowed_range[1],
        result.shadowed_token_count,
    )


class BasicCompaction(Plugin):
    """Entry point ``compaction-basic`` (DSH ``@deepseek-ai/dsh-compaction-basic``).

    Provides ``compaction``; injects ``llm``, ``tokenMeter`` and ``sessions``. Add
    ``compaction-tool-result-pruner`` beside it for the model-free pass.
    """

    name = "compaction-basic"
    inject = ("llm", "tokenMeter", "sessions")
    provides = ("compaction",)
    Config = BasicCompactionConfig

    def apply(self, ctx: Context, config: BasicCompactionConfig) -> None:
        engine = BasicCompactionEngine(ctx, config)
        ctx.provide(COMPACTION, engine)
        if config.auto:
            ctx.on("agent/pre-step", engine.before_step)
            ctx.on("agent/request-error", engine.on_request_error)

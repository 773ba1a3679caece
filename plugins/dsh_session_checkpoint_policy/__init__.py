"""``session-checkpoint-policy``: durable before every irreversible advance.

A persistence backend makes ``ctx.sessions.flush(session)`` durable; this
plugin decides *when* it must happen. Three barriers, all fail-closed:

1. ``agent/pre-step`` -- the previous step's assistant message and ordered
   tool results are durable before the next request is even derived.
2. ``llm/stream`` -- a lazy stream that flushes on first consumption, before
   the downstream adapter stream is constructed; a failed flush means the
   adapter never runs (no request leaves the machine unrecorded).
3. ``tools/execute`` for top-level calls (``exec.agent`` set, ``exec.parent``
   unset) -- the recorded ``tool/call`` (and any approval audit pair) is
   durable before the body gets control. If the call was cancelled while the
   flush was pending, the canonical ``ABORTED_BEFORE_DISPATCH`` result is
   returned without entering the body. Nested dispatch shares the outer
   checkpoint.

Concurrent tool checkpoints go through the store's serialized drain, so they
never duplicate sequence numbers.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from dsh_host.sdk import (
    AGENT_PRE_STEP,
    LLM,
    LLM_STREAM,
    SESSION_PERSISTENCE,
    SESSIONS,
    TOOLS,
    TOOLS_EXECUTE,
    Context,
    LlmRequest,
    Next,
    NoConfig,
    Plugin,
    PreStepContext,
    PreStepDecision,
    Session,
    SessionStore,
    StreamChunk,
    StreamNext,
    ToolExecution,
    ToolExecutionResult,
    aborted_before_dispatch_result,
)

__all__ = ["SessionCheckpointPolicy"]


class SessionCheckpointPolicy(Plugin):
    """Entry point ``session-checkpoint-policy``: the three barriers (see the module docstring).

    ``sessionPersistence`` is injected only so the row waits for a backend:
    without one, ``flush`` has no listener and a "checkpoint" would protect
    nothing while looking as if it did.
    """

    name = "session-checkpoint-policy"
    inject = (LLM.name, SESSIONS.name, TOOLS.name, SESSION_PERSISTENCE.name)
    Config = NoConfig

    def apply(self, ctx: Context, config: NoConfig) -> None:
        sessions = ctx.service(SESSIONS)

        async def before_step(
            payload: PreStepContext, next_: Next[PreStepDecision]
        ) -> PreStepDecision:
            # A failure propagates: the turn ends `error` before another request starts.
            await sessions.flush(payload.agent.session)
            return await next_()

        def around_stream(
            request: LlmRequest, next_: StreamNext[StreamChunk]
        ) -> AsyncIterator[StreamChunk]:
            session = _live_session(sessions, request)
            if session is None:
                return next_()
            return _flush_then_relay(sessions, session, next_)

        async def around_execute(
            exec_: ToolExecution, next_: Next[ToolExecutionResult]
        ) -> ToolExecutionResult:
            if exec_.agent is None or exec_.parent is not None:
                return await next_()  # nested: the outer call's checkpoint covers it
            await sessions.flush(exec_.agent.session)
            if exec_.signal.aborted:
                return aborted_before_dispatch_result()
            return await next_()

        ctx.on(AGENT_PRE_STEP, before_step)
        ctx.on(LLM_STREAM, around_stream)
        ctx.on(TOOLS_EXECUTE, around_execute)


def _live_session(sessions: SessionStore, request: LlmRequest) -> Session | None:
    """The live session a request belongs to, or None (then no flush is needed).

    A request carrying a session object that is not *the* live one with its id
    (a detached copy, a fork's parent rebuilt elsewhere) is not ours to flush:
    flushing the live namesake would checkpoint a different log.
    """
    if request.session_id is None:
        return None
    session = sessions.get(request.session_id)
    if session is None or (request.session is not None and session is not request.session):
        return None
    return session


async def _flush_then_relay(
    sessions: SessionStore, session: Session, next_: StreamNext[StreamChunk]
) -> AsyncIterator[StreamChunk]:
    # Runs on the first __anext__: the adapter stream is constructed only after
    # the flush resolved, so a failed flush means no request was ever sent.
    await sessions.flush(session)
    downstream = next_()
    try:
        async for chunk in downstream:
            yield chunk
    finally:
        close = getattr(downstream, "aclose", None)
        if close is not None:
            await close()

"""The LLM seam: one streaming call, interceptable, and one way to assemble its result.

Pieces
------
- :class:`LlmRuntime` -- the ``llm`` service (provided by the ``llm`` plugin row).
  Model adapters register provider routes with it; every call goes through
  the ``llm/stream`` stream-waterfall, whose default is the routed adapter.
- :class:`LlmRequest` -- what middleware and adapters receive: the call
  config, the derived messages, system prompt, tool schemas, the live
  ``session`` (so middleware knows which session to flush) and a
  :class:`~dsh_host._cancel.CancelToken` ``signal``. Frozen.
- Stream chunks (type-tagged msgspec Structs, defined once in
  :mod:`dsh_host._session.messages` because the log stores them verbatim):
  ``block-start``, ``text-delta``, ``reasoning-delta``, ``tool-call-delta``,
  ``block-end``, ``usage``, ``finish``.
- :class:`BlockAssembler` -- the one chunk -> :class:`AssistantMessage` algorithm.
- :class:`LlmAdapter` -- the base class of model backends; :class:`LlmError`
  -- a failure with a stable code (``AUTH``, ``RATE_LIMIT``, ``NO_ADAPTER``...).

The call, as the agent loop makes it
------------------------------------
::

    from contextlib import aclosing
    from dsh_host._llm import BlockAssembler, LlmRequest

    # NO_ADAPTER from prepare_call: middleware may serve the route; use ctx.llm.stream
    prepared = await ctx.llm.prepare_call(config, signal=token)
    request = LlmRequest(
        config=prepared.config,               # adapter defaults materialized
        messages=session.derive_messages(),
        system=system_prompt,
        tools=tool_schemas,
        session=session,                      # session_id is taken from it
        signal=token,
        agent_loop=True,
    )
    assembler = BlockAssembler()
    async with aclosing(prepared.stream(request)) as chunks:   # or ctx.llm.stream(request)
        async for chunk in chunks:
            token.throw_if_aborted()
            assembler.push(chunk, time_ms)    # time_ms: epoch ms, for the embedded stream
    if token.aborted:
        message = assembler.interrupted_message(provider=..., model=...)   # may be None
    else:
        message = assembler.message(provider=..., model=...)
        usage, finish = assembler.usage, assembler.finish   # finish: StopFinish | ... | ErrorFinish
        stream = assembler.stream_records()  # the compact ``stream`` of assistant/message

Guarantees of the stream
------------------------
- Adapter failures (including cancellation) never raise out of the stream:
  they arrive as one terminal ``finish`` chunk whose reason is ``ErrorFinish``
  or ``AbortedFinish`` (aborted when ``request.signal`` is aborted) carrying an
  :class:`LlmFailure`. Nothing follows a ``finish`` chunk.
- Failures of ``llm/stream`` middleware, of the consumer, and of the adapter's
  cleanup on early close *are* raised.
- Nothing runs before the first ``__anext__``; an early exit (``aclose``) closes
  the whole chain down to the adapter.

Writing ``llm/stream`` middleware
---------------------------------
::

    def around(request: LlmRequest, next) -> AsyncIterator[StreamChunk]:
        async def run():
            await something_first(request.session)     # e.g. a durability checkpoint
            async with aclosing(next()) as inner:
                async for chunk in inner:
                    yield chunk
        return run()

    ctx.on(LLM_STREAM, around)    # from dsh_host._llm import LLM_STREAM

Writing an adapter
------------------
Subclass :class:`LlmAdapter`, implement ``stream(request)`` as an async
generator, raise :class:`LlmError` on failure, honour ``request.signal`` (wrap
your own awaits in ``signal.linked_scope()``, never a ``yield``), and register
from a plugin that injects ``llm``::

    ctx.llm.register_adapter(["my-provider"], MyAdapter(...), owner=ctx)
"""

from __future__ import annotations

from .assembler import BlockAssembler, IncompleteBlockError, assemble
from .errors import (
    ABORTED_CODE,
    CONTEXT_WINDOW_EXCEEDED_CODE,
    EMPTY_RESPONSE_CODE,
    INVALID_CREDENTIAL_CODE,
    MODEL_NOT_FOUND_CODE,
    QUOTA_EXCEEDED_CODE,
    UNKNOWN_CODE,
    LlmError,
    failure_of,
)
from .keys import LLM, LLM_STREAM
from .records import MIN_PACKED_RUN, pack_stream, unpack_stream
from .runtime import (
    AdapterRegistration,
    LlmRuntime,
    PreparedCall,
    failure_chunk,
    resolve_call_config,
)
from .types import (
    DEFAULT_RETRYABLE_CODES,
    MAX_TIMER_DELAY_MS,
    LlmAdapter,
    LlmRequest,
    ModelInfo,
    ProviderInfo,
    Purpose,
    RetryBackoffConfig,
    RetryPolicy,
    RetryPolicyConfig,
)
from .wire import user_agent

__all__ = [
    "ABORTED_CODE",
    "CONTEXT_WINDOW_EXCEEDED_CODE",
    "DEFAULT_RETRYABLE_CODES",
    "EMPTY_RESPONSE_CODE",
    "INVALID_CREDENTIAL_CODE",
    "LLM",
    "LLM_STREAM",
    "MAX_TIMER_DELAY_MS",
    "MIN_PACKED_RUN",
    "MODEL_NOT_FOUND_CODE",
    "QUOTA_EXCEEDED_CODE",
    "UNKNOWN_CODE",
    "AdapterRegistration",
    "BlockAssembler",
    "IncompleteBlockError",
    "LlmAdapter",
    "LlmError",
    "LlmRequest",
    "LlmRuntime",
    "ModelInfo",
    "PreparedCall",
    "ProviderInfo",
    "Purpose",
    "RetryBackoffConfig",
    "RetryPolicy",
    "RetryPolicyConfig",
    "assemble",
    "failure_chunk",
    "failure_of",
    "pack_stream",
    "resolve_call_config",
    "unpack_stream",
    "user_agent",
]

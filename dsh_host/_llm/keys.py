"""The event the llm layer dispatches: ``llm/stream``, declared by the ``llm`` plugin."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dsh_host._bus import StreamWaterfall
from dsh_host._context import ServiceKey

if TYPE_CHECKING:
    from dsh_host._session.messages import StreamChunk

    from .runtime import LlmRuntime
    from .types import LlmRequest

__all__ = ["LLM", "LLM_STREAM"]

#: The ``llm`` service.
LLM: ServiceKey[LlmRuntime] = ServiceKey("llm")

#: ``def listener(request, next) -> AsyncIterator[StreamChunk]``; the default is the routed adapter.
LLM_STREAM: StreamWaterfall[LlmRequest, StreamChunk] = StreamWaterfall(
    "llm/stream", "(request) -> chunk stream"
)

"""The ``llm`` plugin: provides the :class:`~dsh_host._llm.runtime.LlmRuntime` service.

It registers no adapter itself; model adapters are plugins of their own
(``llm-scripted``, ``llm-openai-compatible``) that inject ``llm`` and register
their provider routes with it, so a composition chooses its models by listing
rows.
"""

from __future__ import annotations

from dsh_host._context import Context
from dsh_host._plugin import NoConfig, Plugin

from .keys import LLM, LLM_STREAM
from .runtime import LlmRuntime

__all__ = ["LlmPlugin"]


class LlmPlugin(Plugin):
    name = "llm"
    provides = ("llm",)
    Config = NoConfig

    def apply(self, ctx: Context, config: NoConfig) -> None:
        ctx.declare_event(LLM_STREAM)
        ctx.provide(LLM, LlmRuntime(ctx))

"""``llm-scripted``: a deterministic model that answers from a script.

Registers one provider route (default ``scripted``) with ``ctx.llm``. The
script comes from a YAML/JSON file (``path``) or inline (``responses``); see
:mod:`.script` for the format and the README for the chunks it streams.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from dsh_host.sdk import LLM, Context, Plugin

from .adapter import ScriptedAdapter, response_chunks, split_text, tool_call_id
from .script import (
    Script,
    ScriptedError,
    ScriptedResponse,
    ScriptedToolCall,
    ScriptedUsage,
    ScriptError,
    load_script,
    validate_responses,
)

__all__ = [
    "LlmScripted",
    "LlmScriptedConfig",
    "Script",
    "ScriptError",
    "ScriptedAdapter",
    "ScriptedError",
    "ScriptedResponse",
    "ScriptedToolCall",
    "ScriptedUsage",
    "load_script",
    "response_chunks",
    "split_text",
    "tool_call_id",
]

_Name = Annotated[str, msgspec.Meta(min_length=1)]


class LlmScriptedConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    #: script file (YAML, or JSON if it ends in .json); relative to the current directory
    path: str | None = None
    #: the script inline, instead of ``path``
    responses: list[ScriptedResponse] | None = None
    #: the provider route this row serves (two scripted rows need two names)
    provider: _Name = "scripted"
    #: the model name advertised as the route's default
    model: _Name = "scripted"
    #: reasoning efforts the model accepts (None: a request naming an effort is refused)
    reasoning_efforts: list[_Name] | None = None
    #: the context window the model declares (``request/context``, compaction pressure)
    context_window: Annotated[int, msgspec.Meta(gt=0)] | None = None
    #: whether the model reads images and PDFs (false: a text-only model, D31)
    vision: bool = True
    #: answers for summarization requests (``purpose: compaction``), served in order from
    #: their own queue so a script need not know when compaction happens; without it they
    #: take the next entry of ``responses`` like any other request
    compaction_responses: list[ScriptedResponse] | None = None


class LlmScripted(Plugin):
    name = "llm-scripted"
    inject = ("llm",)
    Config = LlmScriptedConfig

    def apply(self, ctx: Context, config: LlmScriptedConfig) -> None:
        if (config.path is None) == (config.responses is None):
            raise ScriptError(
                "llm-scripted needs exactly one of `path` (a script file) or `responses` "
                "(the script inline) in its config"
            )
        if config.path is not None:
            responses = load_script(config.path)
            source = config.path
        else:
            assert config.responses is not None
            responses = config.responses
            source = f"the inline script of row {ctx.row_id!r}"
            validate_responses(responses, f"llm-scripted row {ctx.row_id!r} config")
        if config.compaction_responses is not None:
            validate_responses(
                config.compaction_responses,
                f"llm-scripted row {ctx.row_id!r} config compaction_responses",
            )
        self.adapter = ScriptedAdapter(
            responses,
            source=source,
            model=config.model,
            reasoning_efforts=config.reasoning_efforts,
            context_window=config.context_window,
            vision=config.vision,
            compaction_responses=config.compaction_responses,
        )
        ctx.service(LLM).register_adapter([config.provider], self.adapter, owner=ctx)

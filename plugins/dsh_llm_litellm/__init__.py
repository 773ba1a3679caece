"""``llm-litellm``: the long tail of providers (Gemini, Bedrock, Vertex, Azure, Ollama, ...) through
the ``litellm`` library.

Registers one provider route (default ``litellm``) with ``ctx.llm``; ``dsh run --model
litellm:gemini/gemini-2.0-flash`` composes this row (the plugin declares that spelling with
``model_route``). The request's model is LiteLLM's own spelling (``provider/model``) and is sent
as is. Needs the library: ``pip install 'dsh-harness[litellm]'``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

import msgspec

from dsh_host.sdk import (
    Context,
    ModelRoute,
    Plugin,
    RetryPolicyConfig,
    missing_sdk,
    register_adapter,
    resolve_base_url,
)

if TYPE_CHECKING:
    from .adapter import AdapterSettings, LiteLLMAdapter

__all__ = ["REASONING_EFFORTS", "LlmLiteLLM", "LlmLiteLLMConfig", "settings_of"]

#: Efforts LiteLLM maps onto each provider's own knob (``off``: none is sent).
REASONING_EFFORTS: tuple[str, ...] = ("off", "low", "medium", "high")

_Name = Annotated[str, msgspec.Meta(min_length=1)]
_Positive = Annotated[int, msgspec.Meta(gt=0)]


class LlmLiteLLMConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    #: the endpoint LiteLLM sends to (``api_base``), e.g. a local Ollama or vLLM server or an
    #: OpenAI-compatible gateway. Unset: the provider's own default (and LiteLLM's variables)
    base_url: str | None = None
    #: the route's default model, in LiteLLM's spelling (``provider/model``)
    model: _Name = "openai/gpt-4o-mini"
    #: environment variable holding the API key. Unset: LiteLLM reads the provider's usual
    #: variable itself (GEMINI_API_KEY, AWS_* for Bedrock, none for Ollama, ...)
    api_key_env: _Name | None = None
    #: the provider route this row serves
    provider: _Name = "litellm"
    #: name used in messages (default: "LiteLLM")
    display_name: _Name = "LiteLLM"
    #: effort materialized into requests that name none (null: the provider's default)
    reasoning_effort: Literal["off", "low", "medium", "high"] | None = None
    #: max_tokens for requests that name none (null: the provider's default)
    max_tokens: _Positive | None = None
    #: the model's context window, reported to the loop (null: unknown)
    context_window: _Positive | None = None
    #: whether the row's models read images and PDFs (null: by the model's family; D31)
    vision: bool | None = None
    connect_timeout_ms: _Positive = 30_000
    #: longest silence tolerated while waiting for the next chunk
    stream_idle_timeout_ms: _Positive = 300_000
    #: the route's retry policy, executed by the ``llm-retry`` row (LiteLLM's retries are off)
    retry_policy: RetryPolicyConfig = msgspec.field(default_factory=RetryPolicyConfig)
    #: extra request headers (a gateway's); cannot replace User-Agent
    headers: dict[str, str] = msgspec.field(default_factory=dict)


def settings_of(config: LlmLiteLLMConfig) -> AdapterSettings:
    """Resolve a row's config into adapter settings (validating what msgspec cannot)."""
    from .adapter import AdapterSettings

    base_url = ""
    if config.base_url is not None:
        base_url = resolve_base_url(
            config.base_url,
            env="",
            default="http://127.0.0.1:11434",
            row="llm-litellm",
            appends="LiteLLM appends the provider's own path",
        )
    return AdapterSettings.of(config, base_url=base_url)


class LlmLiteLLM(Plugin):
    name = "llm-litellm"
    inject = ("llm",)
    Config = LlmLiteLLMConfig
    model_route = ModelRoute(prefix="litellm", provider="litellm")

    adapter: LiteLLMAdapter

    def apply(self, ctx: Context, config: LlmLiteLLMConfig) -> None:
        try:
            from .adapter import LiteLLMAdapter, start_runner
        except ImportError as exc:
            raise missing_sdk("llm-litellm", "LiteLLM", "litellm") from exc
        settings = settings_of(config)
        self.adapter = LiteLLMAdapter(settings, start_runner(settings))
        register_adapter(ctx, config.provider, self.adapter)

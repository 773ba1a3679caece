"""``llm-openai-responses``: OpenAI's Responses API, natively, through the official ``openai`` SDK.

Registers one provider route (default ``openai``) with ``ctx.llm``; ``dsh run --model
openai-responses:gpt-5-mini`` composes this row (the plugin declares that spelling with
``model_route``). The request's model is sent as is; ``model`` in the config is only the route's
default. Needs the SDK: ``pip install 'dsh-harness[openai]'``.
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
    from .adapter import AdapterSettings, OpenAIResponsesAdapter

__all__ = ["DEFAULT_BASE_URL", "LlmOpenAIResponses", "LlmOpenAIResponsesConfig", "settings_of"]

#: OpenAI's public API, the default endpoint.
DEFAULT_BASE_URL = "https://api.openai.com/v1"
#: The SDK's own variable for another endpoint, honoured when ``base_url`` is not set.
BASE_URL_ENV = "OPENAI_BASE_URL"

_Name = Annotated[str, msgspec.Meta(min_length=1)]
_Positive = Annotated[int, msgspec.Meta(gt=0)]


class LlmOpenAIResponsesConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    #: endpoint base (the SDK appends /responses). Unset: $OPENAI_BASE_URL, else OpenAI's
    base_url: str | None = None
    #: the route's default model (requests send their own model name)
    model: _Name = "gpt-5-mini"
    #: environment variable holding the API key
    api_key_env: _Name = "OPENAI_API_KEY"
    #: the provider route this row serves
    provider: _Name = "openai"
    #: name used in messages
    display_name: _Name = "OpenAI"
    #: effort materialized into requests that name none (null: the model's default)
    reasoning_effort: Literal["off", "minimal", "low", "medium", "high"] | None = None
    #: max_output_tokens for requests that name none (null: the model's limit)
    max_tokens: _Positive | None = None
    #: the model's context window, reported to the loop (null: unknown)
    context_window: _Positive | None = None
    #: whether the row's models read images and PDFs (null: by the model's family; D31)
    vision: bool | None = None
    connect_timeout_ms: _Positive = 30_000
    #: longest silence tolerated while waiting for the next event
    stream_idle_timeout_ms: _Positive = 300_000
    #: the route's retry policy, executed by the ``llm-retry`` row (the SDK's retries are off)
    retry_policy: RetryPolicyConfig = msgspec.field(default_factory=RetryPolicyConfig)
    #: extra request headers (a gateway's, an organization's); cannot replace User-Agent
    headers: dict[str, str] = msgspec.field(default_factory=dict)


def settings_of(config: LlmOpenAIResponsesConfig) -> AdapterSettings:
    """Resolve a row's config into adapter settings (validating what msgspec cannot)."""
    from .adapter import AdapterSettings

    base_url = resolve_base_url(
        config.base_url,
        env=BASE_URL_ENV,
        default=DEFAULT_BASE_URL,
        row="llm-openai-responses",
        appends="the SDK appends /responses",
    )
    return AdapterSettings.of(config, base_url=base_url)


class LlmOpenAIResponses(Plugin):
    name = "llm-openai-responses"
    inject = ("llm",)
    Config = LlmOpenAIResponsesConfig
    model_route = ModelRoute(prefix="openai-responses", provider="openai")

    adapter: OpenAIResponsesAdapter

    def apply(self, ctx: Context, config: LlmOpenAIResponsesConfig) -> None:
        try:
            from .adapter import OpenAIResponsesAdapter, make_client
        except ImportError as exc:
            raise missing_sdk("llm-openai-responses", "OpenAI", "openai") from exc
        settings = settings_of(config)
        self.adapter = OpenAIResponsesAdapter(settings, make_client(settings))
        register_adapter(ctx, config.provider, self.adapter)

"""``llm-anthropic``: Anthropic's Messages API, natively, through the official ``anthropic`` SDK.

Registers one provider route (default ``anthropic``) with ``ctx.llm``; ``dsh run --model
anthropic:claude-sonnet-4-5`` composes this row (the plugin declares that spelling with
``model_route``). The request's model is sent as is; ``model`` in the config is only the
route's default. Needs the SDK: ``pip install 'dsh-harness[anthropic]'``.
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
    from .adapter import AdapterSettings, AnthropicAdapter

__all__ = [
    "DEFAULT_BASE_URL",
    "LlmAnthropic",
    "LlmAnthropicConfig",
    "settings_of",
]

#: Anthropic's public API, the default endpoint.
DEFAULT_BASE_URL = "https://api.anthropic.com"
#: The SDK's own variable for another endpoint, honoured when ``base_url`` is not set.
BASE_URL_ENV = "ANTHROPIC_BASE_URL"

_Name = Annotated[str, msgspec.Meta(min_length=1)]
_Positive = Annotated[int, msgspec.Meta(gt=0)]


class LlmAnthropicConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    #: endpoint base (the SDK appends /v1/messages). Unset: $ANTHROPIC_BASE_URL, else Anthropic
    base_url: str | None = None
    #: the route's default model (requests send their own model name)
    model: _Name = "claude-sonnet-4-5"
    #: environment variable holding the API key
    api_key_env: _Name = "ANTHROPIC_API_KEY"
    #: the provider route this row serves
    provider: _Name = "anthropic"
    #: name used in messages
    display_name: _Name = "Anthropic"
    #: effort materialized into requests that name none (null: no extended thinking)
    reasoning_effort: Literal["off", "low", "medium", "high"] | None = None
    #: max_tokens for requests that name none (the API requires one)
    max_tokens: _Positive = 8_192
    #: the model's context window, reported to the loop (null: unknown)
    context_window: _Positive | None = 200_000
    #: whether the row's models read images and PDFs (null: by the model's family; D31)
    vision: bool | None = None
    connect_timeout_ms: _Positive = 30_000
    #: longest silence tolerated while waiting for the next event
    stream_idle_timeout_ms: _Positive = 300_000
    #: the route's retry policy, executed by the ``llm-retry`` row (the SDK's retries are off)
    retry_policy: RetryPolicyConfig = msgspec.field(default_factory=RetryPolicyConfig)
    #: extra request headers (e.g. ``anthropic-beta``); cannot replace User-Agent
    headers: dict[str, str] = msgspec.field(default_factory=dict)


def settings_of(config: LlmAnthropicConfig) -> AdapterSettings:
    """Resolve a row's config into adapter settings (validating what msgspec cannot)."""
    from .adapter import AdapterSettings

    base_url = resolve_base_url(
        config.base_url,
        env=BASE_URL_ENV,
        default=DEFAULT_BASE_URL,
        row="llm-anthropic",
        appends="the SDK appends /v1/messages",
    )
    return AdapterSettings.of(config, base_url=base_url)


class LlmAnthropic(Plugin):
    name = "llm-anthropic"
    inject = ("llm",)
    Config = LlmAnthropicConfig
    model_route = ModelRoute(prefix="anthropic", provider="anthropic")

    adapter: AnthropicAdapter

    def apply(self, ctx: Context, config: LlmAnthropicConfig) -> None:
        try:
            from .adapter import AnthropicAdapter, make_client
        except ImportError as exc:
            raise missing_sdk("llm-anthropic", "Anthropic", "anthropic") from exc
        settings = settings_of(config)
        self.adapter = AnthropicAdapter(settings, make_client(settings))
        register_adapter(ctx, config.provider, self.adapter)

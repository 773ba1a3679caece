"""``llm-openai-compatible``: chat completions over SSE (DeepSeek's public API by default).

Registers one provider route (default ``deepseek-official``, DSH's route name) with ``ctx.llm``. The
request's model name is sent as is; ``model`` in the config is only the
route's default (what a caller gets when it names none).
"""

from __future__ import annotations

from typing import Annotated, Literal
from urllib.parse import urlsplit

import httpx
import msgspec

from dsh_host.sdk import (
    DONE,
    ChunkTranslator,
    ConfigError,
    Context,
    ModelRoute,
    Plugin,
    RetryPolicyConfig,
    map_finish_reason,
    map_usage,
    register_adapter,
    resolve_base_url,
    serialize_messages,
)

from .adapter import AdapterSettings, OpenAICompatibleAdapter
from .serialize import REASONING_EFFORTS, serialize_request
from .sse import SseDecoder

__all__ = [
    "DEFAULT_BASE_URL",
    "DONE",
    "REASONING_EFFORTS",
    "AdapterSettings",
    "ChunkTranslator",
    "LlmOpenAICompatible",
    "LlmOpenAICompatibleConfig",
    "OpenAICompatibleAdapter",
    "SseDecoder",
    "map_finish_reason",
    "map_usage",
    "serialize_messages",
    "serialize_request",
    "settings_of",
]

#: DeepSeek's public API, the default endpoint.
DEFAULT_BASE_URL = "https://api.deepseek.com"
#: Environment variable that overrides the default endpoint when ``base_url`` is not set.
BASE_URL_ENV = "DEEPSEEK_BASE_URL"

_Name = Annotated[str, msgspec.Meta(min_length=1)]
_Positive = Annotated[int, msgspec.Meta(gt=0)]
_Effort = Literal["off", "low", "high", "max"]


class LlmOpenAICompatibleConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    #: endpoint base; ``/chat/completions`` is appended. Unset: $DEEPSEEK_BASE_URL, else DeepSeek
    base_url: str | None = None
    #: the route's default model (requests send their own model name)
    model: _Name = "deepseek-chat"
    #: environment variable holding the API key (null: send no Authorization header)
    api_key_env: _Name | None = "DEEPSEEK_API_KEY"
    #: the provider route this row serves
    provider: _Name = "deepseek-official"
    #: name used in messages (default: "DeepSeek" for DeepSeek's API, else the host name)
    display_name: _Name | None = None
    #: DeepSeek thinking mode sent when the request names no effort (null: send nothing)
    thinking: Literal["enabled", "disabled"] | None = None
    #: effort materialized into requests that name none (null: provider default)
    reasoning_effort: _Effort | None = None
    #: max_tokens materialized into requests that name none (null: provider default)
    max_tokens: _Positive | None = None
    #: the model's context window, reported to the loop (null: unknown)
    context_window: _Positive | None = None
    #: whether the row's models read images and PDFs (null: by the model's family; D31)
    vision: bool | None = None
    connect_timeout_ms: _Positive = 30_000
    #: longest silence tolerated while waiting for the next byte (DSH default: 5 minutes)
    stream_idle_timeout_ms: _Positive = 300_000
    #: the route's retry policy (DSH ``retryPolicy``), executed by the ``llm-retry`` row
    retry_policy: RetryPolicyConfig = msgspec.field(default_factory=RetryPolicyConfig)
    #: extra request headers (e.g. for a gateway); cannot replace User-Agent
    headers: dict[str, str] = msgspec.field(default_factory=dict)


def settings_of(config: LlmOpenAICompatibleConfig) -> AdapterSettings:
    """Resolve a row's config into adapter settings (validating what msgspec cannot)."""
    base_url = resolve_base_url(
        config.base_url,
        env=BASE_URL_ENV,
        default=DEFAULT_BASE_URL,
        row="llm-openai-compatible",
        appends="the adapter appends /chat/completions",
    )
    if config.thinking == "disabled" and config.reasoning_effort not in (None, "off"):
        raise ConfigError(
            f"llm-openai-compatible: reasoning_effort {config.reasoning_effort!r} needs "
            "thinking, but thinking is disabled; drop one of the two"
        )
    host = urlsplit(base_url).hostname or base_url
    display = config.display_name or ("DeepSeek" if host.endswith("deepseek.com") else host)
    return AdapterSettings.of(
        config, base_url=base_url, display_name=display, thinking=config.thinking
    )


class LlmOpenAICompatible(Plugin):
    name = "llm-openai-compatible"
    inject = ("llm",)
    Config = LlmOpenAICompatibleConfig
    model_route = ModelRoute(prefix="openai-compatible", provider="deepseek-official")

    def apply(self, ctx: Context, config: LlmOpenAICompatibleConfig) -> None:
        settings = settings_of(config)
        client = httpx.AsyncClient(timeout=settings.timeout(), follow_redirects=False)
        self.adapter = OpenAICompatibleAdapter(settings, client)
        register_adapter(ctx, config.provider, self.adapter)

"""``llm-openai-responses``: OpenAI's Responses API, natively, through the official ``openai`` SDK.

Registers one provider route (default ``openai``) with ``ctx.llm``; ``dsh run --model
openai-responses:gpt-5-mini`` composes this row (the plugin declares that spelling with
``model_route``). The request's model is sent as is; ``model`` in the config is only the route's
default. Needs the SDK: ``pip install 'dsh-harness[openai]'``.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Annotated, Literal
from urllib.parse import urlsplit

import msgspec

from dsh_host.context import Context
from dsh_host.errors import ConfigError, install_hint
from dsh_host.llm import RetryPolicyConfig
from dsh_host.llm.keys import LLM
from dsh_host.plugin import ModelRoute, Plugin

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

    raw = config.base_url
    if raw is None:
        raw = os.environ.get(BASE_URL_ENV) or DEFAULT_BASE_URL
    url = raw.strip().rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(
            f"llm-openai-responses: base_url {raw!r} is not an http(s) URL; write it like "
            f"{DEFAULT_BASE_URL} (the SDK appends /responses)"
        )
    return AdapterSettings(
        base_url=url,
        model=config.model,
        api_key_env=config.api_key_env,
        display_name=config.display_name,
        reasoning_effort=config.reasoning_effort,
        max_tokens=config.max_tokens,
        context_window=config.context_window,
        connect_timeout_ms=config.connect_timeout_ms,
        stream_idle_timeout_ms=config.stream_idle_timeout_ms,
        retry_policy=config.retry_policy.resolve(),
        headers=dict(config.headers),
    )


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
            raise ConfigError(
                "llm-openai-responses needs OpenAI's SDK, which is not installed: "
                f"{install_hint('openai')} (or pip install openai)"
            ) from exc
        settings = settings_of(config)
        client = make_client(settings)
        ctx.effect(client.close, "close the OpenAI client")
        self.adapter = OpenAIResponsesAdapter(settings, client)
        ctx.service(LLM).register_adapter([config.provider], self.adapter, owner=ctx)

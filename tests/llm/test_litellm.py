"""What only ``llm-litellm`` has (the contract suite covers the rest): the asyncio bridge under
trio, the request LiteLLM sends for a dsh request, retries off, the model spelling refused
before any request, and nothing printed on dsh's stdout.

Upstream is the loopback chat-completions server (LiteLLM's ``openai/`` provider pointed at
its ``base_url``): a real HTTP server, LiteLLM in between unchanged.
"""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from dsh_host import PluginHost, Row, open_host
from dsh_host._session import TextDeltaChunk
from dsh_host._session.messages import ToolSchema

from .llm_helpers import collect, request, terminal_failure
from .provider_wires import OpenAIWire
from .sse_server import SseServer, sse, text_events

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]

KEY_ENV = "DSH_TEST_LITELLM_KEY"
MODEL = "openai/gpt-4o-mini"
CHAT = OpenAIWire("chat", "llm-openai-compatible", "x", "x")


@asynccontextmanager
async def litellm_host(base_url: str, **config: Any) -> AsyncIterator[PluginHost]:
    row = {"base_url": base_url, "api_key_env": KEY_ENV, "model": MODEL, **config}
    async with open_host([Row(name="llm"), Row(id="model", name="llm-litellm", config=row)]) as host:
        yield host


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "litellm-key")


async def test_the_request_litellm_sends_for_a_dsh_request() -> None:
    tool = ToolSchema(name="bash", description="run", parameters={"type": "object"})
    with SseServer([sse(text_events("ok"))]) as server:
        async with litellm_host(server.url, headers={"X-Gateway": "g1"}) as host:
            chunks = await collect(host.ctx.llm.stream(request(
                "litellm", MODEL, system="be brief", tools=(tool,), max_tokens=64,
                temperature=0.5,
            )))
    assert [c.text for c in chunks if isinstance(c, TextDeltaChunk)] == ["ok"]
    [sent] = server.requests
    assert sent.path == "/chat/completions"
    assert sent.headers["authorization"] == "Bearer litellm-key"
    assert sent.headers["x-gateway"] == "g1"
    body = sent.body
    assert body["model"] == "gpt-4o-mini"  # LiteLLM strips its provider prefix
    assert body["messages"] == [
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
    ]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert (body["max_tokens"], body["temperature"]) == (64, 0.5)
    assert body["tools"][0]["function"]["name"] == "bash"


async def test_litellm_does_not_retry_on_its_own() -> None:
    """A 503 is one request: llm-retry owns retries (and logs them); LiteLLM's are off."""
    with SseServer([CHAT.error("SERVER", "busy"), sse(text_events("late"))]) as server:
        async with litellm_host(server.url) as host:
            chunks = await collect(host.ctx.llm.stream(request("litellm", MODEL)))
        assert len(server.requests) == 1
    assert terminal_failure(chunks)[1].code == "SERVER"


async def test_a_model_litellm_cannot_route_is_refused_before_any_request() -> None:
    with SseServer([sse(text_events("never"))]) as server:
        async with litellm_host(server.url) as host:
            chunks = await collect(host.ctx.llm.stream(request("litellm", "no-such-model-xyz")))
        assert server.requests == []
    _, failure = terminal_failure(chunks)
    assert failure.code == "MODEL_NOT_FOUND"
    assert "provider/model" in failure.message and "litellm:gemini/" in failure.message


async def test_an_error_prints_nothing_on_stdout(capfd: pytest.CaptureFixture[str]) -> None:
    """LiteLLM prints a help banner with each exception unless told not to; stdout is dsh's
    (``dsh run --json``)."""
    with SseServer([CHAT.error("AUTH", "bad key")]) as server:
        async with litellm_host(server.url) as host:
            chunks = await collect(host.ctx.llm.stream(request("litellm", MODEL)))
    _, failure = terminal_failure(chunks)
    assert failure.code == "AUTH" and KEY_ENV in failure.message
    assert capfd.readouterr().out == ""


async def test_each_row_runs_litellm_on_its_own_loop_thread_stopped_with_the_row() -> None:
    with SseServer([sse(text_events("a"))]) as server:
        async with litellm_host(server.url) as host:
            await collect(host.ctx.llm.stream(request("litellm", MODEL)))
            running = [t for t in threading.enumerate() if t.name.startswith("dsh-litellm-")]
            assert len(running) == 1
        assert not running[0].is_alive()


def test_the_row_refuses_a_base_url_that_is_not_http() -> None:
    from dsh_llm_litellm import LlmLiteLLMConfig, settings_of

    from dsh_host.errors import ConfigError

    with pytest.raises(ConfigError, match="llm-litellm: base_url 'localhost:11434'"):
        settings_of(LlmLiteLLMConfig(base_url="localhost:11434"))
    assert json.dumps(settings_of(LlmLiteLLMConfig()).base_url) == '""'

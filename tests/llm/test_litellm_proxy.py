"""The adapters against an independent translator: the real LiteLLM proxy (``litellm --config``,
a subprocess on 127.0.0.1) in front of LLMock's OpenAI-compatible API.

The proxy's model list routes ``dsh-proxied`` to ``openai/llmock-model`` at LLMock's ``/v1``,
so every answer here was written by LLMock, translated by LiteLLM into the wire the adapter
speaks, and parsed by our adapter:

- ``llm-anthropic`` → the proxy's ``/v1/messages`` (Anthropic Messages, streamed) → LLMock;
- ``llm-openai-responses`` → the proxy's ``/v1/responses`` → LLMock;
- ``llm-openai-compatible`` → the proxy's ``/v1/chat/completions`` → LLMock.

LLMock's journal shows what reached it: the upstream model name, a streamed request. Which
LLMock endpoint the proxy calls is LiteLLM's choice (for an ``openai/`` model it answers
``/v1/messages`` through the Responses API), so the path is asserted only for
``/v1/chat/completions``.

The proxy's own ``mock_response`` models do not stream on ``/v1/messages`` and
``/v1/responses``; that is why LLMock stands behind it. What the proxy itself limits (no adapter
fault; each adapter's README says it under Known Limitations): ``/v1/responses`` needs PyNaCl
(without it every stream is ``response.failed`` "No module named 'nacl'"), and ``/v1/messages``
reports cache reads and writes as 0 for a non-Anthropic model. The proxy starts once for this module
(it takes seconds to import); LLMock's fixture resets its script and journal per test.
Run with ``-n 0`` when run alone; the module is ``slow``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from llmock.scenarios import Reply, ToolCall

from dsh_host import Row, open_host
from dsh_host._llm import BlockAssembler
from dsh_host._session import StopFinish, StreamChunk, TextBlock, ToolCallBlock, ToolCallsFinish
from dsh_host._session.messages import (
    ToolResultBlock,
    ToolSchema,
    UserMessage,
    UserSource,
    new_message_id,
)

from .llm_helpers import collect, request, user

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

KEY_ENV = "DSH_TEST_LITELLM_PROXY_KEY"
MODEL = "dsh-proxied"  #: the proxy's model name
UPSTREAM = "llmock-model"  #: what the proxy asks LLMock for
#: A hang guard for the proxy's start, not a timing assertion: a start that never answers
#: fails with the proxy's log instead of hanging the suite.
START_GUARD_S = 240.0
#: Long enough for LLMock's estimate (4 characters a token) to count input tokens, so a usage
#: that lost its input count on the way through the proxy shows.
PROMPT = "Please look at the repository and tell me what the file a.txt says, briefly."
READ_FILE = ToolSchema(
    name="read_file", description="Read a file.",
    parameters={"type": "object", "properties": {"path": {"type": "string"}},
                "required": ["path"]},
)
BASH = ToolSchema(
    name="bash", description="Run a command.",
    parameters={"type": "object", "properties": {"command": {"type": "string"}},
                "required": ["command"]},
)


@dataclass(frozen=True)
class Proxy:
    url: str
    key: str


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _log_tail(log: Path) -> str:
    return log.read_text(encoding="utf-8", errors="replace")[-4000:]


@pytest.fixture(scope="module")
def proxy(llmock_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    work = tmp_path_factory.mktemp("litellm-proxy")
    config = work / "config.yaml"
    config.write_text(
        "model_list:\n"
        f"  - model_name: {MODEL}\n"
        "    litellm_params:\n"
        f"      model: openai/{UPSTREAM}\n"
        f"      api_base: {llmock_server.base_url('openai')}\n"
        "      api_key: sk-llmock\n",
        encoding="utf-8",
    )
    key = "sk-" + os.urandom(32).hex()  # the proxy refuses to start without a strong master key
    port = _free_port()
    log = work / "proxy.log"
    env = {**os.environ, "LITELLM_MASTER_KEY": key,
           # the bundled price map: no fetch from GitHub at start
           "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    launcher = "import sys; from litellm import run_server; sys.exit(run_server())"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-c", launcher, "--config", str(config),
             "--host", "127.0.0.1", "--port", str(port)],
            stdout=out, stderr=subprocess.STDOUT, env=env, cwd=work,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_GUARD_S
        while True:
            try:
                if httpx.get(f"{url}/health/liveliness", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if process.poll() is not None:
                tail = _log_tail(log)
                if "ModuleNotFoundError" in tail or "is not installed" in tail:
                    pytest.skip(f"the LiteLLM proxy cannot be imported (pip install "
                                f"'litellm[proxy]'):\n{tail[-600:]}")
                pytest.fail(f"the LiteLLM proxy exited with {process.returncode}:\n{tail}")
            if time.monotonic() > deadline:
                pytest.fail(f"the LiteLLM proxy did not answer on {url} within "
                            f"{START_GUARD_S:.0f}s:\n{_log_tail(log)}")
            time.sleep(0.2)
        yield Proxy(url=url, key=key)
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture
def mock(llmock: Any, proxy: Proxy, monkeypatch: pytest.MonkeyPatch) -> Any:
    """LLMock, reset for this test, behind the running proxy; the adapters' key is the proxy's."""
    monkeypatch.setenv(KEY_ENV, proxy.key)
    return llmock


#: (plugin, base URL path on the proxy, provider route) of each adapter under test.
ADAPTERS = [
    ("llm-anthropic", "", "anthropic"),
    ("llm-openai-responses", "/v1", "openai"),
    ("llm-openai-compatible", "/v1", "deepseek-official"),
]


async def run(plugin: str, base_url: str, provider: str, *tools: ToolSchema,
              messages: Sequence[Any] = ()) -> BlockAssembler:
    row = {"base_url": base_url, "api_key_env": KEY_ENV}
    async with open_host([Row(name="llm"), Row(id="model", name=plugin, config=row)]) as host:
        chunks: list[StreamChunk] = await collect(
            host.ctx.llm.stream(request(provider, MODEL, messages=messages or [user(PROMPT)],
                                        tools=tools, max_tokens=256))
        )
    assembler = BlockAssembler()
    for chunk in chunks:
        assembler.push(chunk)
    return assembler


def calls(result: BlockAssembler) -> list[tuple[str, Any]]:
    return [(b.name, json.loads(b.arguments)) for b in result.blocks()
            if isinstance(b, ToolCallBlock)]


def assert_usage(result: BlockAssembler) -> None:
    """Usage came through: LLMock's input and output counts, both non-zero."""
    usage = result.usage
    assert usage is not None
    assert usage.input_tokens > 0, usage
    assert usage.output_tokens > 0, usage


def reached_llmock(mock: Any) -> Any:
    """The one model request LLMock received: the upstream model, streamed."""
    [record] = [r for r in mock.requests if r.model is not None]
    assert record.model == UPSTREAM
    assert record.stream is True
    assert record.status == 200
    return record


# -- llm-anthropic → /v1/messages ------------------------------------------------------------


async def test_anthropic_text_through_the_proxy(mock: Any, proxy: Proxy) -> None:
    mock.reply("Hello from behind the proxy.")
    result = await run("llm-anthropic", proxy.url, "anthropic")
    assert result.blocks() == (TextBlock(text="Hello from behind the proxy."),)
    assert result.finish == StopFinish()
    assert_usage(result)
    reached_llmock(mock)


async def test_anthropic_tool_call_through_the_proxy(mock: Any, proxy: Proxy) -> None:
    mock.add(Reply(text="Reading.", tool_calls=(ToolCall("read_file", {"path": "a.txt"}),)))
    result = await run("llm-anthropic", proxy.url, "anthropic", READ_FILE)
    assert result.blocks()[0] == TextBlock(text="Reading.")
    assert calls(result) == [("read_file", {"path": "a.txt"})]
    assert result.finish == ToolCallsFinish()
    assert_usage(result)
    sent = reached_llmock(mock).body
    assert "read_file" in json.dumps(sent["tools"])  # our tool schema survived the translation


# -- llm-openai-responses → /v1/responses ----------------------------------------------------


async def test_responses_text_through_the_proxy(mock: Any, proxy: Proxy) -> None:
    mock.reply("Answered via Responses.")
    result = await run("llm-openai-responses", f"{proxy.url}/v1", "openai")
    assert result.blocks() == (TextBlock(text="Answered via Responses."),)
    assert result.finish == StopFinish()
    assert_usage(result)
    reached_llmock(mock)


async def test_responses_function_call_through_the_proxy(mock: Any, proxy: Proxy) -> None:
    mock.add(Reply(tool_calls=(ToolCall("read_file", {"path": "b.txt"}),)))
    result = await run("llm-openai-responses", f"{proxy.url}/v1", "openai", READ_FILE)
    assert calls(result) == [("read_file", {"path": "b.txt"})]
    assert result.finish == ToolCallsFinish()
    assert_usage(result)
    assert "read_file" in json.dumps(reached_llmock(mock).body["tools"])


# -- llm-openai-compatible → /v1/chat/completions --------------------------------------------


async def test_chat_completions_text_through_the_proxy(mock: Any, proxy: Proxy) -> None:
    mock.reply("Plain chat answer.")
    result = await run("llm-openai-compatible", f"{proxy.url}/v1", "deepseek-official")
    assert result.blocks() == (TextBlock(text="Plain chat answer."),)
    assert result.finish == StopFinish()
    assert_usage(result)
    assert reached_llmock(mock).path == "/v1/chat/completions"


async def test_chat_completions_parallel_tool_calls_through_the_proxy(
    mock: Any, proxy: Proxy
) -> None:
    mock.add(Reply(tool_calls=(ToolCall("read_file", {"path": "a.txt"}),
                               ToolCall("bash", {"command": "ls -la /tmp"}))))
    result = await run("llm-openai-compatible", f"{proxy.url}/v1", "deepseek-official",
                       READ_FILE, BASH)
    assert calls(result) == [("read_file", {"path": "a.txt"}), ("bash", {"command": "ls -la /tmp"})]
    assert result.finish == ToolCallsFinish()
    assert_usage(result)
    assert reached_llmock(mock).path == "/v1/chat/completions"


# -- a tool result carried back through the proxy --------------------------------------------


@pytest.mark.parametrize(("plugin", "path", "provider"), ADAPTERS,
                         ids=[plugin for plugin, _, _ in ADAPTERS])
async def test_a_tool_result_reaches_llmock_through_the_proxy(
    mock: Any, proxy: Proxy, plugin: str, path: str, provider: str
) -> None:
    mock.add(Reply(tool_calls=(ToolCall("read_file", {"path": "a.txt"}),)))
    mock.reply("a.txt says hello.")
    first = await run(plugin, proxy.url + path, provider, READ_FILE)
    [call] = [b for b in first.blocks() if isinstance(b, ToolCallBlock)]
    result = UserMessage(
        id=new_message_id(),
        content=(ToolResultBlock(tool_call_id=call.id,
                                 content=(TextBlock(text="hello from a.txt, line 1"),)),),
        source=UserSource(),
    )
    history = [user(PROMPT), first.message(provider=provider, model=MODEL), result]
    second = await run(plugin, proxy.url + path, provider, READ_FILE, messages=history)
    assert second.blocks() == (TextBlock(text="a.txt says hello."),)
    assert second.finish == StopFinish()
    records = [r for r in mock.requests if r.model is not None]
    assert len(records) == 2, records
    # the output, paired with the call's id, as the upstream API received it
    assert tool_outputs(records[1]) == {call.id: "hello from a.txt, line 1"}


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content)


def tool_outputs(record: Any) -> dict[str, str]:
    """{call id: output text} of the tool results in one request LLMock received, from a
    Responses body (``function_call_output`` items) or a chat body (``role: tool`` messages)."""
    body = record.body
    if record.path == "/v1/responses":
        return {item["call_id"]: _text(item["output"]) for item in body["input"]
                if item.get("type") == "function_call_output"}
    return {message["tool_call_id"]: _text(message["content"]) for message in body["messages"]
            if message.get("role") == "tool"}

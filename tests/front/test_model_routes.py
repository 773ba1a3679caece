"""``--model anthropic:MODEL`` from the CLI and ``Agent(model="anthropic:MODEL")``, against
LLMock's Anthropic Messages endpoint (an independent server with a journal of requests).

The spelling is declared by the plugin (``LlmAnthropic.model_route``): the front doors compose
its row and route the agent to its provider without naming the plugin anywhere themselves.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from llmock.scenarios import Fail

from dsh_host import Agent
from dsh_host._front import MODEL_SPECS, parse_model
from dsh_host._session import CompletedReason
from dsh_host.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
MODEL = "claude-sonnet-4-6"


@pytest.mark.parametrize(
    ("prefix", "plugin", "provider"),
    [
        ("anthropic", "llm-anthropic", "anthropic"),
        ("openai-responses", "llm-openai-responses", "openai"),
        ("openai-compatible", "llm-openai-compatible", "deepseek-official"),
        ("litellm", "llm-litellm", "litellm"),
    ],
)
def test_the_spec_composes_the_declaring_plugins_row(
    prefix: str, plugin: str, provider: str
) -> None:
    choice = parse_model(f"{prefix}:{MODEL}")
    assert (choice.row.name, choice.row.id, choice.row.config) == (
        plugin, "model", {"model": MODEL}
    )
    assert (choice.provider, choice.model) == (provider, MODEL)
    assert f"{prefix}:MODEL" in MODEL_SPECS
    with pytest.raises(ConfigError, match=f"{prefix}:MODEL"):
        parse_model(f"{prefix}:")


def test_cli_run_with_anthropic_retries_an_overload_through_llm_retry(
    llmock: Any, tmp_path: Path
) -> None:
    """The shipped composition: a 529 is retried by llm-retry (logged), not by the SDK."""
    from cli.cli_helpers import dsh, json_lines

    llmock.add(Fail(529, message="Overloaded"))
    llmock.reply("Hello from Claude.")
    result = dsh(
        "run", "hi", "--model", f"anthropic:{MODEL}", "--json",
        "--config", str(REPO / "configs" / "default.yml"), cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    assert payload["turnEnd"] == {"kind": "completed"}
    assert [(r.status, r.model) for r in llmock.requests] == [(529, MODEL), (200, MODEL)]
    events = json_lines(
        dsh("sessions", "show", payload["sessionId"], "--view", "events", "--json",
            cwd=tmp_path).stdout
    )
    [retry] = [e["data"] for e in events if e["type"] == "llm/retry"]
    assert (retry["failure"]["code"], retry["failure"]["status"]) == ("SERVER", 529)
    headers = [e["data"] for e in events if e["type"] == "request/header"]
    assert {h["header"]["config"]["provider"] for h in headers} == {"anthropic"}


@pytest.mark.anyio
async def test_agent_with_an_anthropic_model(llmock: Any) -> None:
    llmock.reply("It is 5.")
    async with Agent(f"anthropic:{MODEL}", store=None) as agent:
        result = await agent.run("What is 2+3?")
    assert result.output == "It is 5."
    assert result.turn_end == CompletedReason()
    assert llmock.last_request.path == "/anthropic/v1/messages"


@pytest.mark.parametrize(("prefix", "package", "extra"), [
    ("anthropic", "anthropic", "dsh-harness[anthropic]"),
    ("openai-responses", "openai", "dsh-harness[openai]"),
    ("litellm", "litellm", "dsh-harness[litellm]"),
])
def test_a_missing_sdk_is_one_clear_line(
    prefix: str, package: str, extra: str, tmp_path: Path
) -> None:
    """Without the provider's SDK (an optional extra) the row refuses to load, naming the extra:
    no traceback, no request."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    argv = ["run", "hi", "--model", f"{prefix}:m", "--root", str(tmp_path / "sessions"),
            "--workspace", str(workspace)]
    code = (
        f"import sys; sys.modules[{package!r}] = None\n"  # importing the SDK now fails
        f"from dsh_host._cli import main; sys.exit(main({argv!r}))"
    )
    env = {k: v for k, v in os.environ.items() if k != "DSH_SESSION_ROOT"}
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert f"pip install '{extra}'" in result.stderr


@pytest.mark.anyio
async def test_agent_with_a_litellm_model(llmock: Any) -> None:
    """``litellm:openai/MODEL``: LiteLLM's OpenAI route, its endpoint from OPENAI_BASE_URL
    (LLMock's), the key LiteLLM reads itself (the row's api_key_env unset)."""
    llmock.reply("Routed by LiteLLM.")
    async with Agent("litellm:openai/gpt-4o-mini", store=None) as agent:
        result = await agent.run("hi")
    assert result.output == "Routed by LiteLLM."
    assert result.turn_end == CompletedReason()
    assert (llmock.last_request.model, llmock.last_request.path) == (
        "gpt-4o-mini", "/v1/chat/completions"
    )

"""mcp-client against real servers: discovery, naming, calls and result mapping (issue 21).

The third-party reference servers (``@modelcontextprotocol/server-everything`` from npm,
``mcp-server-time`` from PyPI) are started by the plugin itself, confined ``read-only`` by the
real ``sandbox-local`` row, exactly as a user's composition would start them.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os

import pytest
from dsh_mcp_client import project_text, public_tool_name

from dsh_host import Row, open_host
from dsh_host._cancel import CancelToken
from dsh_host._session import ImageBlock, TextBlock
from dsh_host._tools import ToolExecutionInput
from dsh_host.errors import BootError

from .mcp_helpers import (
    bridge_of,
    call,
    everything_stdio,
    fixture_stdio,
    mcp_host,
    needs_everything,
    text_of,
    time_stdio,
)

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]


# --------------------------------------------------------------------------- naming (pure)


async def test_clean_names_are_verbatim() -> None:
    assert public_tool_name("github", "create_issue") == "mcp__github__create_issue"
    assert public_tool_name("every-thing", "get-sum") == "mcp__every-thing__get-sum"


async def test_lossy_names_get_the_identity_hash() -> None:
    digest = hashlib.sha256(b"web\0search.v2").hexdigest()[:12]
    assert public_tool_name("web", "search.v2") == f"mcp__web__search_v2_{digest}"
    # two raw names that normalise alike stay distinct
    assert public_tool_name("web", "a.b") != public_tool_name("web", "a/b")
    long = public_tool_name("srv", "x" * 100)
    assert len(long) == 64 and long.startswith("mcp__srv__xxx")
    assert long != public_tool_name("srv", "x" * 101)
    # a pure function: same input, same name
    assert public_tool_name("srv", "x" * 100) == long


async def test_projection_keeps_order_and_names_what_it_cannot_show() -> None:
    text = project_text(
        [
            {"type": "text", "text": "one"},
            {"type": "resource_link", "name": "Doc", "uri": "file:///doc"},
            {"type": "image", "mimeType": "image/png", "data": "AAAA"},
            {"type": "audio", "mimeType": "audio/wav", "data": "AAAA"},
            {"type": "resource", "resource": {"uri": "x://y", "text": "z"}},
            {"type": "hologram"},
            "not an object",
            {"type": "text", "text": "two"},
        ],
        "tool",
    )
    assert text.split("\n") == [
        "one",
        "Resource link: Doc (file:///doc)",
        "[image unavailable: image/png; this result is shown as text; raw image data "
        "remains available to programmatic callers]",
        "[audio result unsupported: audio/wav; raw audio data remains available to programmatic "
        "callers]",
        "[embedded resource unsupported; raw resource data remains available to programmatic "
        "callers]",
        "[unsupported MCP content type: hologram]",
        "[unsupported MCP content block: expected an object]",
        "two",
    ]
    assert project_text([], "tool") == "(tool returned no model-visible content)"


# --------------------------------------------------------------------------- server-everything


@needs_everything
async def test_everything_discovery_names_and_calls(anyio_backend: str) -> None:
    async with mcp_host(everything_stdio()) as host:
        names = host.ctx.tools.names()
        for raw in ("echo", "get-sum", "get-resource-links", "trigger-long-running-operation"):
            assert f"mcp__everything__{raw}" in names
        schema = {s.name: s for s in host.ctx.tools.schemas()}["mcp__everything__echo"]
        assert schema.description == "Echoes back the input string"
        assert "message" in schema.parameters["properties"]

        echoed = await call(host, "mcp__everything__echo", {"message": "hi there"})
        assert not echoed.is_error
        assert text_of(echoed) == "Echo: hi there"
        assert echoed.value["content"][0] == {"type": "text", "text": "Echo: hi there"}

        summed = await call(host, "mcp__everything__get-sum", {"a": 2, "b": 40})
        assert "42" in text_of(summed)

        links = await call(host, "mcp__everything__get-resource-links", {"count": 2})
        lines = text_of(links).split("\n")
        assert lines[1].startswith("Resource link: ") and "(demo://resource/" in lines[1]
        assert len(lines) == 3

        image = await call(host, "mcp__everything__get-tiny-image", {})
        # the model sees the image itself (D31); the canonical value keeps the MCP block
        assert any(isinstance(block, ImageBlock) for block in image.content)
        assert any(block.get("type") == "image" for block in image.value["content"])


@needs_everything
async def test_arguments_breaking_the_servers_schema_are_refused_locally(
    anyio_backend: str,
) -> None:
    async with mcp_host(everything_stdio()) as host:
        result = await call(host, "mcp__everything__echo", {})  # message missing
        assert result.error is not None and result.error.info is not None
        assert result.error.info.code == "INVALID_ARGS"


async def test_an_image_block_reaches_the_model_as_an_image(anyio_backend: str) -> None:
    """An MCP ``image`` content block becomes DSH's image block with its bytes in the record
    (D31), in its place among the text; bytes that are no image become a diagnostic."""
    async with mcp_host(fixture_stdio()) as host:
        good = await call(host, "mcp__fixture__picture", {})
        broken = await call(host, "mcp__fixture__picture", {"broken": True})
    assert not good.is_error
    caption, image = good.content
    assert caption == TextBlock(text="a red square")
    assert isinstance(image, ImageBlock)
    record = dict(image.attachment)
    served = base64.b64decode(record["data"])
    assert served.startswith(b"\x89PNG") and record["bytes"] == len(served)
    assert record["mediaType"] == "image/png"
    assert record["attachmentId"] == "sha256-" + hashlib.sha256(served).hexdigest()
    assert good.value["content"][1]["type"] == "image"  # the canonical value keeps the block
    assert not broken.is_error
    assert [type(block) for block in broken.content] == [TextBlock, TextBlock]
    assert text_of(broken).startswith("a red square[image unavailable: image/png; ")
    assert "not a PNG, JPEG, GIF or WebP image" in text_of(broken)


async def test_is_error_is_a_tool_error(anyio_backend: str) -> None:
    async with mcp_host(fixture_stdio()) as host:
        result = await call(host, "mcp__fixture__fail", {})
        assert result.is_error
        assert result.error is not None and result.error.info is not None
        assert result.error.info.code == "MCP_TOOL_ERROR"
        assert "the fixture refuses" in text_of(result)


@needs_everything
async def test_read_only_hint_makes_a_tool_concurrency_safe(anyio_backend: str) -> None:
    async with mcp_host(everything_stdio()) as host:
        tools = host.ctx.tools

        def mode(name: str, args: dict[str, object]) -> str:
            return str(
                tools.execution_mode(
                    ToolExecutionInput(call_id="c", name=name, arguments=args, signal=CancelToken())
                )
            )

        assert mode("mcp__everything__echo", {"message": "x"}) == "parallel"  # readOnlyHint
        assert mode("mcp__everything__toggle-simulated-logging", {}) == "exclusive"


@needs_everything
async def test_the_server_sees_only_allow_listed_environment(
    anyio_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgres://secret")
    monkeypatch.setenv("DSH_SESSION_ROOT", "/somewhere")
    monkeypatch.setenv("EXTRA_TOKEN", "allowed-by-row")
    config = everything_stdio(env={"FROM_ROW": "row value"}, envAllow=["EXTRA_*"])
    async with mcp_host(config) as host:
        result = await call(host, "mcp__everything__get-env", {})
        env = json.loads(text_of(result))
    assert "DATABASE_URL" not in env and "DSH_SESSION_ROOT" not in env
    assert env["FROM_ROW"] == "row value"
    assert env["EXTRA_TOKEN"] == "allowed-by-row"
    assert env["PATH"] == os.environ["PATH"]


@needs_everything
async def test_two_servers_with_one_raw_name_coexist(anyio_backend: str) -> None:
    second = everything_stdio(serverName="everything2")
    async with mcp_host(everything_stdio(), second) as host:
        assert {"mcp__everything__echo", "mcp__everything2__echo"} <= set(host.ctx.tools.names())
        result = await call(host, "mcp__everything2__echo", {"message": "b"})
        assert text_of(result) == "Echo: b"


async def test_a_duplicate_server_name_fails_the_later_row(anyio_backend: str) -> None:
    with pytest.raises(BootError, match="serverName 'fixture' is already used"):
        async with mcp_host(fixture_stdio(), fixture_stdio()):
            pass


# --------------------------------------------------------------------------- mcp-server-time


async def test_mcp_server_time(anyio_backend: str) -> None:
    async with mcp_host(time_stdio()) as host:
        assert {"mcp__time__get_current_time", "mcp__time__convert_time"} <= set(
            host.ctx.tools.names()
        )
        result = await call(host, "mcp__time__get_current_time", {"timezone": "Europe/Paris"})
        assert not result.is_error, text_of(result)
        body = json.loads(text_of(result))
        assert body["timezone"] == "Europe/Paris"
        converted = await call(
            host,
            "mcp__time__convert_time",
            {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"},
        )
        assert json.loads(text_of(converted))["target"]["datetime"].endswith("21:00:00+09:00")


# --------------------------------------------------------------------------- startup failures


async def test_a_server_that_cannot_start_activates_with_no_tools(anyio_backend: str) -> None:
    config = fixture_stdio(command="/bin/false", reconnect={"enabled": False})
    async with mcp_host(config) as host:
        assert not [n for n in host.ctx.tools.names() if n.startswith("mcp__")]
        result = await call(host, "mcp__fixture__whoami", {})
        assert result.error is not None and result.error.info is not None
        assert result.error.info.code == "UNKNOWN_TOOL"


async def test_fail_on_startup_error_fails_the_first_step(anyio_backend: str) -> None:
    from dsh_mcp_client import McpStartupError

    config = fixture_stdio(
        command="/bin/false", failOnStartupError=True, reconnect={"enabled": False}
    )
    rows = [Row(name="tools"), Row(name="mcp-client", config={**config, "sandbox": "danger-full-access"})]
    async with open_host(rows) as host:
        with pytest.raises(McpStartupError, match="startup failed and failOnStartupError is set: ") as raised:
            await bridge_of(host, "fixture").wait_started()
    assert "Connection closed" in str(raised.value)  # /bin/false: an executable, no server


async def test_config_errors_are_clear() -> None:
    import msgspec
    from dsh_mcp_client import McpClientConfig

    with pytest.raises(msgspec.ValidationError, match=r"serverName 'a b' must match"):
        msgspec.convert({"server_name": "a b", "transport": "stdio", "command": "x"}, McpClientConfig)
    with pytest.raises(msgspec.ValidationError, match="transport stdio needs `command`"):
        msgspec.convert({"server_name": "a", "transport": "stdio"}, McpClientConfig)
    with pytest.raises(msgspec.ValidationError, match="streamable-http needs `url`"):
        msgspec.convert({"server_name": "a", "transport": "streamable-http"}, McpClientConfig)


async def test_camel_case_keys_load(anyio_backend: str) -> None:
    config = fixture_stdio(toolCallTimeoutMs=5000, failOnStartupError=True,
                           reconnect={"initialDelayMs": 100, "maxDelayMs": 1000, "maxAttempts": 2})
    async with mcp_host(config, extra_rows=(Row(name="timeout-policy"),)) as host:
        definition = host.ctx.tools.get("mcp__fixture__whoami")
        assert definition is not None and definition.timeout_ms == 5000


async def test_schema_keywords_outside_the_subset_are_described_not_dropped() -> None:
    from dsh_mcp_client.schema import lower_input_schema

    lowered, changed = lower_input_schema({
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "properties": {
            "count": {"type": "number", "minimum": 1, "maximum": 10, "description": "How many"},
            "either": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        },
        "required": ["count"],
    })
    assert changed
    count = lowered["properties"]["count"]
    assert count == {"type": "number",
                     "description": "How many (checked by the server: minimum 1, maximum 10)"}
    assert lowered["properties"]["either"] == {
        "description": '(checked by the server: anyOf [{"type":"string"},{"type":"null"}])'
    }
    plain = {"type": "object", "properties": {"m": {"type": "string"}}, "required": ["m"]}
    assert lower_input_schema(plain) == (plain, False)


@needs_everything
async def test_everything_schemas_keep_their_constraints_for_the_model(anyio_backend: str) -> None:
    async with mcp_host(everything_stdio()) as host:
        schema = {s.name: s for s in host.ctx.tools.schemas()}["mcp__everything__get-resource-links"]
        count = schema.parameters["properties"]["count"]
        assert "(checked by the server: " in count["description"] and "maximum" in count["description"]
        result = await call(host, "mcp__everything__get-resource-links", {"count": 99})
        assert result.is_error  # the server enforces what the registry could not


def test_a_restricted_composition_cannot_choose_the_server_command() -> None:
    from dsh_host._loader import check_rows, parse_rows
    from dsh_host.errors import ConfigError

    text = (
        "- id: mcp\n  name: mcp-client\n  config:\n    serverName: x\n    transport: stdio\n"
        "    command: /bin/evil\n"
    )
    rows = parse_rows(text, "dsh.yml", restricted="honoured only from a named file")
    with pytest.raises(ConfigError, match="command of mcp-client chooses an executable"):
        check_rows(rows)
    http = "- id: mcp\n  name: mcp-client\n  config: {serverName: x, transport: streamable-http, url: 'http://127.0.0.1:1/mcp'}\n"
    assert check_rows(parse_rows(http, "dsh.yml", restricted="named file only"))

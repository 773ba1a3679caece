from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from dsh_host import Row, open_host, open_host_from_yaml
from dsh_host._context import FiberState
from dsh_host._loader import accept_camel_keys, parse_rows
from dsh_host._session.keys import SESSION_EVENT
from dsh_host._tools.keys import TOOLS_EXECUTE
from dsh_host.errors import (
    BootError,
    ConfigError,
    DuplicateRowIdError,
    HandlerKindError,
    InactiveContextError,
    PluginRegistrationError,
    UnknownPluginError,
)

from . import sample_plugins

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def clear_journal() -> None:
    sample_plugins.JOURNAL.clear()


def test_malformed_yaml_names_the_file_line_and_problem_not_pyyamls_stream() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_rows("- name: sessions\n  config: {a: [1,\n", "x.yml")
    assert str(caught.value) == (
        "x.yml:3:1: malformed YAML: expected the node content, but found '<stream end>' "
        "(while parsing a flow node)"
    )
    assert "unicode string" not in str(caught.value)


def test_top_level_must_be_a_list() -> None:
    with pytest.raises(ConfigError, match="must be a top-level YAML array of entries"):
        parse_rows("name: sessions\n", "x.yml")


def test_unknown_row_key_names_the_line_and_key() -> None:
    text = "- name: sessions\n- nmae: oops\n"
    with pytest.raises(ConfigError, match=r"x\.yml:2 \(row 2\): .*nmae: unknown key"):
        parse_rows(text, "x.yml")


def test_unknown_tag_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"malformed YAML|could not determine a constructor"):
        parse_rows("- name: !!python/name:os.system x\n", "x.yml")


def test_env_tag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DSH_TEST_ROOT", "/srv/sessions")
    rows = parse_rows(
        "- name: a\n  config: {root: !env DSH_TEST_ROOT, other: !env [DSH_TEST_UNSET_X, dflt]}\n"
    )
    assert rows[0].row.config == {"root": "/srv/sessions", "other": "dflt"}
    monkeypatch.delenv("DSH_TEST_ROOT")
    with pytest.raises(ConfigError, match="DSH_TEST_ROOT is not set"):
        parse_rows("- name: a\n  config: {root: !env DSH_TEST_ROOT}\n")


async def test_config_type_error_gives_key_path() -> None:
    rows = [Row(id="greet", name="host.sample_plugins:Echo", config={"times": "three"})]
    with pytest.raises(ConfigError) as info:
        async with open_host(rows):
            pass
    assert str(info.value) == 'row \'greet\' (host.sample_plugins:Echo): config.times: expected int, got str'


async def test_unknown_config_key() -> None:
    rows = [Row(id="greet", name="host.sample_plugins:Echo", config={"greting": "x"})]
    with pytest.raises(ConfigError, match=r"config\.greting: unknown key"):
        async with open_host(rows):
            pass


async def test_unknown_plugin_lists_installed_ones() -> None:
    with pytest.raises(UnknownPluginError) as info:
        async with open_host([Row(name="no-such-plugin")]):
            pass
    assert "no-such-plugin" in str(info.value)
    assert "session-persistence-jsonl" in str(info.value)


async def test_dsh_spellings_are_aliases() -> None:
    from dsh_host._loader import canonical_name

    assert canonical_name("@deepseek-ai/dsh-session-checkpoint-policy") == "session-checkpoint-policy"
    assert canonical_name("dsh-sandbox-local") == "sandbox-local"


class Inner(msgspec.Struct, forbid_unknown_fields=True):
    initial_delay_ms: int = 0


class Outer(msgspec.Struct, forbid_unknown_fields=True):
    base_url: str = ""
    retry_policy: Inner | None = None
    rules: list[Inner] = []
    headers: dict[str, str] = {}


class Camel(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    api_key: str = ""


def test_camel_case_config_keys_are_aliases_of_snake_case_ones() -> None:
    """D21: a row copied from a DSH composition keeps working, at every nesting level."""
    raw = {
        "baseURL": "http://x",
        "retryPolicy": {"initialDelayMs": 5},
        "rules": [{"initialDelayMs": 1}],
        "headers": {"xTraceId": "kept as written"},
    }
    assert accept_camel_keys(raw, Outer) == {
        "base_url": "http://x",
        "retry_policy": {"initial_delay_ms": 5},
        "rules": [{"initial_delay_ms": 1}],
        "headers": {"xTraceId": "kept as written"},
    }
    assert msgspec.convert(accept_camel_keys(raw, Outer), Outer).retry_policy == Inner(5)
    assert accept_camel_keys({"apiKey": "k"}, Camel) == {"apiKey": "k"}  # already its spelling
    assert accept_camel_keys({"unknownKey": 1}, Outer) == {"unknownKey": 1}  # left to msgspec
    with pytest.raises(ConfigError, match=r"config\.retry_policy: initialDelayMs and "
                       r"initial_delay_ms are the same key"):
        accept_camel_keys({"retry_policy": {"initialDelayMs": 1, "initial_delay_ms": 2}}, Outer)


async def test_camel_case_alias_clash_fails_the_row() -> None:
    rows = [Row(id="model", name="llm-openai-compatible",
                config={"apiKeyEnv": "A", "api_key_env": "B"})]
    with pytest.raises(ConfigError, match=r"row 'model' \(llm-openai-compatible\): config: "
                       "apiKeyEnv and api_key_env are the same key"):
        async with open_host([Row(name="llm"), *rows]):
            pass


async def test_duplicate_row_ids() -> None:
    rows = [Row(id="x", name="host.sample_plugins:Echo"), Row(id="x", name="host.sample_plugins:Echo")]
    with pytest.raises(DuplicateRowIdError, match="duplicate loader entry id: x"):
        async with open_host(rows):
            pass


async def test_two_rows_same_plugin_two_instances() -> None:
    rows = [
        Row(id="one", name="host.sample_plugins:Around", config={"label": "one"}),
        Row(id="two", name="host.sample_plugins:Around", config={"label": "two"}),
    ]
    async with open_host(rows) as host:
        a, b = host.fibers
        assert a.instance is not b.instance
        trace: list[str] = []

        async def body() -> str:
            trace.append("body")
            return "ok"

        assert await host.bus.waterfall(TOOLS_EXECUTE, trace, body) == "ok"
        assert trace == ["enter one", "enter two", "body", "exit two", "exit one"]


async def test_inject_waits_then_mounts_in_order() -> None:
    rows = [Row(id="needs", name="host.sample_plugins:NeedsEcho"), Row(id="echo", name="host.sample_plugins:Echo")]
    async with open_host(rows) as host:
        assert [f.state for f in host.fibers] == [FiberState.ACTIVE, FiberState.ACTIVE]
        assert sample_plugins.JOURNAL == ["apply echo echo hi", "apply needs-echo sees hi"]
        await host.unload("echo")
        assert host.fibers[0].state is FiberState.PENDING
        assert host.fibers[0].describe_state() == "waiting for service: echo"
    assert sample_plugins.JOURNAL[-2:] == ["dispose needs-echo", "dispose echo echo"]


async def test_unmet_inject_strict_boot_fails_and_lenient_reports() -> None:
    rows = [Row(id="needs", name="host.sample_plugins:NeedsEcho")]
    with pytest.raises(BootError, match="waiting for service: echo"):
        async with open_host(rows):
            pass
    async with open_host(rows, strict=False) as host:
        assert host.problems() == ["row 'needs' (host.sample_plugins:NeedsEcho): waiting for service: echo"]


async def test_apply_failure_undoes_partial_registrations_others_keep_running() -> None:
    rows = [Row(id="boom", name="host.sample_plugins:Exploding"), Row(id="echo", name="host.sample_plugins:Echo")]
    async with open_host(rows, strict=False) as host:
        boom, echo = host.fibers
        assert boom.state is FiberState.FAILED
        assert "kaboom during apply" in boom.describe_state()
        assert echo.state is FiberState.ACTIVE
        assert host.ctx.get("boom") is None
        assert host.bus.listeners(SESSION_EVENT) == []
        assert "undo exploding" in sample_plugins.JOURNAL


async def test_wrong_listener_kind_fails_the_row() -> None:
    rows = [Row(name="sessions"), Row(id="bad", name="host.sample_plugins:AsyncOnEmit")]
    async with open_host(rows, strict=False) as host:
        fiber = host.fibers[1]
        assert fiber.state is FiberState.FAILED
        assert isinstance(fiber.error, HandlerKindError)


async def test_registering_after_dispose_is_refused() -> None:
    async with open_host([Row(id="echo", name="host.sample_plugins:Echo")]) as host:
        ctx = host.fibers[0].ctx
        await host.unload("echo")
        with pytest.raises(InactiveContextError):
            ctx.on("session/event", lambda s, e: None)


async def test_malformed_plugin_caught_at_registration() -> None:
    with pytest.raises(PluginRegistrationError):
        async with open_host([Row(name="host.sample_plugins:JOURNAL")]):
            pass


async def test_disabled_rows_are_not_loaded(tmp_path: Path) -> None:
    config = tmp_path / "c.yml"
    config.write_text("- id: e\n  name: host.sample_plugins:Echo\n  disabled: true\n")
    async with open_host_from_yaml(config) as host:
        assert host.fibers[0].state is FiberState.DISABLED
        assert sample_plugins.JOURNAL == []


@pytest.mark.parametrize("key", ["runnerCommand", "runner_command"])
async def test_restricted_rows_may_not_set_executable_keys(key: str) -> None:
    """Both spellings of a plugin's ``executable_keys`` are refused from a restricted file
    (D16), with the file, row, key and the caller's fix; unrestricted, it loads."""
    text = (
        "- name: sandbox-local\n"
        f"  config: {{{key}: [/bin/sh], runnerFailureSignatures: [x]}}\n"
    )
    rows = parse_rows(text, "proj/dsh.yml", restricted="FIX: name the file")
    with pytest.raises(ConfigError) as caught:
        async with open_host(rows):
            pass
    message = str(caught.value)
    assert message.startswith(f"proj/dsh.yml:1 (row 1): config key {key} of sandbox-local ")
    assert message.endswith("chooses an executable; FIX: name the file")
    if key == "runnerCommand":  # the spelling sandbox-local's Config accepts today
        async with open_host(parse_rows(text, "user.yml")) as host:
            assert host.ctx.get("sandbox") is not None


async def test_restricted_rows_may_not_import_modules() -> None:
    rows = parse_rows("- name: host.sample_plugins:Echo\n", "proj/dsh.yml", restricted="FIX")
    with pytest.raises(ConfigError, match=r"^proj/dsh.yml:1 \(row 1\): row 'host\.sample_plugins:"
                       r"Echo' imports Python code by module path; FIX$"):
        async with open_host(rows):
            pass

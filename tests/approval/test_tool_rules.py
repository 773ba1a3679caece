"""``tool-rules``: first match wins, globs, default allow, and composition with other gates."""

from __future__ import annotations

from typing import Any

import pytest

from dsh_host import Row, open_host
from dsh_host._tools import Ask, Deny
from dsh_host.errors import BootError, ConfigError

from .harness import audit, booted, call_tool, new_agent, text_of

pytestmark = pytest.mark.anyio

TOOLS = ("write_file", "read_file", "bash", "fs_move")


async def grant(req: Any, next_: Any) -> Any:
    return "allowed-once"


async def test_first_match_wins_with_globs_and_default_allow() -> None:
    rules = [
        {"tool": "write_file", "decision": "ask"},
        {"tool": "fs_*", "decision": "deny", "reason": "filesystem moves are disabled here"},
        {"tool": "*_file", "decision": "deny"},  # shadowed for write_file by the first rule
        {"tool": "bash", "decision": "allow"},
    ]
    async with booted(rules=rules, tools=TOOLS) as (host, probe):
        agent = new_agent(host)
        # write_file: first rule (ask) wins over the later deny glob; no answerer -> unavailable.
        result = await call_tool(host, agent, name="write_file", call_id="w")
        assert text_of(result) == (
            'Error: tool "write_file" requires approval, but no approval channel is available'
        )
        # read_file: matches *_file -> deny with the default reason; nobody is asked.
        result = await call_tool(host, agent, name="read_file", call_id="r")
        assert text_of(result) == 'Error: tool "read_file" is denied by tool-rules'
        # fs_move: the configured reason, verbatim.
        result = await call_tool(host, agent, name="fs_move", call_id="m")
        assert text_of(result) == "Error: filesystem moves are disabled here"
        # bash: allowed, runs without asking.
        result = await call_tool(host, agent, name="bash", call_id="b")
        assert text_of(result) == "ran bash"
        assert probe.calls == [{"x": 1}]
        assert [p["data"].get("toolName") for p in audit(agent.session)] == ["write_file", None]


async def test_unmatched_tools_follow_the_default() -> None:
    async with booted(rules=[{"tool": "bash", "decision": "ask"}], tools=TOOLS) as (host, probe):
        agent = new_agent(host)
        assert text_of(await call_tool(host, agent, name="read_file")) == "ran read_file"
        assert audit(agent.session) == []

    async with open_host(
        [
            Row(name="sessions"),
            Row(name="tools"),
            Row(name="tool-rules", config={"rules": [], "default": "deny"}),
        ]
    ) as host:
        from .harness import Probe

        probe = Probe()
        host.ctx.tools.register(probe.definition("anything"))
        result = await call_tool(host, None, name="anything")
        assert text_of(result) == 'Error: tool "anything" is denied by tool-rules'
        assert probe.calls == []


async def test_ask_reason_is_audited_and_the_grant_runs_the_body() -> None:
    rules = [{"tool": "bash", "decision": "ask", "reason": "deployment policy: shell needs a human"}]
    async with booted(rules=rules, tools=("bash",)) as (host, probe):
        host.ctx.on("approval/request", grant)
        agent = new_agent(host)
        assert text_of(await call_tool(host, agent, name="bash")) == "ran bash"
        asked = audit(agent.session)[0]["data"]
        assert asked["reason"] == "deployment policy: shell needs a human"
        assert probe.calls == [{"x": 1}]


async def test_ask_without_approval_service_uses_the_reason_or_the_default() -> None:
    async with booted(policy=None, rules=[{"tool": "*", "decision": "ask"}]) as (host, probe):
        agent = new_agent(host)
        assert text_of(await call_tool(host, agent)) == (
            'Error: tool "probe" requires approval (not yet supported)'
        )
    rules = [{"tool": "*", "decision": "ask", "reason": "needs sign-off"}]
    async with booted(policy=None, rules=rules) as (host, probe):
        agent = new_agent(host)
        assert text_of(await call_tool(host, agent)) == "Error: needs sign-off"
        assert probe.calls == []


async def test_stricter_inner_gate_wins_and_allow_defers() -> None:
    """An ``ask`` rule keeps an inner deny; an ``allow`` rule passes the inner decision on."""
    inner: list[Any] = []

    async def inner_gate(execution: Any, next_: Any) -> Any:
        return inner[0] if inner else await next_()

    async with booted(
        rules=[{"tool": "probe", "decision": "ask"}, {"tool": "other", "decision": "allow"}],
        tools=("probe", "other"),
    ) as (host, probe):
        host.ctx.on("tools/pre-execute", inner_gate)
        host.ctx.on("approval/request", grant)
        agent = new_agent(host)
        inner.append(Deny("inner says no"))
        assert text_of(await call_tool(host, agent, call_id="a")) == "Error: inner says no"
        assert text_of(await call_tool(host, agent, name="other", call_id="b")) == (
            "Error: inner says no"
        )
        assert audit(agent.session) == []  # a deny is never turned into a question
        inner[0] = Ask("inner reason")
        assert text_of(await call_tool(host, agent, call_id="c")) == "ran probe"
        assert audit(agent.session)[0]["data"]["reason"] == "inner reason"
        assert probe.calls == [{"x": 1}]


async def test_rules_unload_with_their_row() -> None:
    async with booted(rules=[{"tool": "*", "decision": "deny"}]) as (host, probe):
        agent = new_agent(host)
        assert text_of(await call_tool(host, agent, call_id="a")) == (
            'Error: tool "probe" is denied by tool-rules'
        )
        assert probe.calls == []
        await host.unload("rules")
        assert text_of(await call_tool(host, agent, call_id="b")) == "ran probe"
        assert probe.calls == [{"x": 1}]


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        ({"rules": [{"tool": "  ", "decision": "ask"}]}, "config.rules[0].tool"),
        ({"rules": [{"tool": "x", "decision": "deny", "reason": ""}]}, "config.rules[0].reason"),
        ({"rules": [{"tool": "x", "decision": "maybe"}]}, "decision"),
        ({"rules": [{"tool": "x", "decision": "ask", "when": "always"}]}, "when"),
        ({"default": "sometimes"}, "default"),
    ],
)
async def test_bad_rules_fail_the_boot_naming_the_key(config: dict[str, Any], needle: str) -> None:
    with pytest.raises((BootError, ConfigError)) as info:
        async with open_host([Row(name="tools"), Row(id="rules", name="tool-rules", config=config)]):
            pass  # pragma: no cover
    text = str(info.value) + " ".join(getattr(info.value, "problems", []))
    assert needle in text
    assert "rules" in text

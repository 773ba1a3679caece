"""Sandbox escalation in the built-in ``bash`` tool (its builtin-tools README section).

Real composition: ``sessions``, ``tools``, ``sandbox-local`` (bubblewrap or Landlock),
``builtin-tools`` and ``user-approval`` booted through the loader; real ``bash`` processes; the
answerer is an ``approval/request`` listener. Every refusal is checked three ways: the exact
model-visible text, the audit pair in the session log (or its absence), and the host filesystem
(the command's marker file does not exist).

The "outside" directory is under ``/var/tmp``, not ``/tmp``: bubblewrap's workspace-write mounts
a private ``/tmp`` and Landlock grants the host's, so a ``/tmp`` target would prove nothing about
the workspace boundary.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from dsh_host import Row, open_host
from dsh_host._cancel import CancelToken
from dsh_host._loader import PluginHost
from dsh_host._tools import ToolErrorInfo, ToolExecutionResult
from dsh_host._tools.escalation import ESCALATION_TARGETS

from .harness import TurnAgent, audit, call_tool, new_agent, text_of

pytestmark = pytest.mark.anyio

UNAVAILABLE_TEXT = (
    'sandbox mode "{mode}" is requested but no sandbox backend is usable on this host; refusing '
    "to run the command unconfined. Install bubblewrap or run a Landlock-enforcing kernel "
    "(Linux), ensure sandbox-exec is usable (macOS), or ensure the ACL restricted-token runner "
    "can start (Windows) — otherwise switch the consumer to danger-full-access."
)
HINT = (
    "[sandbox: escalation available — retry this exact command once with sandbox_permissions "
    "(the narrowest wider mode that suffices) + justification; the approval prompt asks the user]"
)
ESCALATION_INFO = ToolErrorInfo("SandboxEscalationError", "SANDBOX_ESCALATION")

Boot = Callable[..., AbstractAsyncContextManager[PluginHost]]


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws


@pytest.fixture
def outside() -> Iterator[Path]:
    """A directory outside the workspace and outside ``/tmp`` (see the module docstring)."""
    path = Path(tempfile.mkdtemp(prefix="dsh-escalation-", dir="/var/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def boot(workspace: Path, tmp_path: Path) -> Boot:
    @asynccontextmanager
    async def booted(
        *,
        mode: str = "read-only",
        policy: str | None = "ask",
        sandbox: dict[str, Any] | None = None,
    ) -> AsyncIterator[PluginHost]:
        rows = [Row(name="sessions"), Row(name="tools")]
        if sandbox is not None:
            rows.append(Row(id="sb", name="sandbox-local", config=sandbox))
        rows.append(
            Row(
                name="builtin-tools",
                config={"workspace": str(workspace), "sandbox": mode},
            )
        )
        if policy is not None:
            rows.append(Row(id="approval", name="user-approval", config={"policy": policy}))
        async with open_host(rows) as host:
            yield host

    return booted


DENY_NET = {"network": "deny"}


class Answerer:
    """A terminal ``approval/request`` listener that answers ``outcome`` and records requests."""

    def __init__(self, outcome: str) -> None:
        self.outcome = outcome
        self.requests: list[Any] = []

    async def __call__(self, req: Any, next_: Any) -> Any:
        self.requests.append(req)
        return self.outcome


def answering(host: PluginHost, outcome: str) -> Answerer:
    answerer = Answerer(outcome)
    host.ctx.on("approval/request", answerer)
    return answerer


def bash(command: str, **extra: Any) -> dict[str, Any]:
    return {"command": command, "description": "run a test command", **extra}


def escalate(command: str, mode: str, why: str = "the test needs the wider mode") -> dict[str, Any]:
    return bash(command, sandbox_permissions=mode, justification=why)


async def run(
    host: PluginHost,
    agent: TurnAgent | None,
    arguments: dict[str, Any],
    *,
    call_id: str = "call-1",
    signal: CancelToken | None = None,
) -> ToolExecutionResult:
    return await call_tool(
        host, agent, name="bash", arguments=arguments, call_id=call_id, signal=signal
    )


def refused(result: ToolExecutionResult, message: str) -> None:
    """An escalation refusal: exact text, coded error, and nothing else."""
    assert result.is_error
    assert text_of(result) == "Error: " + message
    assert result.error is not None
    assert result.error.info == ESCALATION_INFO


def decided(agent: TurnAgent) -> list[tuple[str, Any]]:
    return [(e["type"], e["data"].get("outcome")) for e in audit(agent.session)]


# --------------------------------------------------------------------------- schema


async def test_schema_advertises_escalation_only_when_the_row_confines(boot: Boot) -> None:
    async with boot(mode="read-only", sandbox=DENY_NET) as host:
        confining = host.ctx.tools.get("bash")
    async with boot(mode="danger-full-access") as host:
        unconfined = host.ctx.tools.get("bash")
    assert confining is not None and unconfined is not None
    props = confining.parameters["properties"]
    assert props["sandbox_permissions"]["enum"] == list(ESCALATION_TARGETS)
    assert props["sandbox_permissions"]["enum"] == ["workspace-write", "danger-full-access"]
    assert props["sandbox_permissions"]["description"] == (
        "The wider sandbox mode this command needs. Only valid as a one-shot retry of a command "
        "the sandbox just denied; requires justification and user approval."
    )
    assert props["justification"] == {
        "type": "string",
        "description": (
            "Required with sandbox_permissions: one sentence for the user explaining why this "
            "exact command needs the wider access."
        ),
    }
    assert confining.parameters["required"] == ["command"]
    assert "sandbox_permissions" in confining.description
    assert "sandbox_permissions" not in unconfined.parameters["properties"]
    assert "justification" not in unconfined.parameters["properties"]
    assert "sandbox_permissions" not in unconfined.description


async def test_the_enum_is_enforced_by_the_schema(boot: Boot, workspace: Path) -> None:
    marker = workspace / "ran"
    async with boot(sandbox=DENY_NET) as host:
        answerer = answering(host, "allowed-once")
        agent = new_agent(host)
        result = await run(host, agent, escalate(f"touch {marker}", "read-only"))
    assert result.is_error
    assert text_of(result).startswith("Error: invalid arguments: ")
    assert answerer.requests == [] and audit(agent.session) == []
    assert not marker.exists()


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            {"sandbox_permissions": "danger-full-access"},
            "invalid escalation: sandbox_permissions requires a justification",
        ),
        (
            {"justification": "it must write outside"},
            "invalid escalation: justification is only valid together with sandbox_permissions",
        ),
        (
            {"sandbox_permissions": "danger-full-access", "justification": "  \t "},
            "invalid justification: expected a non-empty sentence",
        ),
    ],
)
@pytest.mark.parametrize("mode", ["read-only", "danger-full-access"])
async def test_pairing_is_checked_first(
    boot: Boot, workspace: Path, extra: dict[str, Any], message: str, mode: str
) -> None:
    """Pairing errors win over everything, the composition guard of an unconfined row included."""
    marker = workspace / "ran"
    async with boot(mode=mode, sandbox=DENY_NET) as host:
        answerer = answering(host, "allowed-once")
        agent = new_agent(host)
        result = await run(host, agent, bash(f"touch {marker}", **extra))
    refused(result, message)
    assert answerer.requests == [] and audit(agent.session) == []
    assert not marker.exists()


async def test_unconfined_row_refuses_injected_sandbox_permissions(
    boot: Boot, workspace: Path
) -> None:
    marker = workspace / "ran"
    async with boot(mode="danger-full-access") as host:
        answerer = answering(host, "allowed-once")
        agent = new_agent(host)
        result = await run(host, agent, escalate(f"touch {marker}", "danger-full-access"))
    refused(
        result,
        "sandbox_permissions is not available in this composition (no sandboxing executor to "
        "escalate)",
    )
    assert answerer.requests == [] and audit(agent.session) == []
    assert not marker.exists()


async def test_not_strictly_wider_asks_nobody(boot: Boot, workspace: Path) -> None:
    """The schema enum admits both targets; strict widening is checked against the row's mode."""
    mode = requested = "workspace-write"
    marker = workspace / "ran"
    async with boot(mode=mode, sandbox=DENY_NET) as host:
        answerer = answering(host, "allowed-once")
        agent = new_agent(host)
        result = await run(host, agent, escalate(f"touch {marker}", requested))
    refused(
        result,
        f'sandbox escalation to "{requested}" is not strictly wider than this call\'s current '
        f'"{mode}" mode',
    )
    assert answerer.requests == [] and audit(agent.session) == []
    assert not marker.exists()


async def test_no_approval_service(boot: Boot, workspace: Path) -> None:
    marker = workspace / "ran"
    async with boot(policy=None, sandbox=DENY_NET) as host:
        agent = new_agent(host)
        result = await run(host, agent, escalate(f"touch {marker}", "danger-full-access"))
    refused(
        result,
        'sandbox escalation to "danger-full-access" requires approval, but no approval service '
        "is composed",
    )
    assert audit(agent.session) == []
    assert not marker.exists()


async def test_no_agent(boot: Boot, workspace: Path) -> None:
    marker = workspace / "ran"
    async with boot(sandbox=DENY_NET) as host:
        answerer = answering(host, "allowed-once")
        result = await run(host, None, escalate(f"touch {marker}", "workspace-write"))
    refused(
        result,
        'sandbox escalation to "workspace-write" requires approval, but the call has no agent to '
        "route it through",
    )
    assert answerer.requests == []
    assert not marker.exists()


@pytest.mark.parametrize(
    ("outcome", "message"),
    [
        ("rejected", 'the user rejected escalating this command to "danger-full-access"'),
        ("cancelled", 'approval for escalating to "danger-full-access" was cancelled'),
        (
            "unavailable",
            'sandbox escalation to "danger-full-access" requires approval, but no approval '
            "channel is available",
        ),
    ],
)
async def test_non_grant_outcomes(boot: Boot, outside: Path, outcome: str, message: str) -> None:
    target = outside / "written"
    async with boot(sandbox=DENY_NET) as host:
        answerer = answering(host, outcome)
        agent = new_agent(host)
        result = await run(
            host, agent, escalate(f"echo x > {target}", "danger-full-access", "write the report")
        )
    refused(result, message)
    (req,) = answerer.requests
    assert (req.tool_name, req.call_id, req.reason) == (
        "bash",
        "call-1",
        "escalate sandbox to danger-full-access: write the report",
    )
    assert decided(agent) == [("approval/asked", None), ("approval/decided", outcome)]
    assert not target.exists()


async def test_no_answerer_is_unavailable(boot: Boot, outside: Path) -> None:
    target = outside / "written"
    async with boot(sandbox=DENY_NET) as host:
        agent = new_agent(host)
        result = await run(host, agent, escalate(f"echo x > {target}", "danger-full-access"))
    refused(
        result,
        'sandbox escalation to "danger-full-access" requires approval, but no approval channel '
        "is available",
    )
    assert decided(agent) == [("approval/asked", None), ("approval/decided", "unavailable")]
    assert not target.exists()


async def test_never_policy_rejects_with_the_audit_pair(boot: Boot, outside: Path) -> None:
    """Under ``never`` nobody is consulted (not even a granting answerer); the pair is logged."""
    target = outside / "written"
    async with boot(policy="never", sandbox=DENY_NET) as host:
        answerer = answering(host, "allowed-once")
        agent = new_agent(host)
        result = await run(host, agent, escalate(f"echo x > {target}", "danger-full-access"))
    refused(result, 'the user rejected escalating this command to "danger-full-access"')
    assert answerer.requests == []
    asked, decision = audit(agent.session)
    assert asked["type"] == "approval/asked"
    assert asked["data"]["toolName"] == "bash"
    assert asked["data"]["callId"] == "call-1"
    assert asked["data"]["reason"] == (
        "escalate sandbox to danger-full-access: the test needs the wider mode"
    )
    assert decision == {
        "type": "approval/decided",
        "data": {"id": asked["data"]["id"], "outcome": "rejected"},
    }
    assert not target.exists()


async def test_abort_while_the_prompt_is_open(boot: Boot, outside: Path) -> None:
    """Withdrawing the question settles ``cancelled``; a late grant runs nothing."""
    target = outside / "written"
    asked = anyio.Event()
    release = anyio.Event()

    async def slow_grant(req: Any, next_: Any) -> Any:
        asked.set()
        with anyio.CancelScope(shield=True):
            await release.wait()
        return "allowed-once"

    async with boot(sandbox=DENY_NET) as host:
        host.ctx.on("approval/request", slow_grant)
        agent = new_agent(host)
        token = CancelToken()
        results: list[ToolExecutionResult] = []

        async def call() -> None:
            results.append(
                await run(
                    host, agent, escalate(f"echo x > {target}", "danger-full-access"), signal=token
                )
            )

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            await asked.wait()
            token.abort("user pressed escape")
            release.set()
    (result,) = results
    # The escalation's own text (as in DSH), not the generic abort: the model learns the
    # question was withdrawn rather than answered.
    refused(result, 'approval for escalating to "danger-full-access" was cancelled')
    assert decided(agent) == [("approval/asked", None), ("approval/decided", "cancelled")]
    assert not target.exists()


# --------------------------------------------------------------------------- grants

BACKENDS = pytest.mark.parametrize("backend", ["bubblewrap", "landlock"])


@BACKENDS
async def test_granted_danger_full_access_runs_unconfined_for_one_call(
    boot: Boot, outside: Path, backend: str
) -> None:
    """read-only row: an outside write is denied, granted once, then denied again."""
    target = outside / "written"
    command = f"echo granted > {target}"
    async with boot(mode="read-only", sandbox={**DENY_NET, "backend": backend}) as host:
        answerer = answering(host, "allowed-once")
        agent = new_agent(host)

        before = await run(host, agent, bash(command), call_id="call-1")
        assert not target.exists()
        granted = await run(host, agent, escalate(command, "danger-full-access"), call_id="call-2")
        assert target.read_text() == "granted\n"
        target.unlink()
        after = await run(host, agent, bash(command), call_id="call-3")
        assert not target.exists()

    for denied in (before, after):
        assert not denied.is_error
        assert denied.value["sandbox"]["mode"] == "read-only"
        assert denied.value["sandbox"]["denied"] is True
        lines = text_of(denied).splitlines()
        assert lines[-3:] == [
            "[sandbox: file access denied under read-only mode]",
            HINT,
            "[exit code: 1]",
        ]
    assert not granted.is_error, text_of(granted)
    assert text_of(granted) == "(no output)"
    # Unconfined: the sandbox was never consulted, so there is no enforcement fact.
    assert granted.value["sandbox"] == {"mode": "danger-full-access", "denied": False}
    (req,) = answerer.requests
    assert req.call_id == "call-2"
    assert decided(agent) == [("approval/asked", None), ("approval/decided", "allowed-once")]


@BACKENDS
async def test_granted_workspace_write_is_still_confined(
    boot: Boot, workspace: Path, outside: Path, backend: str
) -> None:
    """read-only row: a workspace write succeeds only under the granted workspace-write, and
    that grant still confines (an outside write in the same granted call is denied)."""
    inside = workspace / "built.txt"
    beyond = outside / "escaped"
    command = f"echo built > {inside}"
    async with boot(mode="read-only", sandbox={**DENY_NET, "backend": backend}) as host:
        answering(host, "allowed-once")
        agent = new_agent(host)
        before = await run(host, agent, bash(command), call_id="call-1")
        assert not inside.exists()
        granted = await run(host, agent, escalate(command, "workspace-write"), call_id="call-2")
        assert inside.read_text() == "built\n"
        inside.unlink()
        still_fenced = await run(
            host,
            agent,
            escalate(f"echo x > {beyond}", "workspace-write"),
            call_id="call-3",
        )
        after = await run(host, agent, bash(command), call_id="call-4")
        assert not inside.exists()

    assert before.value["sandbox"]["denied"] is True
    assert not granted.is_error, text_of(granted)
    assert granted.value["sandbox"]["mode"] == "workspace-write"
    assert granted.value["sandbox"]["denied"] is False
    assert granted.value["sandbox"]["enforcement"] in ("full", "partial")
    assert not beyond.exists()
    assert still_fenced.value["sandbox"] == {
        "mode": "workspace-write",
        "denied": True,
        "enforcement": still_fenced.value["sandbox"]["enforcement"],
    }
    assert text_of(still_fenced).splitlines()[-3:] == [
        "[sandbox: file access denied under workspace-write mode]",
        HINT,
        "[exit code: 1]",
    ]
    assert after.value["sandbox"]["mode"] == "read-only"
    assert after.value["sandbox"]["denied"] is True
    assert [d for d in decided(agent) if d[0] == "approval/decided"] == [
        ("approval/decided", "allowed-once"),
        ("approval/decided", "allowed-once"),
    ]


async def test_workspace_write_row_escalates_to_danger_full_access(
    boot: Boot, workspace: Path
) -> None:
    """A workspace-write row may only escalate to danger-full-access (the ladder, end to end)."""
    async with boot(mode="workspace-write", sandbox=DENY_NET) as host:
        answerer = answering(host, "allowed-once")
        agent = new_agent(host)
        wider = await run(host, agent, escalate("echo ok", "danger-full-access"))
    assert not wider.is_error, text_of(wider)
    assert wider.value["sandbox"] == {"mode": "danger-full-access", "denied": False}
    assert len(answerer.requests) == 1


async def test_granted_confined_mode_fails_closed_without_a_usable_backend(
    boot: Boot, workspace: Path
) -> None:
    """An approval never turns into an unconfined run: a granted workspace-write whose runner
    cannot start is ``SANDBOX_UNAVAILABLE`` for workspace-write, and nothing runs."""
    marker = workspace / "ran"
    broken = {
        **DENY_NET,
        "runnerCommand": [str(workspace / "no-such-runner")],
        "runnerFailureSignatures": ["no-such-runner: "],
    }
    async with boot(mode="read-only", sandbox=broken) as host:
        answering(host, "allowed-once")
        agent = new_agent(host)
        result = await run(host, agent, escalate(f"touch {marker}", "workspace-write"))
    assert result.is_error
    text = text_of(result)
    assert text.startswith("Error: " + UNAVAILABLE_TEXT.format(mode="workspace-write"))
    assert " Runner failure: " in text
    assert result.error is not None
    assert result.error.info == ToolErrorInfo("SandboxUnavailableError", "SANDBOX_UNAVAILABLE")
    assert decided(agent)[-1] == ("approval/decided", "allowed-once")
    assert not marker.exists()


async def test_granted_confined_mode_without_a_sandbox_service(boot: Boot, workspace: Path) -> None:
    marker = workspace / "ran"
    async with boot(mode="read-only", sandbox=None) as host:
        answering(host, "allowed-once")
        agent = new_agent(host)
        confined = await run(
            host, agent, escalate(f"touch {marker}", "workspace-write"), call_id="call-1"
        )
        assert not marker.exists()
        unconfined = await run(
            host, agent, escalate(f"touch {marker}", "danger-full-access"), call_id="call-2"
        )
    assert text_of(confined) == "Error: " + UNAVAILABLE_TEXT.format(mode="workspace-write")
    # danger-full-access never consults the sandbox, so a missing provider does not matter.
    assert not unconfined.is_error, text_of(unconfined)
    assert marker.is_file()


def test_marker_order_and_the_hint_only_when_advertised() -> None:
    from dsh_builtin_tools import render_bash

    value: dict[str, Any] = {
        "kind": "foreground",
        "exitCode": None,
        "signal": "SIGKILL",
        "timedOut": True,
        "aborted": False,
        "timeoutMs": 1500,
        "stdout": {"text": "partial", "truncated": False},
        "stderr": {"text": "Read-only file system\n", "truncated": False},
        "sandbox": {"mode": "read-only", "denied": True, "enforcement": "full"},
    }
    advertised = render_bash({}, value, escalation=True)[0].text  # type: ignore[union-attr]
    plain = render_bash({}, value)[0].text  # type: ignore[union-attr]
    assert advertised.splitlines()[-4:] == [
        "[sandbox: file access denied under read-only mode]",
        HINT,
        "[timed out after 1500ms]",
        "[killed by signal: SIGKILL]",
    ]
    assert HINT not in plain
    assert plain.splitlines()[-3] == "[sandbox: file access denied under read-only mode]"
    not_denied = render_bash(
        {}, {**value, "sandbox": {**value["sandbox"], "denied": False}}, escalation=True
    )[0].text  # type: ignore[union-attr]
    assert "[sandbox:" not in not_denied

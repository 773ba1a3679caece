"""Sandbox escalation through approval: ladder, pairing, and the ordered sequence.

The sequence lives in the host (``dsh_host._tools.escalation``, shared by every confining tool),
which calls it with ``ctx.get("approval")`` as the approver. The ``bash``
tool's use of it is tested end to end in ``test_bash_escalation.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import dsh_user_approval
import pytest
from dsh_user_approval import set_approval_policy

from dsh_host._cancel import CancelToken
from dsh_host._tools import ToolError
from dsh_host._tools import escalation as host_escalation
from dsh_host._tools.escalation import (
    ESCALATION_TARGETS,
    WIDER_MODES,
    SandboxEscalationError,
    approve_escalation,
    check_escalation_available,
    escalation_hint_marker,
    sandbox_denial_marker,
    validate_escalation_args,
)
from dsh_host._tools.types import ApprovalSubject, approval_refusal, no_agent_refusal

from .harness import audit, booted, new_agent

pytestmark = pytest.mark.anyio


@dataclass(frozen=True)
class BareAgent:
    """An agent for the paths that never reach a session (no service, rogue approver)."""

    id: str = "a"
    session: Any = None


def test_the_escalation_helpers_have_one_home() -> None:
    # The host module owns them; the approval plugin neither re-exports them nor wraps
    # approve_escalation in a pass-through method.
    for name in host_escalation.__all__:
        assert not hasattr(dsh_user_approval, name), name
    assert not hasattr(dsh_user_approval.ApprovalService, "approve_escalation")
    assert issubclass(SandboxEscalationError, ToolError)
    assert SandboxEscalationError.code == "SANDBOX_ESCALATION"


def test_ladder_and_targets() -> None:
    assert WIDER_MODES["read-only"] == ("workspace-write", "danger-full-access")
    assert WIDER_MODES["workspace-write"] == ("danger-full-access",)
    assert "danger-full-access" not in WIDER_MODES
    assert ESCALATION_TARGETS == ("workspace-write", "danger-full-access")


@pytest.mark.parametrize(
    ("perm", "just", "message"),
    [
        ("workspace-write", None, "invalid escalation: sandbox_permissions requires a justification"),
        (None, "because", "invalid escalation: justification is only valid together with sandbox_permissions"),
        ("workspace-write", "   ", "invalid justification: expected a non-empty sentence"),
    ],
)
def test_pairing_validation(perm: Any, just: Any, message: str) -> None:
    with pytest.raises(SandboxEscalationError) as info:
        validate_escalation_args(perm, just)
    assert str(info.value) == message
    assert info.value.failure == "invalid-args"


def test_valid_pairs_pass_and_markers() -> None:
    validate_escalation_args(None, None)
    validate_escalation_args("danger-full-access", "needs to write /etc/hosts")
    assert sandbox_denial_marker("read-only") == "[sandbox: file access denied under read-only mode]"
    assert escalation_hint_marker("command") == (
        "[sandbox: escalation available — retry this exact command once with sandbox_permissions "
        "(the narrowest wider mode that suffices) + justification; the approval prompt asks the "
        "user]"
    )
    with pytest.raises(SandboxEscalationError) as info:
        check_escalation_available(False)
    assert str(info.value) == (
        "sandbox_permissions is not available in this composition (no sandboxing executor to "
        "escalate)"
    )
    check_escalation_available(True)


async def test_grant_returns_the_mode_and_audits_the_reason() -> None:
    seen: list[Any] = []

    async def grant(req: Any, next_: Any) -> Any:
        seen.append(req)
        return "allowed-once"

    async with booted(rules=None) as (host, _):
        host.ctx.on("approval/request", grant)
        agent = new_agent(host)
        token = CancelToken()
        mode = await approve_escalation(
            host.ctx.approval, requested_mode="workspace-write",
            justification="the build writes into ./dist",
            effective_mode="read-only",
            agent=agent,
            call_id="call-7",
            signal=token,
        )
        assert mode == "workspace-write"
        (req,) = seen
        assert (req.tool_name, req.call_id, req.reason, req.signal) == (
            "bash", "call-7", "escalate sandbox to workspace-write: the build writes into ./dist",
            token,
        )
        asked, decided = audit(agent.session)
        assert asked["data"]["reason"] == (
            "escalate sandbox to workspace-write: the build writes into ./dist"
        )
        assert decided["data"]["outcome"] == "allowed-once"


@pytest.mark.parametrize(
    ("requested", "effective"),
    [
        ("read-only", "read-only"),
        ("read-only", "workspace-write"),
        ("workspace-write", "workspace-write"),
        ("workspace-write", "danger-full-access"),
        ("danger-full-access", "danger-full-access"),
        ("workspace-write", "bogus-mode"),
    ],
)
async def test_non_widening_fails_without_asking(requested: str, effective: str) -> None:
    async with booted(rules=None) as (host, _):
        agent = new_agent(host)
        with pytest.raises(SandboxEscalationError) as info:
            await approve_escalation(
                host.ctx.approval, requested_mode=requested, justification="j",
                effective_mode=effective, agent=agent, call_id="c",
            )
        assert str(info.value) == (
            f'sandbox escalation to "{requested}" is not strictly wider than this call\'s '
            f'current "{effective}" mode'
        )
        assert audit(agent.session) == []


async def test_no_service_and_no_agent() -> None:
    with pytest.raises(SandboxEscalationError) as info:
        await approve_escalation(
            None, requested_mode="danger-full-access", justification="j",
            effective_mode="workspace-write", agent=BareAgent(), call_id="c",
        )
    assert str(info.value) == (
        'sandbox escalation to "danger-full-access" requires approval, but no approval service '
        "is composed"
    )
    async with booted(rules=None) as (host, _):
        with pytest.raises(SandboxEscalationError) as info:
            await approve_escalation(
                host.ctx.approval, requested_mode="danger-full-access", justification="j",
                effective_mode="read-only", agent=None, call_id="c",
            )
        assert str(info.value) == (
            'sandbox escalation to "danger-full-access" requires approval, but the call has no '
            "agent to route it through"
        )


@pytest.mark.parametrize(
    ("answer", "subject", "message"),
    [
        ("rejected", "command", 'the user rejected escalating this command to "workspace-write"'),
        ("rejected", "operation", 'the user rejected escalating this operation to "workspace-write"'),
        ("cancelled", "command", 'approval for escalating to "workspace-write" was cancelled'),
        ("unavailable", "command", 'sandbox escalation to "workspace-write" requires approval, but no approval channel is available'),
        ("nonsense", "command", 'sandbox escalation to "workspace-write" requires approval, but no approval channel is available'),
    ],
)
async def test_outcome_texts(answer: str, subject: str, message: str) -> None:
    async def answerer(req: Any, next_: Any) -> Any:
        return answer

    async with booted(rules=None) as (host, _):
        host.ctx.on("approval/request", answerer)
        agent = new_agent(host)
        with pytest.raises(SandboxEscalationError) as info:
            await approve_escalation(
                host.ctx.approval, requested_mode="workspace-write", justification="j",
                effective_mode="read-only", agent=agent, call_id="c", subject=subject,
                tool_name="bash" if subject == "command" else "write_file",
            )
        assert str(info.value) == message
        assert [p["type"] for p in audit(agent.session)] == ["approval/asked", "approval/decided"]


async def test_never_policy_rejects_escalation_with_the_pair_logged() -> None:
    async with booted(rules=None) as (host, _):
        agent = new_agent(host)
        set_approval_policy(agent.session, "never")
        with pytest.raises(SandboxEscalationError) as info:
            await approve_escalation(
                host.ctx.approval, requested_mode="danger-full-access", justification="j",
                effective_mode="read-only", agent=agent, call_id="c",
            )
        assert str(info.value) == 'the user rejected escalating this command to "danger-full-access"'
        assert [p["data"].get("outcome") for p in audit(agent.session)] == [
            None, None, "rejected"
        ]


async def test_rogue_approver_is_unreachable() -> None:
    class Rogue:
        async def request(self, req: Any) -> str:
            return "maybe"

    with pytest.raises(TypeError, match="unreachable: the approval service answered 'maybe'"):
        await approve_escalation(
            Rogue(), requested_mode="workspace-write", justification="j",
            effective_mode="read-only", agent=BareAgent(), call_id="c",
        )


def test_one_mapping_from_outcome_to_refusal_text() -> None:
    # The pipeline's ask and the escalation share approval_refusal (issue 17): the same three
    # sentence shapes, each naming its subject; allowed-once is not a refusal.
    tool = ApprovalSubject(rejected='tool "x"', asked_for='tool "x"', requiring='tool "x"')
    assert [approval_refusal(o, tool) for o in ("rejected", "cancelled", "unavailable")] == [
        'the user rejected tool "x"',
        'approval for tool "x" was cancelled',
        'tool "x" requires approval, but no approval channel is available',
    ]
    assert no_agent_refusal(tool) == (
        'tool "x" requires approval, but the call has no agent to route it through'
    )
    with pytest.raises(TypeError, match="unreachable"):
        approval_refusal("allowed-once", tool)

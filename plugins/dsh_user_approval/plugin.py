"""The ``user-approval`` plugin: provides the ``approval`` service."""

from __future__ import annotations

from typing import Literal

import msgspec

from dsh_host.sdk import (
    APPROVAL,
    APPROVAL_REQUEST,
    Context,
    Plugin,
    RunTermKeys,
    register_turn_end_reason,
)

from .service import ApprovalService, AwaitingApprovalReason

__all__ = ["UserApproval", "UserApprovalConfig"]


class UserApprovalConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """YAML ``config:`` of a ``user-approval`` row."""

    #: The default for sessions without an ``approval/policy`` event: ``ask`` consults the
    #: answerers (``unavailable`` without one); ``never`` rejects every ask unasked.
    policy: Literal["ask", "never"] = "ask"
    #: What an ask that no live answerer decides becomes (D19): ``fail`` (default) resolves
    #: ``unavailable`` and the call fails closed; ``defer`` leaves a model call's decision for
    #: later and ends the turn ``awaiting-approval``.
    unanswered: Literal["fail", "defer"] = "fail"


class UserApproval(Plugin):
    """Service ``approval``: ``await ctx.approval.request(req)`` → one of four outcomes.

    Ships no answerer (D8): answerers are ``approval/request``
    listeners registered by a front end (the ``dsh`` CLI registers a terminal
    one on an interactive TTY). Without one every ask resolves ``unavailable``
    (``fail``) or is deferred (``defer``).
    """

    name = "user-approval"
    provides = ("approval",)
    run_terms = RunTermKeys(approval_policy="policy", unanswered="unanswered")
    #: a repair's closers answer calls an ask may have left open: the approval row's events
    #: are evidence, so a repair-only resume boots it
    boots_for_repair = True
    Config = UserApprovalConfig

    def apply(self, ctx: Context, config: UserApprovalConfig) -> None:
        ctx.declare_event(APPROVAL_REQUEST)
        ctx.effect(register_turn_end_reason(AwaitingApprovalReason), "awaiting-approval kind")
        service = ApprovalService(ctx, config.policy, unanswered=config.unanswered)
        ctx.provide(APPROVAL, service)

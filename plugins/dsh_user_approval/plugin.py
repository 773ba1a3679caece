"""The ``user-approval`` plugin: provides the ``approval`` service."""

from __future__ import annotations

from typing import Literal

import msgspec

from dsh_host import Context, Plugin

from .service import ApprovalService

__all__ = ["UserApproval", "UserApprovalConfig"]


class UserApprovalConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """YAML ``config:`` of a ``user-approval`` row."""

    #: The default for sessions without an ``approval/policy`` event: ``ask`` consults the
    #: answerers (``unavailable`` without one); ``never`` rejects every ask unasked.
    policy: Literal["ask", "never"] = "ask"


class UserApproval(Plugin):
    """Service ``approval``: ``await ctx.approval.request(req)`` → one of four outcomes.

    Ships no answerer (DECISIONS D8): answerers are ``approval/request``
    listeners registered by a front end (the ``dsh`` CLI registers a terminal
    one on an interactive TTY). Without one every ask resolves ``unavailable``.
    """

    name = "user-approval"
    provides = ("approval",)
    Config = UserApprovalConfig

    def apply(self, ctx: Context, config: UserApprovalConfig) -> None:
        service = ApprovalService(ctx, config.policy)
        ctx.provide("approval", service)

"""``subagents``: delegation to child agents in child sessions that survive a crash (D24)."""

from .config import ChildAgentConfig, SubagentsConfig, SubagentsConfigError
from .plugin import (
    DELEGATION_EVENT,
    TOOL_NAME,
    Subagents,
    child_session_id,
    child_state,
    delegation_closer,
)

__all__ = [
    "DELEGATION_EVENT",
    "TOOL_NAME",
    "ChildAgentConfig",
    "Subagents",
    "SubagentsConfig",
    "SubagentsConfigError",
    "child_session_id",
    "child_state",
    "delegation_closer",
]

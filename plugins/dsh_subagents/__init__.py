"""``subagents``: delegation to child agents in child sessions that survive a crash (D24)."""

from .config import ChildAgentConfig, SubagentsConfig, SubagentsConfigError
from .logs import (
    HANDOFF_EVENT,
    HANDOFF_TOOL,
    OUTPUT_TOOL_PREFIX,
    TOOL_NAME,
    child_session_id,
    child_state,
    delegation_closer,
    handoff_closer,
    handoff_target,
    output_tool,
)
from .plugin import DELEGATION_EVENT, Subagents

__all__ = [
    "DELEGATION_EVENT",
    "HANDOFF_EVENT",
    "HANDOFF_TOOL",
    "OUTPUT_TOOL_PREFIX",
    "TOOL_NAME",
    "ChildAgentConfig",
    "Subagents",
    "SubagentsConfig",
    "SubagentsConfigError",
    "child_session_id",
    "child_state",
    "delegation_closer",
    "handoff_closer",
    "handoff_target",
    "output_tool",
]

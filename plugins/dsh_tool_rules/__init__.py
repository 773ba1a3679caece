"""``tool-rules``: a ``tools/pre-execute`` gate from YAML rules (allow / deny / ask per tool)."""

from .plugin import Rule, ToolRules, ToolRulesConfig, ToolRulesError, default_deny_reason

__all__ = ["Rule", "ToolRules", "ToolRulesConfig", "ToolRulesError", "default_deny_reason"]

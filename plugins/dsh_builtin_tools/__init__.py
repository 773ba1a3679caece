"""``builtin-tools``: ``bash`` and the file tools (read, write, edit, search, list; D11)."""

from .bash import BASH_DESCRIPTION, denial_marker, render_bash
from .config import BuiltinToolsConfig, BuiltinToolsConfigError
from .files import FileFenceError, FileSandboxDeniedError, resolve_in_workspace
from .plugin import BuiltinTools

__all__ = [
    "BASH_DESCRIPTION",
    "BuiltinTools",
    "BuiltinToolsConfig",
    "BuiltinToolsConfigError",
    "FileFenceError",
    "FileSandboxDeniedError",
    "denial_marker",
    "render_bash",
    "resolve_in_workspace",
]

"""Command lines dsh prints for a person to copy (``dsh approvals decide ...``).

Ids come from logs and models (a provider's call id, a session id chosen by a client), so a hint
quotes each word for the shell, then escapes the line for the terminal: pasting it runs exactly
that command with exactly those ids, and nothing in an id can redraw the screen.
"""

from __future__ import annotations

import shlex

from .render import terminal_safe


def command_hint(*words: str) -> str:
    """``dsh approvals decide 'ses 1' 'call;rm -rf ~' allow|deny``: each word shell-quoted, except
    a trailing placeholder the person replaces (``allow|deny``, kept as written)."""
    *quoted, last = words
    tail = last if "|" in last else shlex.quote(last)
    return terminal_safe(" ".join([*(shlex.quote(word) for word in quoted), tail]), multiline=False)

"""A printed command line runs exactly the command it names, whatever the ids hold.

Session ids come from clients and call ids from models (a provider may send ``call_0; rm -rf ~``).
Each hint is pasted into a real shell here and the words the shell passes on are compared.
"""

from __future__ import annotations

import subprocess

import pytest

from dsh_host._cli.hints import command_hint

ODD_IDS = [
    "20261204-193731-ed069a",
    "call 0",
    "call_0; touch pwned",
    "$(touch pwned)",
    "`id`",
    "it's",
    '"double"',
    "a\\b",
    "-rf",
    "*",
    "",
]


def _words_the_shell_passes(line: str) -> list[str]:
    done = subprocess.run(
        ["bash", "-c", f"printf '%s\\0' {line.removeprefix('dsh ')}"],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    return done.stdout.split("\0")[:-1]


@pytest.mark.parametrize("odd", ODD_IDS)
def test_a_pasted_decide_hint_passes_the_ids_unchanged(odd: str) -> None:
    line = command_hint("dsh", "approvals", "decide", "session " + odd, odd, "allow|deny")
    assert line.startswith("dsh approvals decide ") and line.endswith(" allow|deny")
    pasted = line.removesuffix("allow|deny") + "allow"
    assert _words_the_shell_passes(pasted) == [
        "approvals",
        "decide",
        "session " + odd,
        odd,
        "allow",
    ]


def test_control_characters_cannot_reach_the_terminal() -> None:
    line = command_hint("dsh", "resume", "id\x1b[2J\u202e")
    assert "\x1b" not in line and "\u202e" not in line

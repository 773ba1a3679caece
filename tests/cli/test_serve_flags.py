"""`dsh serve`'s flags are checked before anything listens."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli.cli_helpers import dsh


@pytest.mark.parametrize(
    ("port", "why"),
    [
        ("80000", "80000 is not a port"),
        ("-1", "-1 is not a port"),
        ("x", "'x' is not a port number"),
    ],
)
def test_a_port_out_of_range_is_refused_not_truncated(tmp_path: Path, port: str, why: str) -> None:
    """The OS keeps the low 16 bits: --port 80000 used to listen on 14464 without a word."""
    done = dsh("serve", "--port", port, cwd=tmp_path, timeout=30)
    assert done.returncode == 2
    assert f"dsh serve: error: argument --port: {why}" in done.stderr

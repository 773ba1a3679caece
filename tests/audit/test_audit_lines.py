"""An attested export is made and checked line by line (D33): ``attest_lines`` yields the bytes
``attest`` returns, and ``verify_export`` of an open file (read once, line by line) reports what
it reports of the same bytes, for an intact export and for each way a file can be damaged at a
line boundary (cut short, no final newline, a blank line, an event dropped, nothing at all)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from dsh_host._session.audit import attest, attest_lines, verify_export

HEADER = {"version": 3, "id": "lines", "createdAt": 1, "cwd": "/w"}


def events(n: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for turn in range(1, n + 1):
        seq = len(out)
        out.append({"type": "turn/start", "seq": seq, "time": seq, "data": {"turn": turn}})
        out.append({"type": "turn/end", "seq": seq + 1, "time": seq + 1,
                    "data": {"turn": turn, "reason": {"kind": "completed"}}})
    return out


def variants(data: bytes) -> dict[str, bytes]:
    lines = data.split(b"\n")[:-1]
    return {
        "intact": data,
        "no final newline": data[:-1],
        "cut short": b"\n".join(lines[:-1]) + b"\n",
        "cut mid-line": data[: len(data) // 2],
        "a blank line": b"\n".join([*lines[:2], b"", *lines[2:]]) + b"\n",
        "a blank line at the end": data + b"\n",
        "an event dropped": b"\n".join([*lines[:2], *lines[3:]]) + b"\n",
        "empty": b"",
        "only a newline": b"\n",
    }


def test_attest_lines_are_the_attested_bytes() -> None:
    key = Ed25519PrivateKey.generate()
    whole = attest("lines", HEADER, events(5), key)
    assert b"".join(attest_lines("lines", HEADER, iter(events(5)), key)) == whole
    assert verify_export(whole).ok and verify_export(whole).events == 10


def test_a_file_read_line_by_line_is_judged_as_its_bytes(tmp_path: Path) -> None:
    key = Ed25519PrivateKey.generate()
    data = attest("lines", HEADER, events(4), key)
    for name, variant in variants(data).items():
        expected = verify_export(variant).to_json()
        path = tmp_path / "export.jsonl"
        path.write_bytes(variant)
        with open(path, "rb") as lines:
            assert verify_export(lines).to_json() == expected, name
        assert verify_export(io.BytesIO(variant)).to_json() == expected, name
        # the last newline is a separator: without it the lines are the same
        assert expected["ok"] == (name in ("intact", "no final newline")), (name, expected)

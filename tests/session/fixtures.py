"""Read the DSH reference fixtures' event records (a minimal reader for tests only)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import zstandard

ROOT = Path(__file__).resolve().parents[1] / "fixtures" / "dsh-reference"
EXPECTED: dict[str, Any] = json.loads((ROOT / "expected.json").read_text())


def fixture_records(name: str) -> list[bytes]:
    """The complete event lines of a fixture file (header line dropped, torn tail dropped).

    Only for the session-core tests: the physical reader belongs to the JSONL backend.
    """
    data = (ROOT / name).read_bytes()
    if name.endswith(".zstd"):
        decoder = zstandard.ZstdDecompressor().decompressobj(read_across_frames=True)
        data = decoder.decompress(data)
    lines = data.split(b"\n")[:-1]  # the last element is '' or a torn fragment
    return lines[1:]


def repairable_fixtures() -> list[str]:
    return [name for name, spec in EXPECTED.items() if isinstance(spec.get("closers"), list)]

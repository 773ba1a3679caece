"""``dsh sessions list``: the tokens column ends with the session's cost when every billed
model has a price (the composition's token-meter prices), and stays tokens only otherwise."""

from __future__ import annotations

import json
from pathlib import Path

from .cli_helpers import dsh, priced_composition


def test_the_listing_shows_the_cost_of_priced_sessions(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": [
        {"text": "Done.", "usage": {"input_tokens": 1000, "output_tokens": 200}}]}))  # fmt: skip
    priced = priced_composition(tmp_path)  # 1000 in + 200 out = $0.0040
    work = tmp_path / "ws"
    work.mkdir()
    root = str(tmp_path / "sessions")
    done = dsh("run", "go", "--model", f"scripted:{script}", "--workspace", str(work),
               "--config", str(priced), "--root", root, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr

    listed = dsh("sessions", "list", "--config", str(priced), "--root", root, cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    header, row = listed.stdout.splitlines()[:2]
    tokens = row.split("\t")[header.split("\t").index("tokens")]
    assert tokens == "1000 in, 200 out, $0.0040"

    unpriced = dsh("sessions", "list", "--root", root, cwd=tmp_path)  # catalogue only
    assert unpriced.stdout.splitlines()[1].split("\t")[6] == "1000 in, 200 out"

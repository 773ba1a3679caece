"""The cost on the command line (issue 40): ``dsh run --json``, ``dsh sessions list --json`` and
``dsh sessions show`` price the stored calls with the composition's token-meter ``prices:``, and
an unpriced model is said to be unknown, never shown as 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # real dsh processes


def _dsh(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "DSH_SESSION_ROOT"}
    env["XDG_CACHE_HOME"] = str(tmp / "cache")
    return subprocess.run(
        [sys.executable, "-m", "dsh_host", *args, "--root", str(tmp / "sessions")],
        env=env, cwd=tmp, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def _config(tmp: Path, prices: str | None) -> Path:
    text = (REPO / "configs" / "default.yml").read_text()
    if prices is not None:
        text = text.replace(
            "- id: token-meter\n  name: token-meter\n",
            f"- id: token-meter\n  name: token-meter\n  config:\n    prices:\n{prices}",
        )
        assert prices in text
    path = tmp / f"dsh-{len(list(tmp.glob('dsh-*.yml')))}.yml"
    path.write_text(text)
    return path


def test_run_list_and_show_report_the_priced_cost(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    # 1000 in + 250 cache read + 100 out at $3 / $0.3 / $15 per 1M:
    # 3000 + 75 + 1500 = 4575 micro-dollars
    usage = {"input_tokens": 1000, "output_tokens": 100, "cache_read_tokens": 250}
    script.write_text(json.dumps({"responses": [{"text": "hi", "usage": usage}]}))
    priced = _config(tmp_path, "      scripted: {input: 3, output: 15, cache_read: 0.3}\n")
    workspace = tmp_path / "ws"
    workspace.mkdir()
    ran = _dsh(tmp_path, "run", "go", "--model", f"scripted:{script}", "--config", str(priced),
               "--workspace", str(workspace), "--json")  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    result = json.loads(ran.stdout)
    assert result["usage"]["turn"]["costUsd"] == pytest.approx(0.004575)
    assert result["usage"]["total"]["cacheReadTokens"] == 250
    session_id = result["sessionId"]

    listed = _dsh(tmp_path, "sessions", "list", "--json", "--config", str(priced))
    assert listed.returncode == 0, listed.stderr
    [entry] = [json.loads(line) for line in listed.stdout.splitlines()]
    assert entry["usage"]["costUsd"] == pytest.approx(0.004575)
    assert "pricedWith" not in entry

    shown = _dsh(tmp_path, "sessions", "show", session_id, "--config", str(priced))
    assert shown.returncode == 0, shown.stderr
    assert "cost: $0.004575" in shown.stdout

    # Without prices (and no catalogue entry for "scripted"): unknown, said so, never $0.
    unpriced = _config(tmp_path, None)
    listed = _dsh(tmp_path, "sessions", "list", "--json", "--config", str(unpriced))
    [entry] = [json.loads(line) for line in listed.stdout.splitlines()]
    assert entry["usage"]["costUsd"] is None  # the cached summary was priced otherwise
    assert entry["usage"]["unpricedModels"] == ["scripted"]
    shown = _dsh(tmp_path, "sessions", "show", session_id, "--config", str(unpriced))
    assert "cost: unknown: no price for scripted (1 request(s))" in shown.stdout
    assert "$0 " not in shown.stdout

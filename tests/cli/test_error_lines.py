"""Error lines carry the code and the detail a person needs to fix the cause."""

from __future__ import annotations

import json
from pathlib import Path

from .cli_helpers import REPO, dsh


def test_a_base_url_without_v1_names_the_url_and_the_status(tmp_path: Path) -> None:
    """A 404 from the endpoint (the usual base-URL-without-/v1 mistake) says which URL was
    asked and that it answered 404, with the fix; before: only ``API error (HTTP 404)``."""
    from llm.sse_server import SseServer, http_error

    work = tmp_path / "ws"
    work.mkdir()
    with SseServer([http_error(404, "404 page not found", content_type="text/plain")]) as server:
        config = tmp_path / "dsh.yml"
        config.write_text(
            (REPO / "configs" / "default.yml").read_text()
            + f"\n- id: local\n  name: llm-openai-compatible\n  config:\n"
            f"    base_url: {server.url}\n    api_key_env: MY_KEY\n"
        )
        done = dsh("run", "hi", "--config", str(config), "--workspace", str(work),
                   "--root", str(tmp_path / "sessions"), "--model", "openai-compatible:m",
                   "--json", cwd=tmp_path, env={"MY_KEY": "k"})
    assert done.returncode == 1, done.stderr
    end = json.loads(done.stdout)["turnEnd"]
    assert end["kind"] == "error"
    assert f"HTTP 404 for POST {server.url}/chat/completions" in end["message"]
    assert "/v1" in end["message"]
    assert end["code"]


def test_a_wrong_config_value_names_file_line_and_the_valid_values(tmp_path: Path) -> None:
    """A bad value in a composition points at the row's file and line, and an enum error lists
    what is accepted; before: ``row 'builtin-tools' (builtin-tools): config.sandbox: invalid enum
    value 'workspace-writ'`` with neither."""
    work = tmp_path / "ws"
    work.mkdir()
    text = (REPO / "configs" / "default.yml").read_text()
    assert "    sandbox: workspace-write\n" in text
    config = tmp_path / "dsh.yml"
    config.write_text(text.replace("    sandbox: workspace-write\n", "    sandbox: workspace-writ\n"))
    line = 1 + text[: text.index("- id: builtin-tools")].count("\n")
    done = dsh("run", "hi", "--config", str(config), "--workspace", str(work),
               "--root", str(tmp_path / "sessions"), cwd=tmp_path)
    assert done.returncode == 2
    [error] = done.stderr.splitlines()
    assert error.startswith(f"dsh: error: {config}:{line} "), error
    assert "config.sandbox: invalid enum value 'workspace-writ'" in error
    assert "valid values: 'read-only', 'workspace-write', 'danger-full-access'" in error

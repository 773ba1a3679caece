"""``dsh plugins`` shows each row's effective config, secrets masked, and ``-v`` shows what the
plugins do during a run. Before: no config at all, and ``-v`` printed nothing on a good run."""

from __future__ import annotations

import json
from pathlib import Path

from .cli_helpers import REPO, dsh


def test_plugins_shows_effective_config_with_secrets_masked(tmp_path: Path) -> None:
    config = tmp_path / "dsh.yml"
    config.write_text(
        (REPO / "configs" / "default.yml").read_text()
        + "\n- id: remote\n  name: llm-openai-compatible\n  config:\n"
        "    base_url: http://me:hunter2@127.0.0.1:9/v1\n    api_key_env: MY_KEY\n"
        "    headers: {Authorization: Bearer hunter2, X-Team: blue}\n"
    )
    done = dsh("plugins", "--config", str(config), "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "hunter2" not in done.stdout
    rows = {row["id"]: row for row in json.loads(done.stdout)["rows"]}
    remote = rows["remote"]["config"]
    assert remote["base_url"] == "http://me:***@127.0.0.1:9/v1"
    assert remote["api_key_env"] == "MY_KEY"  # the variable's name is not a secret
    assert remote["headers"] == {"Authorization": "***", "X-Team": "blue"}
    assert remote["model"] == "deepseek-chat"  # defaults filled in: what the plugin got
    assert rows["builtin-tools"]["config"]["sandbox"] == "workspace-write"
    [line] = rows["sandbox"]["status"]
    assert line.startswith("sandbox: ")  # the chosen backend and why
    human = dsh("plugins", "--config", str(config), cwd=tmp_path)
    assert "hunter2" not in human.stdout
    assert '    config: {"api_key_env": "MY_KEY", "base_url": "http://me:***@127.0.0.1:9/v1"' in (
        human.stdout
    )


def test_verbose_run_logs_plugin_activity(tmp_path: Path) -> None:
    work = tmp_path / "ws"
    work.mkdir()
    done = dsh("-v", "run", "hi", "--workspace", str(work), "--root", str(tmp_path / "s"),
               "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    session = json.loads(done.stdout)["sessionId"]
    log = done.stderr.splitlines()
    assert any(line.startswith("dsh: dsh.host: row 'builtin-tools' (builtin-tools) active")
               for line in log), done.stderr
    assert f"dsh: dsh.session: {session} #0 session/header" in log or any(
        line.startswith(f"dsh: dsh.session: {session} #") and line.endswith(" turn/start")
        for line in log
    ), done.stderr
    quiet = dsh("run", "hi", "--workspace", str(work), "--root", str(tmp_path / "s"), "--json",
                cwd=tmp_path)
    assert quiet.stderr == ""

"""``dsh run``'s flags through the real ``dsh``: ``--session`` only continues and ``--new`` only
creates, ``--approval never`` says the policy refused (nobody was asked), and ``run --json``
carries the final text, the usage, an error's code and message, and the closers."""

from __future__ import annotations

import json
from pathlib import Path

from .cli_helpers import REPO, dsh


def test_session_flag_continues_and_only_new_creates(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    common = ("--root", str(root), "--json")
    typo = dsh("run", "--session", "my-wrok", *common, cwd=tmp_path)
    assert typo.returncode == 2 and "Traceback" not in typo.stderr, typo.stderr
    assert "--session my-wrok: no stored session has this id" in typo.stderr
    assert "pass --new" in typo.stderr
    assert not root.exists() or not list(root.glob("*/my-wrok"))  # nothing was created
    lone = dsh("run", "--new", *common, cwd=tmp_path)
    assert lone.returncode == 2 and "--new needs --session ID" in lone.stderr, lone.stderr
    made = dsh("run", "--session", "my-work", "--new", *common, cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["sessionId"] == "my-work"
    again = dsh("run", "--session", "my-work", "--new", *common, cwd=tmp_path)
    assert again.returncode == 2 and "already stored; drop --new" in again.stderr, again.stderr
    # the demo never continues a session: continuing it names a model (logged as an override)
    demo = dsh("run", "--session", "my-work", *common, cwd=tmp_path)
    assert demo.returncode == 2 and "built-in demo script" in demo.stderr, demo.stderr
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": [{"text": "continued"}]}))
    continued = dsh("run", "--session", "my-work", "go on", "--model", f"scripted:{script}",
                    *common, cwd=tmp_path)
    assert continued.returncode == 0, continued.stderr
    assert json.loads(continued.stdout)["events"] > json.loads(made.stdout)["events"]


def test_approval_never_says_the_policy_refused_not_a_person(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    config = tmp_path / "composition.yml"
    config.write_text(
        (REPO / "configs" / "default.yml").read_text()
        + "\n- id: rules\n  name: tool-rules\n  config:\n    rules:\n"
        + "      - {tool: write_file, decision: ask, reason: writes need a human}\n"
    )
    script = tmp_path / "script.json"
    call = {"name": "write_file", "id": "c-w", "arguments": {"path": "x.txt", "content": "x"}}
    script.write_text(json.dumps({"responses": [{"tool_calls": [call]}, {"text": "done"}]}))
    result = dsh(
        "run", "go", "--model", f"scripted:{script}", "--root", str(tmp_path / "s"),
        "--config", str(config), "--approval", "never", cwd=workspace,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "? approval rejected by the approval policy never (no one was asked)" in result.stdout
    assert not (workspace / "x.txt").exists()
    helped = dsh("run", "--help", cwd=tmp_path)
    assert "never: nobody is asked" in " ".join(helped.stdout.split())


def test_run_json_carries_the_error_usage_final_text_and_closers(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    cwd = tmp_path / "ws"  # beside the session root, not above it (D15)
    cwd.mkdir()
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": [{"text": "first answer"}]}))
    made = dsh("run", "hi", "--model", f"scripted:{script}", "--root", str(root), "--json",
               cwd=cwd)  # fmt: skip
    assert made.returncode == 0, made.stderr
    payload = json.loads(made.stdout)
    assert {"sessionId", "turnEnd", "events"} <= set(payload)  # the old keys stay
    assert payload["finalText"] == "first answer"
    turn, total = payload["usage"]["turn"], payload["usage"]["total"]
    assert turn["inputTokens"] > 0 and turn["outputTokens"] > 0 and "cacheReadTokens" in turn
    assert total == turn
    # A failing turn on the same session: its code and message, usage summed, closers listed.
    failed = dsh(
        "run", "again", "--session", payload["sessionId"], "--model", "openai-compatible:x",
        "--root", str(root), "--json", cwd=cwd, env={"DEEPSEEK_API_KEY": ""},
    )  # fmt: skip
    assert failed.returncode == 1, failed.stderr
    second = json.loads(failed.stdout)
    assert second["turnEnd"]["kind"] == "error"
    assert second["turnEnd"]["code"] == "INVALID_CREDENTIAL"  # an empty key
    assert "DEEPSEEK_API_KEY" in second["turnEnd"]["message"]
    assert second["finalText"] is None and second["closers"] == []
    assert second["usage"]["total"] == total

"""Bad data from a model or a tool never crashes the harness (issue 14 item 6).

Each case runs the real ``dsh run`` over a scripted model: the bad value must
end as an ordinary result (or be stored as it is), every other call of the
step must still run and be recorded, the turn must complete, and the stored
log must read back intact (``dsh sessions verify`` exits 0). Before the fix, a
lone surrogate in tool arguments crashed the run with a raw
``msgspec.DecodeError`` at the next flush and lost the step's results.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .cli_helpers import dsh

SURROGATE_ARGS = '{"path": "\\udcff"}'  # what a model's JSON may carry: an escaped lone surrogate


def run_script(tmp_path: Path, responses: list[dict[str, Any]]) -> tuple[dict[str, Any], Path]:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": responses}))
    workspace = tmp_path / "ws"
    workspace.mkdir(exist_ok=True)
    root = tmp_path / "sessions"
    result = dsh(
        "run", "go", "--model", f"scripted:{script}", "--workspace", str(workspace),
        "--root", str(root), "--json", cwd=tmp_path,
    )  # fmt: skip
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["turnEnd"] == {"kind": "completed"}
    verify = dsh("sessions", "verify", summary["sessionId"], "--root", str(root), cwd=tmp_path)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    return summary, root


def stored(tmp_path: Path, root: Path, session_id: str) -> list[dict[str, Any]]:
    shown = dsh(
        "sessions", "show", session_id, "--root", str(root), "--view", "events", "--json",
        cwd=tmp_path,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    return [json.loads(line) for line in shown.stdout.splitlines() if line.strip()]


def results(events: list[dict[str, Any]]) -> dict[str, tuple[str | None, str]]:
    out = {}
    for event in events:
        if event["type"] == "tool/result":
            block = event["data"]["message"]["content"][0]
            text = "".join(part.get("text", "") for part in block["content"])
            code = event["data"].get("error", {}).get("code")
            out[block["toolCallId"]] = (code, text)
    return out


def test_a_lone_surrogate_in_tool_arguments_is_invalid_args_and_the_step_goes_on(
    tmp_path: Path,
) -> None:
    summary, root = run_script(
        tmp_path,
        [
            {
                "tool_calls": [
                    {"name": "read_file", "id": "c-bad", "arguments": SURROGATE_ARGS},
                    {"name": "write_file", "id": "c-bad-2",
                     "arguments": '{"path": "ok.txt", "content": "a\\ud800b"}'},
                    {"name": "bash", "id": "c-ok",
                     "arguments": {"command": "echo fine", "description": "x"}},
                ]
            },
            {"text": "done"},
        ],
    )  # fmt: skip
    found = results(stored(tmp_path, root, summary["sessionId"]))
    assert found["c-bad"][0] == "INVALID_ARGS"
    assert "lone UTF-16 surrogate (\\udcff)" in found["c-bad"][1]
    assert found["c-bad-2"][0] == "INVALID_ARGS"
    assert '"content"' in found["c-bad-2"][1]
    assert not (tmp_path / "ws" / "ok.txt").exists()
    assert found["c-ok"] == (None, "fine\n")


def test_a_lone_surrogate_in_streamed_text_is_stored_as_is(tmp_path: Path) -> None:
    # A model may stream one (JS writers store it as a \\udXXX escape); it is not ours to
    # refuse, and the log must take it like DSH's does.
    summary, root = run_script(tmp_path, [{"text": "half a pair: \udcff end"}])
    events = stored(tmp_path, root, summary["sessionId"])
    [message] = [e for e in events if e["type"] == "assistant/message"]
    assert message["data"]["message"]["content"][0]["text"] == "half a pair: \udcff end"


def test_tool_output_that_is_not_utf8_or_is_huge_is_a_result(tmp_path: Path) -> None:
    summary, root = run_script(
        tmp_path,
        [
            {
                "tool_calls": [
                    {"name": "bash", "id": "c-bytes",
                     "arguments": {"command": "printf 'a\\377\\376b\\300'", "description": "x"}},
                    {"name": "bash", "id": "c-huge",
                     "arguments": {"command": "head -c 3000000 /dev/zero | tr '\\0' x",
                                   "description": "x"}},
                ]
            },
            {"text": "done"},
        ],
    )  # fmt: skip
    found = results(stored(tmp_path, root, summary["sessionId"]))
    code, text = found["c-bytes"]
    assert code is None and text.startswith("a") and "b" in text
    text.encode("utf-8")  # what is stored is text (invalid bytes replaced, not smuggled)
    code, text = found["c-huge"]
    assert code is None
    assert len(text) < 3_000_000  # bounded in the log, not the whole 3 MB

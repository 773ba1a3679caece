"""``dsh run PROMPT --attach FILE``: the file is logged as DSH's block and sent natively; a bad
file is one error line naming it, before any session or request exists."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

from .cli_helpers import REPO, dsh, json_lines

sys.path.insert(0, str(REPO / "tests" / "llm"))
_server = importlib.import_module("sse_server")  # tests/llm's loopback model server
SseServer, sse, text_events = _server.SseServer, _server.sse, _server.text_events

PNG = (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x02\x00\x00"
       b"\x00\x90wS\xde\x00\x00\x00\x0cIDATx\x9cc\xf8\xcf\xc0\x00\x00\x03\x01\x01\x00\xc9\xfe"
       b"\x92\xef\x00\x00\x00\x00IEND\xaeB`\x82")


def _config(tmp_path: Path, url: str) -> Path:
    config = tmp_path / "dsh.yml"
    config.write_text(
        (REPO / "configs" / "default.yml").read_text()
        + f"\n- id: local\n  name: llm-openai-compatible\n  config:\n"
        f"    base_url: {url}\n    api_key_env: MY_KEY\n"
    )
    return config


def test_run_attach_logs_the_image_and_sends_it_as_a_data_uri(tmp_path: Path) -> None:
    image = tmp_path / "dot.png"
    image.write_bytes(PNG)
    work = tmp_path / "ws"
    work.mkdir()
    with SseServer([sse(text_events("A dot.")), sse(text_events("Dot"))]) as server:
        done = dsh("run", "what is this?", "--attach", str(image),
                   "--config", str(_config(tmp_path, server.url)), "--workspace", str(work),
                   "--root", str(tmp_path / "sessions"), "--model", "openai-compatible:m",
                   "--json", cwd=tmp_path, env={"MY_KEY": "k"})
        assert done.returncode == 0, done.stderr
        bodies = [r.body for r in server.requests]
    payload = json.loads(done.stdout)
    assert payload["turnEnd"] == {"kind": "completed"}
    turn = bodies[0]
    [parts] = [m["content"] for m in turn["messages"] if isinstance(m["content"], list)]
    assert parts[0] == {"type": "text", "text": "what is this?"}
    assert parts[1]["image_url"]["url"].startswith("data:image/png;base64,iVBORw0KGgo")
    events = json_lines(dsh("sessions", "show", payload["sessionId"], "--view", "events",
                            "--json", "--root", str(tmp_path / "sessions"), cwd=tmp_path).stdout)
    [prompt] = [e["data"] for e in events if e["type"] == "user/message"
                and e["data"]["source"]["kind"] == "user"]
    image_block = prompt["content"][1]
    assert image_block["type"] == "image"
    assert {k: image_block["attachment"][k] for k in ("mediaType", "bytes", "name")} == {
        "mediaType": "image/png", "bytes": len(PNG), "name": "dot.png",
    }
    assert image_block["attachment"]["attachmentId"].startswith("sha256-")


def test_a_bad_attachment_is_one_line_before_anything(tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("plain text")
    done = dsh("run", "read this", "--attach", str(notes), "--model", "demo",
               "--root", str(tmp_path / "sessions"), cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("dsh: error: cannot attach ") and "notes.txt" in line
    assert "not an accepted type" in line
    assert not (tmp_path / "sessions").exists() or not any((tmp_path / "sessions").rglob("*.jsonl*"))
    missing = dsh("run", "--attach", str(notes), "--model", "demo", cwd=tmp_path)
    assert missing.returncode == 2 and "--attach needs a PROMPT" in missing.stderr

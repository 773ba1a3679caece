"""The web inspector in a real browser: headless Chromium driven by Playwright.

A real ``dsh serve`` process serves the page and the API; the page lists sessions, shows a
session's transcript live over SSE while a turn runs, and approves a pending call, which then
runs. Everything from the model and the tools is shown as text: an HTML payload in the model's
answer and in the prompt stays inert (no element is created, no dialog opens).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from playwright.sync_api import Dialog

from .harness import CALL, write_composition

playwright_sync = pytest.importorskip("playwright.sync_api")

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
PAYLOAD = '<img src=x onerror="alert(1)"><script>alert(2)</script>'


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    workspace, work = tmp_path / "ws", tmp_path / "work"
    workspace.mkdir()
    work.mkdir()
    responses = [
        {"text": f"I will append to the ledger. {PAYLOAD}", "chunk_delay_ms": 20,
         "tool_calls": [{"id": CALL, "name": "bash", "arguments": {
             "command": 'printf "%s\\n" "$DSH_CALL_ID" >> ledger',
             "description": f"Append to ledger {PAYLOAD}"}}]},
        {"text": "The ledger was updated."},
    ]
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": responses}))
    proc = subprocess.Popen(
        [sys.executable, "-m", "dsh_host", "serve", "--config", str(write_composition(tmp_path)),
         "--model", f"scripted:{script}", "--root", str(tmp_path / "sessions"),
         "--workspace", str(workspace), "--port", "0"],
        cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={k: v for k, v in os.environ.items() if k != "DSH_SERVE_TOKEN"},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert proc.stderr is not None
        assert line.startswith("dsh serve: listening on "), line + proc.stderr.read()
        yield line.split()[4], workspace
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_inspector_streams_a_turn_and_approves_a_call(served: tuple[str, Path]) -> None:
    url, workspace = served
    dialogs: list[str] = []
    with playwright_sync.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.set_default_timeout(120_000)

            def dismiss(dialog: Dialog) -> None:
                dialogs.append(dialog.message)
                dialog.dismiss()

            page.on("dialog", dismiss)
            page.goto(url)
            page.wait_for_selector("#sessions")
            page.click("#new-session")
            page.wait_for_selector("#transcript", state="attached")
            page.wait_for_selector("#live:has-text('live')")
            # The page is open before the turn starts: what appears comes through the stream.
            page.fill("#prompt", f"append to the ledger {PAYLOAD}")
            page.click("#send")
            pending = page.wait_for_selector(f".pending[data-call='{CALL}']")
            assert "Append to ledger" in pending.inner_text()
            transcript = page.locator("#transcript")
            transcript.locator(".ev.approval").first.wait_for()
            prompt = transcript.locator(".ev.user").first.inner_text()
            assert prompt.endswith(f"append to the ledger {PAYLOAD}")
            answer = transcript.locator(".ev.assistant").first.inner_text()
            assert answer.endswith(f"I will append to the ledger. {PAYLOAD}")  # shown as text...
            assert page.locator("#transcript img, #transcript script").count() == 0  # ...inert
            assert (workspace / "ledger").exists() is False
            page.click(f".pending[data-call='{CALL}'] button.allow")
            page.wait_for_selector(".ev.turn-end:has-text('turn 2 ended: completed')")
            result = transcript.locator(f".ev.tool-result:has-text('[{CALL}]')")
            assert result.count() == 1
            assert "The ledger was updated." in transcript.inner_text()
            assert page.locator(".pending").count() == 0
            assert (workspace / "ledger").read_text().splitlines() == [CALL]
            # Back to the list: the session with its title and status.
            page.click("text=← sessions")
            row = page.wait_for_selector("#sessions tbody tr")
            assert "append to the ledger" in row.inner_text()
            page.wait_for_selector("#sessions tbody tr td.status-idle")
        finally:
            browser.close()
    assert dialogs == []

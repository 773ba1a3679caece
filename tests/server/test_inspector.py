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
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

if TYPE_CHECKING:
    from playwright.sync_api import Dialog

from .harness import CALL, REPO, write_composition

playwright_sync = pytest.importorskip("playwright.sync_api")

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
PAYLOAD = '<img src=x onerror="alert(1)"><script>alert(2)</script>'


@contextmanager
def _serve(tmp_path: Path, responses: list[Any], config: Path | None = None) -> Iterator[str]:
    """A real ``dsh serve`` on a free port over ``tmp_path / "ws"`` (which must exist), the model
    scripted with ``responses``, the composition ``config`` (default: the test composition);
    yields its URL (no trailing slash)."""
    work = tmp_path / "work"
    work.mkdir()
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": responses}))
    proc = subprocess.Popen(
        [sys.executable, "-m", "dsh_host", "serve", "--config",
         str(config if config is not None else write_composition(tmp_path)),
         "--model", f"scripted:{script}", "--root", str(tmp_path / "sessions"),
         "--workspace", str(tmp_path / "ws"), "--port", "0"],
        cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={k: v for k, v in os.environ.items() if k != "DSH_SERVE_TOKEN"},
    )  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stderr is not None
        line = proc.stdout.readline()
        assert line.startswith("dsh serve: listening on "), line + proc.stderr.read()
        yield line.split()[4].rstrip("/")
    finally:
        proc.terminate()
        proc.wait(timeout=60)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    responses = [
        {"text": f"I will append to the ledger. {PAYLOAD}", "chunk_delay_ms": 20,
         "tool_calls": [{"id": CALL, "name": "bash", "arguments": {
             "command": 'printf "%s\\n" "$DSH_CALL_ID" >> ledger',
             "description": f"Append to ledger {PAYLOAD}"}}]},
        {"text": "The ledger was updated."},
    ]
    with _serve(tmp_path, responses) as url:
        yield url + "/", workspace


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


# ---------------------------------------------------------------- the redesigned pages
RLO, ZWSP = "\u202e", "\u200b"


@pytest.fixture
def sessions_served(tmp_path: Path) -> Iterator[str]:
    """``dsh serve`` holding four sessions in four states: completed (markdown, an edit, a
    long result), failed (the model refused the key), aborted (cancelled while the model
    streamed), awaiting approval (arguments with hidden characters)."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "notes.md").write_text("alpha\nbeta\n")
    (workspace / "long.txt").write_text("".join(f"row {n}\n" for n in range(1, 41)))
    responses = [
        {"text": "# Report\n\nI **fixed** the `notes` file:\n\n- one\n- two\n",
         "tool_calls": [
             {"name": "edit_file", "arguments": {
                 "path": "notes.md", "old_string": "beta", "new_string": "gamma"}},
             {"name": "read_file", "arguments": {"path": "long.txt"}}]},
        {"text": "Done: see *notes.md*."},
        {"error": {"code": "AUTH", "message": "the key was refused"}},
        {"text": "thinking about it", "hang": True},
        {"tool_calls": [{"id": CALL, "name": "bash", "arguments": {
            "command": f"mv report.txt report{ZWSP}.exe", "description": f"rename {RLO}txt.exe"}}]},
    ]
    with _serve(tmp_path, responses) as url, httpx.Client(base_url=url, timeout=60) as client:
            def session(name: str, prompt: str, done: Callable[[dict[str, Any]], bool]) -> None:
                assert client.post("/sessions", json={"id": name}).status_code == 201
                assert client.post(f"/sessions/{name}/turns", json={"prompt": prompt}).status_code == 202
                deadline = time.monotonic() + 120  # a hang guard, not a timing assertion
                while not done(state := client.get(f"/sessions/{name}").json()):
                    assert time.monotonic() < deadline, state
                    time.sleep(0.1)

            def ended(s: dict[str, Any]) -> bool:
                return s["status"] == "idle" and s["lastTurnEnd"] is not None

            session("report", "write the report", ended)
            session("broken", "try the model", ended)
            session("stuck", "wait for me", lambda s: s["status"] == "running"
                    and s["events"] > 3 and bool(client.post("/sessions/stuck/cancel")))
            while not ended(client.get("/sessions/stuck").json()):
                time.sleep(0.1)
            session("approve", "rename the report", lambda s: s["status"] == "awaiting-approval")
            yield url


def _shoot(page: Any, name: str, tmp_path: Path) -> None:
    """A screenshot for a person to look at (kept in DSH_SCREENSHOTS when that is set)."""
    target = Path(os.environ.get("DSH_SCREENSHOTS", str(tmp_path)))
    target.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(target / f"{name}.png"), full_page=True)


def _fits(page: Any) -> None:
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= page.viewport_size["width"] + 1, f"the page scrolls sideways: {width}"


def test_the_inspector_tells_each_state_and_reads_like_the_terminal(
    sessions_served: str, tmp_path: Path
) -> None:
    url = sessions_served
    with playwright_sync.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            for width, height, size in ((1280, 900, "desktop"), (390, 844, "phone")):
                page = browser.new_page(viewport={"width": width, "height": height})
                page.set_default_timeout(120_000)
                page.goto(url)
                # The list: the true status of each session, search and filter.
                page.wait_for_selector("#sessions tbody tr[data-id='approve']")
                for name, status in (("report", "idle"), ("broken", "failed"),
                                     ("stuck", "aborted"), ("approve", "awaiting-approval")):
                    assert page.locator(
                        f"tr[data-id='{name}'] td.status-{status}").count() == 1, name
                _fits(page)
                _shoot(page, f"list-{size}", tmp_path)
                page.fill("#search", "write the")
                assert page.locator("#sessions tbody tr").count() == 1
                page.fill("#search", "")
                page.select_option("#status-filter", "failed")
                assert [r.get_attribute("data-id") for r in
                        page.locator("#sessions tbody tr").all()] == ["broken"]
                page.select_option("#status-filter", "all")
                # A completed session: markdown rendered, the edit as a diff, a long result
                # folded, a timeline with durations, the model view one click away.
                page.goto(url + "#/sessions/report")
                page.wait_for_selector(".ev.turn-end:has-text('turn 1 ended: completed')")
                answer = page.locator(".ev.assistant").first
                assert answer.locator("h2").inner_text() == "Report"
                assert answer.locator("strong").inner_text() == "fixed"
                assert answer.locator("li").count() == 2 and "**" not in answer.inner_text()
                assert page.locator(".diff .del").all_inner_texts() == ["- beta"]
                assert page.locator(".diff .add").all_inner_texts() == ["+ gamma"]
                fold = page.locator(".ev.tool-result details.fold")
                assert fold.count() == 1 and fold.get_attribute("open") is None
                # read_file's answer as a person reads it: the path, not the model's tags
                assert fold.locator("summary").inner_text().endswith("long.txt")
                assert "<content>" not in fold.inner_text()
                calls = page.locator(".ev.tool-call").all_inner_texts()
                assert [c.split()[1] for c in calls] == ["edit_file", "read_file"], calls
                assert "long.txt" in calls[1]
                spans = page.locator("#timeline .span.tool .dur").all_inner_texts()
                assert len(spans) == 2 and "…" not in spans, spans
                _shoot(page, f"timeline-{size}", tmp_path)
                page.click("#tab-model")
                messages = page.locator("#model-view .msg")
                messages.first.wait_for()
                assert messages.count() >= 4, page.locator("#error").inner_text()
                _fits(page)
                _shoot(page, f"session-{size}", tmp_path)
                # A failed turn says why.
                page.goto(url + "#/sessions/broken")
                page.wait_for_selector(".ev.turn-end.failed:has-text('AUTH')")
                assert page.locator("#meta .badge").inner_text() == "failed"
                # The pending approval as the CLI asks it: hidden characters shown and
                # counted, wrapped to the screen, the buttons after the whole text.
                page.goto(url + "#/sessions/approve")
                box = page.wait_for_selector(f".pending[data-call='{CALL}']")
                shown = box.inner_text()
                assert "⟦U+202E⟧" in shown and "⟦U+200B⟧" in shown and RLO not in shown
                assert "2 hidden characters" in shown
                # The stream answers after the state that drew the box: wait for it to say
                # something, then it must say "live" (never "reconnecting…").
                page.wait_for_function("() => document.querySelector('#live').textContent !== ''")
                assert page.locator("#live").inner_text() == "live"  # the stream never broke
                after = page.evaluate(
                    "() => { const box = document.querySelector('.pending');"
                    " const pre = box.querySelector('pre'), b = box.querySelector('button.allow');"
                    " return Boolean(pre.compareDocumentPosition(b) & 4); }")
                assert after
                _fits(page)
                _shoot(page, f"approval-{size}", tmp_path)
                page.close()
        finally:
            browser.close()


def test_a_delegation_links_its_child_session_and_back(tmp_path: Path) -> None:
    """A delegation's child session (DSH's ``subagent/catalog`` fact in the parent's log) is one
    click away or inline under the delegation, and the child's page names its parent (issue 34:
    the inspector shows the tree)."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (tmp_path / "reader.json").write_text(json.dumps({"responses": [{"text": "One line."}]}))
    config = tmp_path / "team.yml"
    config.write_text((REPO / "configs" / "default.yml").read_text() + (
        f"- {{id: model-reader, name: llm-scripted, config: {{provider: reader, "
        f"path: {tmp_path / 'reader.json'}}}}}\n"
        "- id: subagents\n  name: subagents\n  config:\n    agents:\n"
        "      - {name: reader, description: Summarizes., instructions: One sentence., "
        "tools: [], provider: reader, model: scripted}\n"))
    lead = [
        {"tool_calls": [{"id": "call-sub", "name": "subagent",
                         "arguments": {"agent": "reader", "prompt": "summarize the plan"}}]},
        {"text": "The reader said it."}]  # fmt: skip
    with _serve(tmp_path, lead, config) as url:
        with httpx.Client(base_url=url, timeout=60) as client:
            assert client.post("/sessions", json={"id": "lead"}).status_code == 201
            assert client.post("/sessions/lead/turns", json={"prompt": "plan"}).status_code == 202
            deadline = time.monotonic() + 120  # a hang guard, not a timing assertion
            while (state := client.get("/sessions/lead").json())["lastTurnEnd"] is None:
                assert time.monotonic() < deadline, state
                time.sleep(0.1)
            assert state["lastTurnEnd"]["kind"] == "completed", state
        with playwright_sync.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page()
                page.set_default_timeout(120_000)
                page.goto(url + "/#/sessions/lead")
                link = page.wait_for_selector(".ev.subagent a.child-link")
                assert link.get_attribute("href") == "#/sessions/lead--call-sub"
                page.click(".ev.subagent .child-inline summary")  # the tree, in place
                page.wait_for_selector(".child-inline .ev.assistant:has-text('One line.')")
                page.wait_for_selector(".child-inline .ev.user:has-text('summarize the plan')")
                link.click()
                page.wait_for_selector(".ev.assistant:has-text('One line.')")
                # a locator, not an element handle: the meta line is drawn again on each refresh
                parent = page.locator("#meta .parent a")
                parent.wait_for()
                assert parent.inner_text() == "lead"
                parent.click()
                page.wait_for_selector(".ev.assistant:has-text('The reader said it.')")
            finally:
                browser.close()


# ---------------------------------------------------------------- fork here
@pytest.fixture
def two_turns_served(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """``dsh serve`` holding session ``src``: turn 1 answers, turn 2 reads a file."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "notes.md").write_text("alpha\n")
    responses = [
        {"text": "First answer."},
        {"tool_calls": [{"id": "read-1", "name": "read_file", "arguments": {"path": "notes.md"}}]},
        {"text": "Second answer."},
    ]
    with _serve(tmp_path, responses) as url, httpx.Client(base_url=url, timeout=60) as client:
            assert client.post("/sessions", json={"id": "src"}).status_code == 201
            for number, prompt in ((1, "first"), (2, "read the notes")):
                started = client.post("/sessions/src/turns", json={"prompt": prompt})
                assert started.status_code == 202, started.text
                deadline = time.monotonic() + 120  # a hang guard, not a timing assertion
                while not ((s := client.get("/sessions/src").json())["status"] == "idle"
                           and s["lastTurn"] == number and s["lastTurnEnd"] is not None):
                    assert time.monotonic() < deadline, s
                    time.sleep(0.1)
            yield url, tmp_path


def test_fork_here_at_a_turn_boundary_opens_the_child(
    two_turns_served: tuple[str, Path], tmp_path: Path
) -> None:
    url, _ = two_turns_served
    with playwright_sync.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.set_default_timeout(120_000)
            page.goto(url + "#/sessions/src")
            page.wait_for_selector(".ev.turn-end:has-text('turn 2 ended: completed')")
            # one action per turn boundary
            assert page.locator(".ev.turn-end button.fork").count() == 2
            assert "null" not in page.locator("#meta").inner_text()  # no absent part as text
            _shoot(page, "fork-source", tmp_path)
            page.click(".ev.turn-end:has-text('turn 1 ended') button.fork")
            page.wait_for_selector("#meta .parent:has-text('forked from src')")  # the child's
            child = page.url.rsplit("#/sessions/", 1)[1]
            assert child != "src"
            page.wait_for_selector(".ev.turn-end:has-text('turn 1 ended: completed')")
            assert page.locator("#error").inner_text() == ""
            assert "First answer." in page.locator("#transcript").inner_text()
            assert "Second answer." not in page.locator("#transcript").inner_text()
            assert page.locator(".ev.turn-end").count() == 1
            _shoot(page, "fork-child", tmp_path)
        finally:
            browser.close()
    with httpx.Client(base_url=url, timeout=60) as client:
        events = [json.loads(line) for line in
                  client.get(f"/sessions/{child}/events").text.splitlines() if line]  # fmt: skip
    (ledger,) = [e for e in events if e["type"] == "fork/effects"]
    assert ledger["data"]["parentSession"] == "src"
    assert [e["tool"] for e in ledger["data"]["effects"]] == ["read_file"]  # turn 2's call

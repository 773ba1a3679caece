"""Reconcilers (D26): SIGKILL inside a tool body, resume, the reconciler's verdict is recorded.

A real child process runs a turn whose ``transfer`` body does its effect (or not) and blocks;
the parent SIGKILLs it. The resume runs in this process over the same store (JSONL files or a
SQLite database) through a fresh backend: the closer says ``TOOL_OUTCOME_UNKNOWN`` as always,
then the tool's reconciler is asked, through the tools pipeline, with the call's idempotency
key; its verdict becomes a ``tool/reconciled`` event and the text the model reads.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from dsh_host import Row, open_host
from dsh_host._agent.reconcile import (
    RECONCILED_DONE_TEXT,
    RECONCILED_EVENT,
    RECONCILED_NOT_DONE_TEXT,
)
from dsh_host._session.approvals import pending_approvals
from dsh_host._session.effects import effects_after, idempotency_key
from dsh_host._session.events import SessionEvent, event_to_builtins
from dsh_host._session.repair import TOOL_OUTCOME_UNKNOWN, TOOL_OUTCOME_UNKNOWN_TEXT
from dsh_host._tools import TOOLS_PRE_EXECUTE, Deny, PreToolDecision, ToolExecution

from .agent_helpers import model_requests
from .reconcile_tool import make_transfer, persistence_row

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]

CHILD = Path(__file__).with_name("reconcile_tool.py")
SESSION = "reconcile-session"
CALL = {"tool_calls": [{"name": "transfer", "arguments": {"to": "bob", "cents": 500},
                        "id": "pay-1"}]}  # fmt: skip
START_TIMEOUT = 60.0  # a hang guard only


def crash_in_body(tmp_path: Path, store: str, *, effect: bool) -> tuple[str, Path]:
    """Run the child until ``transfer`` reached its kill point, SIGKILL it; (root, ledger)."""
    root = str(tmp_path / "store")
    ledger, ready = tmp_path / "ledger.txt", tmp_path / "ready"
    spec = {
        "store": store, "root": root, "ledger": str(ledger), "ready": str(ready),
        "effect": effect, "session": SESSION, "responses": [CALL, {"text": "never"}],
    }  # fmt: skip
    child = subprocess.Popen(
        [sys.executable, str(CHILD), json.dumps(spec)], stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not ready.exists() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        if not ready.exists():
            child.kill()
            _, err = child.communicate(timeout=60)
            raise AssertionError(f"the child never reached the tool body:\n{err}")
        os.kill(child.pid, signal.SIGKILL)
    finally:
        if child.poll() is None:
            child.wait(timeout=60)
        if child.stderr is not None:
            child.stderr.close()
    assert child.returncode == -signal.SIGKILL
    return root, ledger


def rows(store: str, root: str, responses: list[Any]) -> list[Row]:
    return [
        Row(name="sessions"),
        Row(name="llm"),
        Row(name="tools"),
        Row(id="model", name="llm-scripted", config={"responses": responses}),
        persistence_row(store, root),
        Row(name="session-checkpoint-policy"),
        Row(name="agent", config={"provider": "scripted", "model": "scripted"}),
    ]


def plain(events: Any) -> list[dict[str, Any]]:
    return [event_to_builtins(event) for event in events]


def texts(event: SessionEvent) -> list[str]:
    block = event_to_builtins(event)["data"]["message"]["content"][0]
    return [part["text"] for part in block["content"]]


async def stored(store: str, root: str) -> list[dict[str, Any]]:
    async with open_host([Row(name="sessions"), persistence_row(store, root)]) as host:
        handle = await host.ctx.sessionPersistence.open(SESSION, "read")
        load = await handle.read()
        await handle.close()
    return plain(load.events)


@pytest.mark.parametrize("store", ["jsonl", "sqlite"])
async def test_a_call_that_took_effect_is_reconciled_done(tmp_path: Path, store: str) -> None:
    root, ledger = crash_in_body(tmp_path, store, effect=True)
    key = idempotency_key(SESSION, "pay-1")
    assert ledger.read_text() == f"{key} bob 500\n"  # the world saw the transfer
    async with open_host(rows(store, root, [{"text": "it went through"}])) as host:
        host.ctx.tools.register(make_transfer(str(ledger)).definition)
        agent = await host.ctx.agent.resume(SESSION)
        (verdict,) = agent.reconciled
        assert (verdict.call_id, verdict.verdict, verdict.detail) == ("pay-1", "done", None)
        events = agent.session.events
        call = next(e for e in events if e.type == "tool/call")
        marker, result = events[verdict.event_seq], events[verdict.result_seq or 0]
        await agent.run_turn("did it go through?")
        requests = model_requests(host)
        await agent.aclose()
    assert marker.type == RECONCILED_EVENT and marker.ignorable is True
    assert event_to_builtins(marker)["data"] == {
        "callId": "pay-1", "tool": "transfer", "verdict": "done", "idempotencyKey": key,
        "callSeq": call.seq,
    }  # fmt: skip
    # the call's one result is the one the reconciler found, a success, citing its tool/call
    assert result.seq == marker.seq + 1 and texts(result) == [
        RECONCILED_DONE_TEXT, "transferred 500 cents to bob",
    ]  # fmt: skip
    plain_result = event_to_builtins(result)
    assert plain_result["sourceEventSeqs"] == [call.seq] and "error" not in plain_result["data"]
    assert plain_result["data"]["message"]["content"][0].get("isError") is not True
    last_request = msgspec.json.encode(list(requests[-1].messages)).decode()
    assert RECONCILED_DONE_TEXT in last_request and TOOL_OUTCOME_UNKNOWN_TEXT not in last_request
    assert ledger.read_text() == f"{key} bob 500\n"  # nothing re-ran the body
    on_disk = await stored(store, root)
    assert [e["type"] for e in on_disk[marker.seq :]][:4] == [
        RECONCILED_EVENT, "tool/result", "step/end", "turn/end",
    ]  # fmt: skip
    assert on_disk[verdict.event_seq] == event_to_builtins(marker)  # durable
    assert sum(e["type"] == "tool/result" for e in on_disk) == 1
    (effect,) = effects_after(SESSION, on_disk, 0)
    assert (effect.status, effect.reconciled) == ("done", "done")


@pytest.mark.parametrize("store", ["jsonl", "sqlite"])
async def test_a_call_that_did_not_take_effect_is_reconciled_not_done(
    tmp_path: Path, store: str
) -> None:
    root, ledger = crash_in_body(tmp_path, store, effect=False)
    ledger.write_text("")  # the service answers: no such key
    async with open_host(rows(store, root, [{"text": "ok"}])) as host:
        host.ctx.tools.register(make_transfer(str(ledger)).definition)
        agent = await host.ctx.agent.resume(SESSION)
        (verdict,) = agent.reconciled
        result = agent.session.events[verdict.result_seq or 0]
        await agent.aclose()
    assert verdict.verdict == "not-done"
    assert texts(result) == [RECONCILED_NOT_DONE_TEXT]
    assert event_to_builtins(result)["data"]["error"]["code"] == "TOOL_NOT_STARTED"
    (effect,) = effects_after(SESSION, await stored(store, root), 0)
    assert (effect.status, effect.reconciled) == ("not-started", "not-done")


async def test_an_unknown_verdict_leaves_the_call_unknown(tmp_path: Path) -> None:
    root, ledger = crash_in_body(tmp_path, "jsonl", effect=True)
    ledger.unlink()  # the service cannot be asked
    async with open_host(rows("jsonl", root, [{"text": "ok"}])) as host:
        host.ctx.tools.register(make_transfer(str(ledger)).definition)
        agent = await host.ctx.agent.resume(SESSION)
        (verdict,) = agent.reconciled
        results = [e for e in agent.session.events if e.type == "tool/result"]
        await agent.aclose()
    assert (verdict.verdict, verdict.detail) == ("unknown", "the ledger cannot be read")
    assert verdict.result_seq is None and len(results) == 1
    assert texts(results[0]) == [TOOL_OUTCOME_UNKNOWN_TEXT]
    (effect,) = effects_after(SESSION, await stored("jsonl", root), 0)
    assert effect.status == "unknown"


async def test_the_reconciler_runs_under_the_tools_rules(tmp_path: Path) -> None:
    """A pre-execute rule that denies the tool denies its reconciler too: it never runs."""
    root, ledger = crash_in_body(tmp_path, "jsonl", effect=True)
    seen: list[tuple[str, bool]] = []

    async def deny(execution: ToolExecution, next_: Any) -> PreToolDecision:
        seen.append((execution.call_id, execution.reconciling))
        return Deny("transfers are disabled")

    async with open_host(rows("jsonl", root, [{"text": "ok"}])) as host:
        host.ctx.tools.register(make_transfer(str(ledger)).definition)
        host.ctx.on(TOOLS_PRE_EXECUTE, deny)
        agent = await host.ctx.agent.resume(SESSION)
        (verdict,) = agent.reconciled
        await agent.aclose()
    assert seen == [("pay-1", True)]
    assert (verdict.verdict, verdict.detail) == ("unknown", "transfers are disabled")
    closer = next(e for e in agent.session.events if e.type == "tool/result")
    assert event_to_builtins(closer)["data"]["error"]["code"] == TOOL_OUTCOME_UNKNOWN


async def test_a_tool_without_a_reconciler_is_left_alone(tmp_path: Path) -> None:
    root, ledger = crash_in_body(tmp_path, "jsonl", effect=True)
    async with open_host(rows("jsonl", root, [{"text": "ok"}])) as host:
        definition = make_transfer(str(ledger)).definition
        host.ctx.tools.register(dataclasses.replace(definition, reconcile=None))
        agent = await host.ctx.agent.resume(SESSION)
        await agent.aclose()
    assert agent.reconciled == ()
    assert not any(e.type == RECONCILED_EVENT for e in agent.session.events)


@pytest.mark.parametrize(("answer", "verdict"), [("allowed-once", "done"), ("rejected", "unknown")])
async def test_the_reconciler_asks_the_approval_the_tool_asks(
    tmp_path: Path, answer: str, verdict: str
) -> None:
    """A tool whose calls need approval has its reconciler asked about too: through the same
    approval service, for the same call; a refusal leaves the call unknown, and the audit pair
    leaves nothing pending."""
    root, ledger = crash_in_body(tmp_path, "jsonl", effect=True)
    asked: list[tuple[str | None, str]] = []

    async def answerer(request: Any, next_: Any) -> str:
        asked.append((request.call_id, request.tool_name))
        return answer

    extra = [
        Row(name="user-approval"),
        Row(name="tool-rules", config={"rules": [{"tool": "transfer", "decision": "ask"}]}),
    ]
    async with open_host([*rows("jsonl", root, [{"text": "ok"}]), *extra]) as host:
        host.ctx.tools.register(make_transfer(str(ledger)).definition)
        host.ctx.on("approval/request", answerer)
        agent = await host.ctx.agent.resume(SESSION)
        (found,) = agent.reconciled
        raw = list(agent.session.events)
        await agent.aclose()
    events = plain(raw)
    assert asked == [("pay-1", "transfer")]
    assert found.verdict == verdict
    results = [e for e in events if e["type"] == "tool/result"]
    assert len(results) == 1
    if verdict == "unknown":
        assert found.detail == 'the user rejected tool "transfer"'
        # a refused reconciler says nothing about the body, which may have run: still unknown
        assert results[0]["data"]["error"]["code"] == TOOL_OUTCOME_UNKNOWN
    decided = [e for e in events if e["type"] == "approval/decided"]
    assert [e["data"]["outcome"] for e in decided] == [answer]
    assert pending_approvals(raw, SESSION) == []
    # the pair is inside the interrupted turn, before its closers, and gates no body
    asks = [e for e in events if e["type"] == "approval/asked"]
    assert len(asks) == 1 and "stage" not in asks[0]["data"]
    end = next(e["seq"] for e in events if e["type"] == "turn/end")
    assert asks[0]["seq"] < decided[0]["seq"] < end

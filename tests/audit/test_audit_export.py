"""Attested exports end to end: a real deferred-approval session, exported and verified offline.

The session is made by real ``dsh`` processes (scripted model, a ``tool-rules`` row asking for
``bash``, ``dsh run --approval defer`` exits 4, ``dsh approvals decide`` allows it from another
process and the call runs). ``dsh sessions export --attest`` signs it with a key made 0600 under
the user's config dir; ``dsh audit verify`` then checks it in an empty directory with no store
and no composition. Each tampering is done to the exported file, and each is named with its
record index and seq: a flipped byte, a dropped event, a reordered approval, a result without a
call, a changed signature. The semantic ones are also re-chained and re-signed with another key
(what a forger holding a key of their own would do), where only the log's promises catch them.
"""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from approval.deferred_env import CALL, DSH, Env, make_env
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from dsh_host._session.audit import attest, public_key_text, verify_export
from dsh_host._session.effects import effects_after

# slow: several real dsh processes
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One real session (deferred approval decided allow, the call ran), exported once."""
    tmp = tmp_path_factory.mktemp("audit")
    env = make_env(tmp, "default.yml", {"XDG_CONFIG_HOME": str(tmp / "config")})
    _, summary = env.run_deferred()
    session_id = summary["sessionId"]
    decide = env.dsh(
        "approvals", "decide", session_id, CALL, "allow", "--model", f"scripted:{env.second}"
    )
    assert decide.returncode == 0, decide.stdout + decide.stderr
    assert env.ledger_lines() == [CALL]
    out = tmp / "export.jsonl"
    proc = env.dsh("sessions", "export", session_id, "--attest", "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    yield {"env": env, "session": session_id, "file": out, "stderr": proc.stderr}


def verify_cli(tmp: Path, data: bytes, *extra: str) -> subprocess.CompletedProcess[str]:
    """``dsh audit verify`` in a fresh directory with no store, no config and an empty HOME."""
    fresh = tmp / "elsewhere"
    fresh.mkdir(exist_ok=True)
    path = fresh / "export.jsonl"
    path.write_bytes(data)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DSH_", "XDG_"))}
    env["HOME"] = str(fresh)
    return subprocess.run(
        [*DSH, "audit", "verify", str(path), *extra],
        cwd=fresh,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def records(data: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in data.splitlines()]


def events_of(data: bytes) -> list[dict[str, Any]]:
    return [r["event"] for r in records(data) if r["record"] == "event"]


def header_of(data: bytes) -> dict[str, Any]:
    header: dict[str, Any] = records(data)[0]["header"]
    return header


def index_of(data: bytes, kind: str, nth: int = 0) -> int:
    return [
        i
        for i, r in enumerate(records(data))
        if r["record"] == "event" and r["event"]["type"] == kind
    ][nth]


def kinds(report: Any) -> list[tuple[int, int | None, str]]:
    return [(p.index, p.seq, p.kind) for p in report.problems]


def test_the_key_is_made_0600_and_the_export_verifies_without_a_store(
    exported: dict[str, Any], tmp_path: Path
) -> None:
    env: Env = exported["env"]
    key = env.tmp / "config" / "dsh" / "audit-ed25519.pem"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert stat.S_IMODE(key.parent.stat().st_mode) == 0o700
    data = exported["file"].read_bytes()
    kinds_logged = [e["type"] for e in events_of(data)]
    assert kinds_logged.count("tool/call") == 2  # before the ask, and again when it ran
    assert "approval/asked" in kinds_logged and "approval/decided" in kinds_logged
    public = exported["stderr"].rsplit(" ", 1)[-1].strip()
    proc = verify_cli(tmp_path, data, "--public-key", public)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "valid:" in proc.stdout and "signed by the trusted key" in proc.stdout
    # Exporting again gives the same bytes (canonical form, deterministic signature).
    again = env.dsh("sessions", "export", exported["session"], "--attest")
    assert again.returncode == 0 and again.stdout.encode() == data


def test_a_flipped_byte_is_named(exported: dict[str, Any], tmp_path: Path) -> None:
    data = exported["file"].read_bytes()
    at = index_of(data, "approval/asked")
    lines = data.split(b"\n")
    lines[at] = lines[at].replace(b"side effects need a human", b"side effects need a humaN")
    proc = verify_cli(tmp_path, b"\n".join(lines))
    assert proc.returncode == 1
    seq = records(data)[at]["event"]["seq"]
    assert (
        f"record {at} (seq {seq}): chain: the record's content does not match its hash"
        in proc.stderr
    )
    assert "Traceback" not in proc.stderr
    as_json = verify_cli(tmp_path, b"\n".join(lines), "--json")
    assert as_json.returncode == 1
    report = json.loads(as_json.stdout)
    assert report["ok"] is False and report["sessionId"] == exported["session"]
    assert [(p["index"], p["seq"], p["kind"]) for p in report["problems"]] == [(at, seq, "chain")]


def test_a_dropped_event_is_named(exported: dict[str, Any], tmp_path: Path) -> None:
    data = exported["file"].read_bytes()
    at = index_of(data, "approval/decided")
    lines = data.split(b"\n")
    del lines[at]
    proc = verify_cli(tmp_path, b"\n".join(lines))
    assert proc.returncode == 1
    assert f"record {at} (seq {at}): chain: prev is not the hash" in proc.stderr
    # Re-chained and re-signed by a forger: the gap in seqs and the undecided approval remain.
    events = events_of(data)
    del events[at - 1]
    forged = attest(exported["session"], header_of(data), events, Ed25519PrivateKey.generate())
    report = verify_export(forged)
    found = kinds(report)
    assert (at, at, "seq") in found
    result_at = index_of(forged, "tool/result")
    assert (result_at, result_at, "undecided-approval") in found


def test_a_reordered_approval_is_named(exported: dict[str, Any], tmp_path: Path) -> None:
    data = exported["file"].read_bytes()
    decided, result = index_of(data, "approval/decided"), index_of(data, "tool/result")
    lines = data.split(b"\n")
    lines.insert(result, lines.pop(decided))  # the decision now comes after the call ran
    proc = verify_cli(tmp_path, b"\n".join(lines))
    assert proc.returncode == 1 and "chain: prev is not the hash" in proc.stderr
    # Re-chained and re-signed: the order of events itself is the broken promise.
    events = events_of(data)
    events.insert(result - 1, events.pop(decided - 1))
    forged = attest(exported["session"], header_of(data), events, Ed25519PrivateKey.generate())
    found = kinds(verify_export(forged))
    moved_result = result - 1  # one line up: the decision left from before it
    assert (moved_result, result - 1, "undecided-approval") in [
        (i, s, k) for i, s, k in found if k == "undecided-approval"
    ]
    # And a decision moved before its ask is named too.
    events = events_of(data)
    asked = index_of(data, "approval/asked")
    events.insert(asked - 1, events.pop(decided - 1))
    forged = attest(exported["session"], header_of(data), events, Ed25519PrivateKey.generate())
    assert any(
        k == "decision-without-ask" and i == asked for i, _, k in kinds(verify_export(forged))
    )


def test_a_result_without_a_call_is_named(exported: dict[str, Any], tmp_path: Path) -> None:
    data = exported["file"].read_bytes()
    events = events_of(data)
    # Drop every tool/call (keeping seqs contiguous): the result now answers nothing recorded.
    kept = [e for e in events if e["type"] != "tool/call"]
    for seq, event in enumerate(kept):
        event["seq"] = seq
    key = Ed25519PrivateKey.generate()
    forged = attest(exported["session"], header_of(data), kept, key)
    proc = verify_cli(tmp_path, forged, "--public-key", public_key_text(key))
    assert proc.returncode == 1
    at = index_of(forged, "tool/result")
    assert (
        f"record {at} (seq {at - 1}): result-without-call: tool/result for call {CALL}"
        in proc.stderr
    )
    # The chain and the signature hold (the forger signed it): only the promise caught it.
    assert "chain:" not in proc.stderr and "signature:" not in proc.stderr


def test_a_changed_signature_is_named(exported: dict[str, Any], tmp_path: Path) -> None:
    data = exported["file"].read_bytes()
    lines = data.rstrip(b"\n").split(b"\n")
    last = json.loads(lines[-1])
    raw = bytearray(base64.b64decode(last["signature"]))
    raw[0] ^= 1
    last["signature"] = base64.b64encode(bytes(raw)).decode()
    lines[-1] = json.dumps(last, sort_keys=True, separators=(",", ":")).encode()
    proc = verify_cli(tmp_path, b"\n".join(lines) + b"\n")
    assert proc.returncode == 1
    assert (
        f"record {len(lines) - 1}: signature: the Ed25519 signature does not verify" in proc.stderr
    )
    # A whole file re-signed by another key verifies on its own, but not against the trusted key.
    public = exported["stderr"].rsplit(" ", 1)[-1].strip()
    other = attest(
        exported["session"], header_of(data), events_of(data), Ed25519PrivateKey.generate()
    )
    assert verify_export(other).ok
    proc = verify_cli(tmp_path, other, "--public-key", public)
    assert proc.returncode == 1 and "not with the trusted --public-key" in proc.stderr


def test_a_call_run_after_a_denial_is_named(exported: dict[str, Any]) -> None:
    data = exported["file"].read_bytes()
    events = events_of(data)
    for event in events:
        if event["type"] == "approval/decided":
            event["data"]["outcome"] = "rejected"
    forged = attest(exported["session"], header_of(data), events, Ed25519PrivateKey.generate())
    result = index_of(forged, "tool/result")
    assert kinds(verify_export(forged)) == [(result, result - 1, "ran-after-denial")]


def test_changed_arguments_after_the_decision_are_named(exported: dict[str, Any]) -> None:
    data = exported["file"].read_bytes()
    events = events_of(data)
    calls = [e for e in events if e["type"] == "tool/call"]
    calls[1]["data"]["arguments"] = calls[1]["data"]["arguments"].replace("ledger", "elsewhere")
    forged = attest(exported["session"], header_of(data), events, Ed25519PrivateKey.generate())
    second_call = index_of(forged, "tool/call", 1)
    assert (second_call, second_call - 1, "arguments-changed") in kinds(verify_export(forged))


def test_a_digest_or_context_that_changed_between_ask_and_decision_is_named(
    exported: dict[str, Any],
) -> None:
    data = exported["file"].read_bytes()
    events = events_of(data)
    (asked,) = [e for e in events if e["type"] == "approval/asked"]
    asked["data"]["argsDigest"] = "0" * 64  # not the digest of the call's logged arguments
    forged = attest(exported["session"], header_of(data), events, Ed25519PrivateKey.generate())
    found = kinds(verify_export(forged))
    at, decided = index_of(forged, "approval/asked"), index_of(forged, "approval/decided")
    assert (at, at - 1, "digest-mismatch") in found
    assert (decided, decided - 1, "decision-mismatch") in found
    events = events_of(data)
    (decision,) = [e for e in events if e["type"] == "approval/decided"]
    decision["data"]["sandboxMode"] = "danger-full-access"
    forged = attest(exported["session"], header_of(data), events, Ed25519PrivateKey.generate())
    report = verify_export(forged)
    assert kinds(report) == [(decided, decided - 1, "decision-mismatch")]
    assert "decided under sandboxMode 'danger-full-access'" in report.problems[0].message


def test_a_denied_session_verifies_and_a_forged_success_after_it_is_named(
    tmp_path: Path,
) -> None:
    env = make_env(tmp_path, "default.yml", {"XDG_CONFIG_HOME": str(tmp_path / "config")})
    _, summary = env.run_deferred()
    session_id = summary["sessionId"]
    deny = env.dsh(
        "approvals", "decide", session_id, CALL, "deny", "--model", f"scripted:{env.second}"
    )
    assert deny.returncode == 0, deny.stdout + deny.stderr
    assert env.ledger_lines() == []
    proc = env.dsh("sessions", "export", session_id, "--attest")
    assert proc.returncode == 0, proc.stderr
    data = proc.stdout.encode()
    report = verify_export(data)
    assert report.ok, [str(p) for p in report.problems]
    # The rejection result turned into a success: the call "ran" after a denial.
    events = events_of(data)
    (result,) = [e for e in events if e["type"] == "tool/result"]
    result["data"]["message"]["content"][0]["isError"] = False
    forged = attest(session_id, header_of(data), events, Ed25519PrivateKey.generate())
    at = index_of(forged, "tool/result")
    assert kinds(verify_export(forged)) == [(at, at - 1, "ran-after-denial")]


def test_bad_input_gets_a_clear_error(exported: dict[str, Any], tmp_path: Path) -> None:
    env: Env = exported["env"]
    missing = verify_cli(tmp_path, b"", "--public-key", "not-base64!")
    assert missing.returncode == 2 and "--public-key: not an Ed25519 public key" in missing.stderr
    nothing = verify_cli(tmp_path, b"")
    assert nothing.returncode == 1 and "the file holds no record" in nothing.stderr
    junk = verify_cli(tmp_path, b"hello\n")
    assert junk.returncode == 1 and "record 0: unreadable: not JSON" in junk.stderr
    no_file = subprocess.run(
        [*DSH, "audit", "verify", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert no_file.returncode == 2 and "cannot read it" in no_file.stderr
    key = env.tmp / "config" / "dsh" / "audit-ed25519.pem"
    loose = env.tmp / "loose.pem"
    loose.write_bytes(key.read_bytes())
    loose.chmod(0o644)
    refused = env.dsh("sessions", "export", exported["session"], "--attest", "--key", str(loose))
    assert refused.returncode == 2 and "chmod 600" in refused.stderr
    for proc in (missing, nothing, junk, no_file, refused):
        assert "Traceback" not in proc.stderr


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-n", "0"]))


def test_the_effects_ledger_lists_the_call_that_ran(exported: dict[str, Any]) -> None:
    """A fork at the first turn's start abandons the approved call, which ran: ``done``."""
    events = events_of(exported["file"].read_bytes())
    start = next(e["seq"] for e in events if e["type"] == "turn/start")
    (effect,) = effects_after(exported["session"], events, start)
    assert (effect.call_id, effect.tool, effect.status, effect.is_error) == (
        CALL, "bash", "done", False,
    )  # fmt: skip
    assert effect.call_seq is not None and effect.result_seq is not None
    assert effect.idempotency_key.startswith("dsh-") and len(effect.idempotency_key) == 36

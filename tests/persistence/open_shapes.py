"""The sessions behind ``tests/fixtures/dsh-open-shapes`` (issue 16): one session per shape.

Each accepted shape is a balanced turn whose ``user/message`` (or usage, or extra
event) is the shape DSH writes; :func:`write_fixtures` stores them with dsh's own
writer (``JsonlSessionPersistence``, raw and zstd roots). Each refused shape is a
row DSH refuses whole; those files are written byte by byte (dsh's writer refuses
them too). ``expected.json`` says what a reader must recover:

* ``events``: the records exactly as stored (every view shows them, unknown keys included);
* ``model``: the chat-completions messages the openai-compatible adapter sends
  (opaque blocks skipped, as DSH's adapters skip them);
* or ``refuse``: the error type and a substring of its message.

Regenerate with ``python -m tests.persistence.open_shapes`` from the repository root
(the test ``test_open_shape_fixtures_are_what_dshs_writer_writes`` checks they are current).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

from .helpers import T0, ev, header

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "dsh-open-shapes"
CWD = "/home/dev/project"
PROJECT = "--home-dev-project--"


def _user(seq: int, content: list[Any], source: dict[str, Any]) -> dict[str, Any]:
    message = {"id": f"user-{seq}", "role": "user", "content": content, "source": source}
    return ev("user/message", seq, message, surfaceOp="append")


def _assistant(seq: int, text: str, usage: dict[str, Any] | None = None) -> dict[str, Any]:
    data: dict[str, Any] = {
        "turn": 1,
        "step": 1,
        "message": {
            "id": f"assistant-{seq}",
            "role": "assistant",
            "content": [{"type": "text", "text": text}],
            "source": {"kind": "model", "provider": "deepseek", "model": "deepseek-chat"},
        },
        "stream": [],
    }
    if usage is not None:
        data["usage"] = usage
    return ev("assistant/message", seq, data, surfaceOp="append")


def _turn(first: dict[str, Any], *, usage: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """turn/start, the shaped user message (seq 1), step, an answer, step/end, turn/end."""
    return [
        ev("turn/start", 0, {"turn": 1}),
        first,
        ev("step/start", 2, {"turn": 1, "step": 1}),
        _assistant(3, "done", usage),
        ev("step/end", 4, {"turn": 1, "step": 1}),
        ev("turn/end", 5, {"turn": 1, "reason": {"kind": "completed"}}),
    ]


_TEXT = [{"type": "text", "text": "context"}]
_MODEL_AFTER = [{"role": "assistant", "content": "done"}]

#: Accepted shapes: id -> (rows, model messages the adapter sends).
ACCEPTED: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {
    "source-skill-catalog": (
        _turn(
            _user(
                1,
                _TEXT,
                {
                    "kind": "skill-catalog",
                    "form": "catalog",
                    "entries": [{"name": "pdf", "description": "Read PDF files"}],
                },
            )
        ),
        [{"role": "user", "content": "context"}, *_MODEL_AFTER],
    ),
    "source-agent-instructions": (
        _turn(
            _user(
                1,
                _TEXT,
                {
                    "kind": "agent-instructions",
                    "form": "instructions",
                    "changes": [
                        {"action": "set", "scope": "project", "path": "AGENTS.md", "digest": "ab"}
                    ],
                    "baseline": True,
                },
            )
        ),
        [{"role": "user", "content": "context"}, *_MODEL_AFTER],
    ),
    "source-cron": (
        _turn(_user(1, _TEXT, {"kind": "cron", "jobId": "nightly", "firedAt": T0})),
        [{"role": "user", "content": "context"}, *_MODEL_AFTER],
    ),
    "content-file-block": (
        _turn(
            _user(
                1,
                [
                    {"type": "text", "text": "see the attachment"},
                    {
                        "type": "file",
                        "attachment": {"attachmentId": "att-1", "name": "notes.txt", "bytes": 42},
                    },
                ],
                {"kind": "user"},
            )
        ),
        [{"role": "user", "content": "see the attachment"}, *_MODEL_AFTER],
    ),
    "usage-total-tokens": (
        _turn(
            _user(1, [{"type": "text", "text": "hi"}], {"kind": "user"}),
            usage={"inputTokens": 10, "outputTokens": 5, "totalTokens": 15},
        ),
        [{"role": "user", "content": "hi"}, *_MODEL_AFTER],
    ),
    "ignorable-code-dispatch": (
        [
            *_turn(_user(1, [{"type": "text", "text": "hi"}], {"kind": "user"}))[:5],
            ev(
                "tool/code-dispatch",
                5,
                {"rootCallId": "a", "parentCallId": "a", "subCallId": "b", "name": "n"},
                ignorable=True,
            ),
            ev("turn/end", 6, {"turn": 1, "reason": {"kind": "completed"}}),
        ],
        [{"role": "user", "content": "hi"}, *_MODEL_AFTER],
    ),
}


def _system_row(seq: int, source: dict[str, Any], **extra: Any) -> dict[str, Any]:
    message = {
        "id": f"sys-{seq}",
        "role": "system",
        "source": source,
        "content": [{"type": "text", "text": "You are helpful."}],
    }
    return ev(
        "system/message",
        seq,
        {"turn": 1, "step": 1, "message": message, **extra},
        surfaceOp="append",
    )


def _refused_turn(bad: dict[str, Any]) -> list[dict[str, Any]]:
    rows = _turn(_user(1, [{"type": "text", "text": "hi"}], {"kind": "user"}))
    return [*rows[:3], bad]  # the bad row is the last one: the case a tail rule would drop


_PLUGIN = {"kind": "plugin", "plugin": "@deepseek-ai/dsh-system-prompt"}

#: Refused shapes: id -> (rows, error type, message substring). Written byte by byte.
REFUSED: dict[str, tuple[list[dict[str, Any]], str, str]] = {
    "refused-system-user-source": (
        _refused_turn(_system_row(3, {"kind": "user"})),
        "SessionPersistenceCorruptionError",
        "system message requires plugin source",
    ),
    "refused-system-extra-data-key": (
        _refused_turn(_system_row(3, _PLUGIN, note="x")),
        "SessionPersistenceCorruptionError",
        "has unexpected field note",
    ),
    "refused-system-without-data": (
        _refused_turn({"type": "system/message", "seq": 3, "time": T0 + 4, "surfaceOp": "append"}),
        "SessionPersistenceCorruptionError",
        "system/message data must be an object",
    ),
    "refused-request-header-without-data": (
        _refused_turn({"type": "request/header", "seq": 3, "time": T0 + 4}),
        "SessionPersistenceCorruptionError",
        "request/header data must be an object",
    ),
    "refused-required-code-dispatch": (
        _refused_turn(
            ev(
                "tool/code-dispatch",
                3,
                {"rootCallId": "a", "parentCallId": "a", "subCallId": "b", "name": "n"},
            )
        ),
        "SessionFormatUnsupportedError",
        'unknown event type "tool/code-dispatch"',
    ),
}


def _line(row: Any) -> bytes:
    return json.dumps(row, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


def header_line(session_id: str) -> bytes:
    return _line(
        {
            "type": "session",
            "version": 3,
            "id": session_id,
            "createdAt": T0,
            "cwd": CWD,
            "isSeeded": False,
            "delegationDepth": 0,
        }
    )


async def write_fixtures(target: Path) -> None:
    """Write both roots and expected.json under ``target`` (dsh's writer for accepted shapes)."""
    from dsh_session_persistence_jsonl import JsonlSessionPersistence
    from dsh_session_persistence_jsonl._frames import compress_frame

    expected: dict[str, Any] = {}
    for root, compression in (("root-none", "none"), ("root-zstd", "zstd")):
        backend = JsonlSessionPersistence(str(target / root), compression)  # type: ignore[arg-type]
        for sid, (rows, model) in ACCEPTED.items():
            handle = await backend.create(header(sid))
            handle.append(rows)
            await handle.flush()
            await handle.close()
            expected[sid] = {"events": rows, "model": model}
        for sid, (rows, error, message) in REFUSED.items():
            directory = target / root / PROJECT / sid
            directory.mkdir(parents=True, exist_ok=True)
            body = b"".join(_line(r) for r in rows)
            if compression == "zstd":
                data = compress_frame(header_line(sid)) + compress_frame(body)
                name = "session.v3.jsonl.zstd"
            else:
                data = header_line(sid) + body
                name = "session.v3.jsonl"
            _put(directory / name, data)
            expected[sid] = {"refuse": {"error": error, "message": message}}
    _finish(target, expected)


def _put(path: Path, data: bytes) -> None:
    path.write_bytes(data)


def _finish(target: Path, expected: dict[str, Any]) -> None:
    for lock in target.rglob("session.lock"):
        lock.unlink()
    (target / "expected.json").write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")


def main() -> None:  # pragma: no cover - regeneration by hand
    import anyio

    shutil.rmtree(FIXTURES, ignore_errors=True)
    anyio.run(write_fixtures, FIXTURES)
    readme = FIXTURES / "README.md"
    readme.write_text(_README)
    print(f"wrote {FIXTURES}", file=sys.stderr)


_README = """# Open shapes and refused rows (issue 16)

One session per shape, in a raw root (`root-none`, readable with any line tool) and a zstd root
(`root-zstd`). Accepted shapes were written by dsh's own writer (`JsonlSessionPersistence`); the
refused ones are rows DSH v3 refuses whole, written byte by byte because dsh's writer refuses
them too. `expected.json` says, per session id, what a reader must recover: the stored records
exactly (`events`, unknown keys such as `TokenUsage.totalTokens` included) and the messages the
openai-compatible adapter sends (`model`: opaque blocks such as `file` are skipped, as DSH's
adapters skip them), or the refusal (`refuse`: error type and a message substring).

Source of the shapes: DSH 0.1.5-rc.2 / 0.1.6-alpha.2 (`session-format-v2-to-v3` payload
admission, `session-format-v0-to-v1` released payload rules). Generated by
`tests/persistence/open_shapes.py` (`python -m tests.persistence.open_shapes`).
"""


if __name__ == "__main__":  # pragma: no cover
    main()

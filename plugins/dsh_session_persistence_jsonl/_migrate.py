"""Older generations: upgrade in memory, and publish a verified v3 sibling.

Reading never writes: ``open(id, "read")`` on a v0 / v1 / v2 log decodes it,
walks the adjacent upgrades (v0→v1→v2→v3) over JSON values, and returns v3
events. Writing needs a current-format file, so ``open(id, "write")`` publishes
one *next to* the source (D1; docs/format.md §4.5):

1. encode the migrated log into a same-directory temp file, fsync it;
2. verify it by reading it back strictly (no torn tail) and comparing the
   header and every event with the migration result;
3. re-check the source's revision — if it changed while we worked, refuse
   (never overwrite newer history with a stale preparation);
4. ``link`` the temp to ``session.v3.jsonl[.zstd]`` (never overwriting), fsync
   the directory, remove the temp.

The source stays byte-identical and is never deleted; compression is kept.
The same publication makes a v3 log's DSH format v4 successor, on request only
(:func:`publish_v4`, docs/format.md §10.3).

What the upgrades do, in brief (docs/format.md has the list):

* v0→v1: legacy renames and shapes (``compact/*`` → ``compaction/*``,
  ``steering/message`` → ``user/message``, pre-identity messages get
  ``legacy-message:<id>:<seq>`` ids, old turn-end reasons); retired
  ``request/header-delta`` / ``mode/set`` / ``fallback`` headers are refused;
* v1→v2: ``assistant/chunk`` events are folded into the ``stream`` of the
  ``assistant/message`` that cites them (or into a generated
  ``assistant/attempt``); seqs are renumbered and every seq reference remapped;
  ``seedLength`` becomes ``isSeeded`` plus a ``session/end-seed {inherited}``;
* v2→v3: the system prompt leaves ``request/header`` and becomes
  ``system/message`` surface events; code-mode names become ``ptc``.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

from dsh_host.sdk import (
    SessionFormatUnsupportedError,
    SessionGenerationConflictError,
    SessionGenerationSourceChangedError,
    SessionPersistenceCorruptionError,
)

from . import _json
from ._codec import (
    HEADER_KEYS_V3,
    encode_event_row,
    encode_header_record,
    header_json_bytes,
    pack_stream,
)
from ._frames import compress_frame
from ._paths import CURRENT_VERSION, generation_filename
from ._reader import ArtifactRead, plain_rows, read_artifact, revision_of
from ._storage import fsync_dir
from ._v4 import V4_VERSION, lift_row

if TYPE_CHECKING:
    from ._backend import JsonlStorage

__all__ = ["migrate_to_current", "publish_generation"]

Event = dict[str, Any]

_RENAMES_V0: Final = {
    "compact/start": "compaction/start",
    "compact/end": "compaction/end",
    "compact/summary": "compaction/summary",
    "compact/prune": "compaction/prune",
    "steering/message": "user/message",
}
_CLOSES_ATTEMPT: Final = frozenset({"turn/end", "step/end", "llm/retry", "llm/retry-started"})
_SURFACE_V3: Final = frozenset(
    {"system/message", "user/message", "assistant/message", "tool/result"}
)
_SYSTEM_PLUGIN: Final = "@deepseek-ai/dsh-system-prompt"


class _Refuse(Exception):
    """A source this build cannot upgrade faithfully."""


def migrate_to_current(artifact: ArtifactRead) -> tuple[dict[str, Any], list[Event]]:
    """The artifact's header record and events in format v3 (in memory; nothing written)."""
    header = dict(artifact.header)
    rows = plain_rows(artifact.events)
    events = [dict(e) for e in rows] if artifact.version != CURRENT_VERSION else rows
    version = artifact.version
    if version == CURRENT_VERSION:
        return header, events
    sid = str(header.get("id"))
    try:
        if version == 0:
            header, events = _v0_to_v1(header, events)
            version = 1
        if version == 1:
            header, events = _v1_to_v2(header, events)
            version = 2
        if version == 2:
            header, events = _v2_to_v3(header, events)
    except _Refuse as refusal:
        raise SessionFormatUnsupportedError(
            f'session "{sid}" uses log format v{artifact.version} and cannot be upgraded to '
            f"v{CURRENT_VERSION}: {refusal} (raw log: {artifact.path})",
            location=artifact.path,
        ) from None
    except (KeyError, TypeError, AttributeError, IndexError) as error:
        raise SessionPersistenceCorruptionError(
            f'session "{sid}" (format v{artifact.version}) has a malformed record the upgrade '
            f"cannot read: {error!r} (raw log: {artifact.path})",
            path=artifact.path,
        ) from None
    return header, events


# --------------------------------------------------------------------------- v0 → v1


def _v0_to_v1(header: dict[str, Any], events: list[Event]) -> tuple[dict[str, Any], list[Event]]:
    sid = str(header["id"])
    out: list[Event] = []
    ids_by_seq: dict[int, str] = {}
    for event in events:
        kind = _RENAMES_V0.get(event["type"], event["type"])
        seq = event["seq"]
        if kind in ("request/header-delta", "mode/set"):
            raise _Refuse(f"unsupported legacy {kind} event at seq {seq}")
        data = event.get("data")
        if kind == "request/header" and isinstance(data, dict) and data.get("reason") == "fallback":
            raise _Refuse(f'unsupported legacy request/header reason "fallback" at seq {seq}')
        upgraded = dict(event, type=kind)
        legacy_id = f"legacy-message:{sid}:{seq}"
        if kind == "user/message" and isinstance(data, dict) and "id" not in data:
            target = _replace_target(event)
            upgraded["data"] = {**data, "role": "user", "id": ids_by_seq.get(target, legacy_id)}
        elif kind == "assistant/message" and isinstance(data, dict) and "message" not in data:
            message = {
                "id": legacy_id,
                "role": "assistant",
                "content": data.get("content", []),
                "source": {**(data.get("provenance") or {}), "kind": "model"},
            }
            rest = {k: v for k, v in data.items() if k not in ("content", "provenance")}
            upgraded["data"] = {
                "turn": rest.pop("turn"),
                "step": rest.pop("step"),
                "message": message,
                **rest,
            }
        elif kind == "tool/result" and isinstance(data, dict) and "message" not in data:
            call_id = data["callId"]
            target = _replace_target(event)
            block: dict[str, Any] = {
                "type": "tool-result",
                "toolCallId": call_id,
                "content": data.get("content", []),
            }
            if "isError" in data:
                block["isError"] = data["isError"]
            message = {
                "id": ids_by_seq.get(target, legacy_id),
                "role": "user",
                "source": {"kind": "tool", "callId": call_id},
                "content": [block],
            }
            rest = {k: v for k, v in data.items() if k not in ("callId", "content", "isError")}
            upgraded["data"] = {
                "turn": rest.pop("turn"),
                "step": rest.pop("step"),
                "message": message,
                **rest,
            }
        elif kind == "turn/start" and isinstance(data, dict) and "trigger" in data:
            upgraded["data"] = {k: v for k, v in data.items() if k != "trigger"}
        elif kind == "turn/end" and isinstance(data, dict):
            upgraded["data"] = {**data, "reason": _legacy_reason(data.get("reason"))}
        message_id = _message_id(upgraded)
        if message_id is not None:
            ids_by_seq[seq] = message_id
        out.append(upgraded)
    return {**header, "version": 1}, out


def _replace_target(event: Event) -> int:
    """The seq a replacing event shadows first (-1 when it appends)."""
    op = event.get("surfaceOp")
    if isinstance(op, dict):
        start = op.get("start", op.get("startSeq"))
        return start if isinstance(start, int) else -1
    return -1


def _message_id(event: Event) -> str | None:
    data = event.get("data")
    if not isinstance(data, dict):
        return None
    if event["type"] == "user/message":
        return data.get("id") if isinstance(data.get("id"), str) else None
    message = data.get("message")
    if isinstance(message, dict) and isinstance(message.get("id"), str):
        return str(message["id"])
    return None


def _legacy_reason(reason: Any) -> Any:
    if not isinstance(reason, dict):
        return reason
    kind = reason.get("kind")
    if kind == "aborted" and "reason" not in reason:
        return {"kind": "aborted", "reason": {"kind": "legacy"}}
    if kind == "disposed":
        return {"kind": "aborted", "reason": {"kind": "disposed"}}
    if kind == "error" and "error" not in reason:
        if "failure" in reason:
            return {"kind": "error", "error": reason["failure"]}
        failure = {"message": reason.get("message", ""), "code": reason.get("code", "UNKNOWN")}
        return {"kind": "error", "error": failure}
    return reason


# --------------------------------------------------------------------------- v1 → v2


class _Attempt:
    __slots__ = ("after", "chunks", "last_seq", "last_time", "seqs", "step", "terminal", "turn")

    def __init__(self, turn: Any, step: Any) -> None:
        self.turn = turn
        self.step = step
        self.chunks: list[tuple[int, dict[str, Any]]] = []
        self.seqs: list[int] = []
        self.terminal = False
        self.after: list[Event] = []
        self.last_seq = -1
        self.last_time = 0


class _Renumber:
    """Emits events with fresh contiguous seqs and remaps every seq reference."""

    def __init__(self, header: dict[str, Any], cut: int | None) -> None:
        self.out: list[Event] = []
        self.mapping: dict[int, int] = {}
        self.cut = cut  # source seq where the inherited prefix ends (seeded logs)
        self.target_cut: int | None = None if cut is not None else 0
        self.header = header

    def _ensure_cut(self, origin: int, time: int, kind: str) -> None:
        if self.cut is None or self.target_cut is not None or origin < self.cut:
            return
        self.target_cut = len(self.out)
        if origin == self.cut and kind == "session/end-seed":
            return
        self.out.append(
            {
                "type": "session/end-seed",
                "seq": len(self.out),
                "time": time,
                "data": {"inherited": True},
            }
        )

    def source(self, event: Event) -> None:
        if (
            self.cut is not None
            and event["seq"] == self.cut
            and event["type"] == "session/end-seed"
        ):
            event = {**event, "data": {"inherited": True}}
        self._ensure_cut(event["seq"], event["time"], event["type"])
        self.mapping[event["seq"]] = len(self.out)
        self.out.append(remap(event, len(self.out), self.mapping.get))

    def generated(self, origin: int, event: Event) -> None:
        self._ensure_cut(origin, event["time"], event["type"])
        self.out.append(remap(event, len(self.out), self.mapping.get))

    def finish(self, last_time: int) -> None:
        if self.cut is not None and self.target_cut is None:
            self.target_cut = len(self.out)
            self.out.append(
                {
                    "type": "session/end-seed",
                    "seq": len(self.out),
                    "time": last_time,
                    "data": {"inherited": True},
                }
            )


def remap(event: Event, seq: int, lookup: Callable[[int], int | None]) -> Event:
    """``event`` at ``seq`` with every seq it references translated through ``lookup``."""

    def one(value: int, label: str) -> int:
        mapped = lookup(value)
        if mapped is None:
            raise _Refuse(
                f"{event['type']} at seq {event['seq']}: {label} targets {value}, "
                "which the upgrade consumed or never saw"
            )
        return mapped

    out = dict(event, seq=seq)
    if "sourceEventSeqs" in event:
        out["sourceEventSeqs"] = [one(s, "sourceEventSeqs") for s in event["sourceEventSeqs"]]
    op = event.get("surfaceOp")
    if isinstance(op, dict):
        keys = ("start", "end") if "start" in op else ("startSeq", "endSeq")
        out["surfaceOp"] = {
            **op,
            keys[0]: one(op[keys[0]], "surface start"),
            keys[1]: one(op[keys[1]], "surface end"),
        }
    data = event.get("data")
    if isinstance(data, dict):
        kind = event["type"]
        if kind == "command/done" and "sourceEventSeq" in data:
            out["data"] = {**data, "sourceEventSeq": one(data["sourceEventSeq"], "sourceEventSeq")}
        elif kind in ("compaction/prune", "compaction/summary") and "shadowedRange" in data:
            rng = data["shadowedRange"]
            out["data"] = {
                **data,
                "shadowedRange": {
                    **rng,
                    "start": one(rng["start"], "shadowedRange"),
                    "end": one(rng["end"], "shadowedRange"),
                },
                "shadowedSeqs": [one(s, "shadowedSeqs") for s in data.get("shadowedSeqs", [])],
            }
        elif kind in ("session/title", "session/title-llm-request") and "messageSeqs" in data:
            out["data"] = {
                **data,
                "messageSeqs": [one(s, "messageSeqs") for s in data["messageSeqs"]],
            }
    return out


def _v1_to_v2(header: dict[str, Any], events: list[Event]) -> tuple[dict[str, Any], list[Event]]:
    cut = header.get("seedLength")
    new_header = {k: v for k, v in header.items() if k != "seedLength"}
    new_header["version"] = 2
    new_header["isSeeded"] = cut is not None
    new_header = {k: new_header[k] for k in HEADER_KEYS_V3 if k in new_header}
    out = _Renumber(new_header, cut)
    pending: _Attempt | None = None
    last_time = int(header.get("createdAt", 0))

    def attempt_event(group: _Attempt) -> Event:
        return {
            "type": "assistant/attempt",
            "seq": group.last_seq,
            "time": group.last_time,
            "data": {"turn": group.turn, "step": group.step, "stream": pack_stream(group.chunks)},
        }

    def finish_attempt() -> None:
        nonlocal pending
        if pending is None:
            return
        group, pending = pending, None
        out.generated(group.last_seq, attempt_event(group))
        for event in group.after:
            out.source(event)

    def flush_after(group: _Attempt) -> None:
        for event in group.after:
            out.source(event)
        group.after.clear()

    for event in events:
        kind = event["type"]
        last_time = event["time"]
        data: Any = event.get("data")
        if kind == "assistant/chunk":
            turn, step, chunk = data["turn"], data["step"], data["chunk"]
            if pending is not None and (
                pending.terminal or (pending.turn, pending.step) != (turn, step)
            ):
                finish_attempt()
            elif pending is not None:
                flush_after(pending)
            if pending is None:
                pending = _Attempt(turn, step)
            pending.chunks.append((event["time"], chunk))
            pending.seqs.append(event["seq"])
            pending.last_seq = event["seq"]
            pending.last_time = event["time"]
            if isinstance(chunk, dict) and chunk.get("type") == "finish":
                pending.terminal = True
            continue
        if kind == "assistant/message":
            turn, step = data["turn"], data["step"]
            sources = event.get("sourceEventSeqs")
            message = {k: v for k, v in event.items() if k != "sourceEventSeqs"}
            if pending is not None and (pending.turn, pending.step) != (turn, step):
                finish_attempt()
                out.source({**message, "data": {**data, "stream": []}})
                continue
            if not sources:
                if sources is None and pending is not None:
                    raise _Refuse(
                        f"assistant/message {event['seq']} does not cite its chunk attempt"
                    )
                finish_attempt()
                out.source({**message, "data": {**data, "stream": []}})
                continue
            if pending is None or list(sources) != pending.seqs:
                raise _Refuse(
                    f"assistant/message {event['seq']} chunk provenance is not one complete "
                    "ordered attempt"
                )
            group, pending = pending, None
            flush_after(group)
            out.source({**message, "data": {**data, "stream": pack_stream(group.chunks)}})
            continue
        if kind in _CLOSES_ATTEMPT:
            finish_attempt()
            out.source(event)
            continue
        if pending is not None:
            pending.after.append(event)
            continue
        out.source(event)
    finish_attempt()
    out.finish(last_time)
    return new_header, out.out


# --------------------------------------------------------------------------- v2 → v3


def _system_id(session_id: str, anchor: Event) -> str:
    identity = json.dumps(
        ["session-format-v2-to-v3", session_id, anchor["seq"], anchor["type"]],
        separators=(",", ":"),
        ensure_ascii=False,
    )
    import hashlib  # here: only a v2 log needs it (OpenSSL costs every start ~4 ms to load)

    return "v2-to-v3-system-" + hashlib.sha256(identity.encode("utf-8")).hexdigest()


def _rename_ptc(event: Event) -> Event:
    kind = event["type"]
    data = event.get("data")
    if (
        kind == "agent-preset/selected"
        and isinstance(data, dict)
        and data.get("agentPreset") == "code"
    ):
        return {**event, "data": {**data, "agentPreset": "ptc"}}
    if kind in ("tool/code-dispatch-start", "tool/code-dispatch"):
        return {**event, "type": kind.replace("/code-", "/ptc-")}
    if kind == "user/message" and isinstance(data, dict):
        source = data.get("source")
        if (
            isinstance(source, dict)
            and source.get("kind") == "plugin"
            and source.get("plugin") == "tools-code-mode"
        ):
            return {**event, "data": {**data, "source": {**source, "plugin": "tools-ptc"}}}
    return event


def _v3_replace(event: Event) -> Event:
    """A v2 replace marker ``{op, start, end}`` in v3's spelling ``{op, startSeq, endSeq}``."""
    op = event.get("surfaceOp")
    if isinstance(op, dict) and set(op) == {"op", "start", "end"}:
        return {
            **event,
            "surfaceOp": {"op": op["op"], "startSeq": op["start"], "endSeq": op["end"]},
        }
    return event


def _v2_to_v3(header: dict[str, Any], events: list[Event]) -> tuple[dict[str, Any], list[Event]]:
    sid = str(header["id"])
    new_header = {**header, "version": 3}
    if new_header.get("agentPreset") == "code":
        new_header["agentPreset"] = "ptc"
    out: list[Event] = []
    mapping: list[int] = []
    step: dict[str, Any] | None = None
    head: int | None = None
    prompt = ""

    def emit_system(text: str, anchor: Event) -> None:
        nonlocal head, prompt
        if step is None:
            raise _Refuse(
                "a request prompt changed outside an open step; its chronology cannot be kept"
            )
        seq = len(out)
        event: Event = {
            "type": "system/message",
            "seq": seq,
            "time": anchor["time"],
            "data": {
                **step,
                "message": {
                    "id": _system_id(sid, anchor),
                    "role": "system",
                    "source": {"kind": "plugin", "plugin": _SYSTEM_PLUGIN},
                    "content": [] if text == "" else [{"type": "text", "text": text}],
                },
            },
        }
        if head is None:
            event["surfaceOp"] = "append"
        else:
            event["surfaceOp"] = {"op": "replace", "startSeq": head, "endSeq": head}
            event["sourceEventSeqs"] = [head]
        out.append(event)
        head = seq
        prompt = text

    for event in events:
        if event["seq"] != len(mapping):
            raise _Refuse("format v2 source events must be dense")
        source = event
        data = event.get("data")
        kind = event["type"]
        if kind == "request/header" and isinstance(data, dict):
            request = dict(data.get("header") or {})
            system = request.pop("system", None)
            text = system if isinstance(system, str) else ""
            if text != prompt:
                emit_system(text, event)
            source = {**event, "data": {**data, "header": request}}
        if kind in _SURFACE_V3 and head is None:
            raise _Refuse(
                "a surface event before the first step cannot acquire a system head "
                "without changing chronology"
            )
        target = remap(source, len(out), lambda s: mapping[s] if 0 <= s < len(mapping) else None)
        mapping.append(len(out))
        out.append(_rename_ptc(_v3_replace(target)))
        if kind == "step/start" and isinstance(data, dict):
            step = {"turn": data["turn"], "step": data["step"]}
            if head is None:
                emit_system("", event)
        elif kind in ("step/end", "turn/end"):
            step = None
    return new_header, out


# --------------------------------------------------------------------------- publication


def _encode(
    header: Mapping[str, Any], events: list[Event], compression: str, version: int
) -> bytes:
    head = header_json_bytes({**encode_header_record(header), "version": version})
    rows = [encode_event_row(e) for e in events]
    if version == V4_VERSION:
        rows = [lift_row(row) for row in rows]
    body = b"".join(_json.dumps_bytes(row) + b"\n" for row in rows)
    if compression == "zstd":
        return compress_frame(head) + (compress_frame(body) if body else b"")
    return head + body


def publish_generation(
    backend: JsonlStorage,
    artifact: ArtifactRead,
    header: dict[str, Any],
    events: list[Event],
    session_dir: str,
    version: int = CURRENT_VERSION,
) -> int:
    """Publish the migrated log as generation ``version`` (v3, or v4 for
    :func:`publish_v4`; caller holds the lock). ``header`` and ``events`` are in the
    core's v3 shapes; a v4 file gets them lifted.

    Returns the size of the published file. See the module docstring.
    """
    compression = backend.compression
    final = os.path.join(session_dir, generation_filename(version, compression))
    suffix = ".jsonl.zstd" if compression == "zstd" else ".jsonl"
    temp = os.path.join(session_dir, f"session.migration.{os.urandom(8).hex()}{suffix}.tmp")
    content = _encode(header, events, compression, version)
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        try:
            view = memoryview(content)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        _verify(temp, compression, header, events, version)
        if revision_of(os.stat(artifact.path)) != artifact.revision:
            raise SessionGenerationSourceChangedError(
                f'session "{header["id"]}": "{artifact.path}" changed while it was being '
                "migrated; nothing was published — open the session again"
            )
        try:
            os.link(temp, final)
        except FileExistsError:
            _accept_existing(final, content)
        fsync_dir(session_dir)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temp)
    return os.stat(final).st_size


def _verify(
    temp: str,
    compression: str,
    header: Mapping[str, Any],
    events: list[Event],
    version: int = CURRENT_VERSION,
) -> None:
    """Read the staged file back strictly and compare it with what was meant to be written
    (a v4 stage reads back lowered, so it compares with the v3 events it was made from)."""
    staged = read_artifact(temp, "zstd" if compression == "zstd" else "none", version)
    if staged.torn is not None:
        raise SessionPersistenceCorruptionError(
            f'migration stage "{temp}" reads back with a torn tail', path=temp
        )
    if encode_header_record(staged.header) != {**encode_header_record(header), "version": version}:
        raise SessionPersistenceCorruptionError(
            f'migration stage "{temp}" header does not read back as written', path=temp
        )
    if staged.events != events:
        raise SessionPersistenceCorruptionError(
            f'migration stage "{temp}" events do not read back as written', path=temp
        )


def _accept_existing(final: str, content: bytes) -> None:
    """An existing target is fine only if a concurrent winner published the same stage."""
    st = os.lstat(final)
    import stat as stat_module

    if not stat_module.S_ISREG(st.st_mode):
        raise SessionGenerationConflictError(
            f'"{final}" exists and is not a regular file; refusing to publish over it'
        )
    with open(final, "rb") as handle:
        prefix = handle.read(len(content))
    if prefix != content:
        raise SessionGenerationConflictError(
            f'"{final}" already exists with different content; refusing to overwrite it — '
            "open the session again to use it"
        )


# --------------------------------------------------------------------------- v3 -> v4

#: Content block types a v3 message slot may hold that v4 keeps under the same name (DSH's
#: v3 -> v4 edge renames any other tag ``plugin:<tag>``, which this build does not do).
_V4_KEPT_BLOCKS: Final = frozenset({"text", "reasoning", "image", "tool-call", "tool-result"})
_MESSAGE_SLOTS: Final = {
    "user/message": None,
    "system/message": "message",
    "assistant/message": "message",
    "tool/result": "message",
}


def v4_migration_problem(events: list[Event], children: list[str]) -> str | None:
    """Why DSH's v3 -> v4 edge would do more to this log than lift its rows, or None.

    DSH's edge (``session-format-v3-to-v4``) also closes an interrupted turn that a
    next-turn inbox splice proves, appends ``subagent/catalog`` facts for the session's
    subagent children, renames unknown content tags and ignorable event types
    ``plugin:<name>``, refuses a ``deferLoading`` tool definition and audits delivery
    markers. This build does none of that, so a log that would need any of it is not
    migrated (publishing a successor DSH would read differently is worse than none).
    """
    if children:
        named = ", ".join(sorted(children))
        return f"it has subagent children ({named}) whose catalog facts DSH appends"
    open_turn = False
    for event in events:
        kind = event.get("type")
        seq = event.get("seq")
        data = event.get("data")
        if event.get("ignorable") is True:
            return f'the ignorable event "{kind}" at seq {seq} is renamed by DSH\'s migration'
        if kind == "turn/start":
            if open_turn:
                return f"turn/start at seq {seq} starts a turn while one is open"
            open_turn = True
        elif kind == "turn/end":
            open_turn = False
        elif str(kind).startswith(("subagent/", "session-log-deepseek/")):
            return f'"{kind}" at seq {seq} is audited by DSH\'s migration'
        elif kind == "request/header" and isinstance(data, dict):
            tools = (
                data.get("header", {}).get("tools")
                if isinstance(data.get("header"), dict)
                else None
            )
            if isinstance(tools, list) and any(
                isinstance(t, dict) and "deferLoading" in t for t in tools
            ):
                return f"request/header at seq {seq} defines a tool with deferLoading"
        slot = _MESSAGE_SLOTS.get(str(kind), "-")
        if slot != "-" and isinstance(data, dict):
            message = data if slot is None else data.get(slot)
            content = message.get("content") if isinstance(message, dict) else None
            for block in content if isinstance(content, list) else []:
                tag = block.get("type") if isinstance(block, dict) else None
                if tag not in _V4_KEPT_BLOCKS:
                    return f'content block "{tag}" at seq {seq} is renamed by DSH\'s migration'
    return None


def publish_v4(
    backend: JsonlStorage, artifact: ArtifactRead, session_dir: str, children: list[str]
) -> int:
    """Publish a v3 log as its v4 successor ``session.v4.jsonl[.zstd]`` beside it (caller
    holds the lock): the same steps as the v0/v2 -> v3 publication — staged, read back and
    compared, the source's revision re-checked, linked without overwriting — so the source
    stays byte-identical and a source that changed meanwhile refuses publication."""
    sid = artifact.header.get("id")
    if artifact.version != CURRENT_VERSION:
        raise SessionFormatUnsupportedError(
            f'session "{sid}" is format v{artifact.version}; only a v3 log is migrated to v4 '
            f"(open it for write once to upgrade it to v3) (raw log: {artifact.path})",
            location=artifact.path,
        )
    if artifact.torn is not None:
        raise SessionFormatUnsupportedError(
            f'session "{sid}" has a torn tail; resume it (which repairs the tail) before '
            f"migrating it to v4 (raw log: {artifact.path})",
            location=artifact.path,
        )
    events = plain_rows(artifact.events)
    problem = v4_migration_problem(events, children)
    if problem is not None:
        raise SessionFormatUnsupportedError(
            f'session "{sid}" cannot be migrated to v4 by this build: {problem}; it stays v3, '
            f"which DSH 0.2 reads and migrates itself (raw log: {artifact.path})",
            location=artifact.path,
        )
    return publish_generation(
        backend, artifact, dict(artifact.header), events, session_dir, V4_VERSION
    )

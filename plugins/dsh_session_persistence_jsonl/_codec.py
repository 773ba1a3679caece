"""Logical records of a JSONL session log, as JSON values (no bytes, no files).

One log is a header record followed by event records, one JSON object per
line. This module turns headers and events into those records and back, for
the current format (v3) and for the historical ones the reader still decodes:

* v3 / v2 rows are events verbatim, except ``sourceEventSeqs``, whose
  consecutive runs of three or more are stored as ``[start, end]`` pairs;
* v0 / v1 rows may also be *packed chunk rows*: one row standing for a run of
  ``assistant/chunk`` delta events (``text-chunks``, ``reasoning-chunks``,
  ``tool-call-chunks`` with ``seq0``/``time0``/``dt``);
* in v2+ there are no chunk events at all: an ``assistant/message`` (or
  ``assistant/attempt``) carries its stream in ``data.stream`` as *compact
  stream records* (:func:`pack_stream` / :func:`expand_stream`).

Errors: :class:`RowError` marks one bad row (the scanner decides whether that
is a tolerated crash tail or corruption); header problems raise the seam's
typed errors directly, since a bad header is never a crash tail. Which event
*types* a log may hold is the session core's registry's business, checked when
stored events are decoded into typed events.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from msgspec import UnsetType

from dsh_host.sdk import (
    HEADER_KEYS,
    MAX_SAFE_INTEGER,
    SessionPersistenceCorruptionError,
    format_refusal,
    is_safe_int,
    system_message_problem,
)
from dsh_host.sdk import (
    header_from_meta as session_header_from_meta,
)

from ._paths import is_absolute_cwd
from ._v4 import V4_VERSION

__all__ = [
    "ADMISSION_TYPES_V3",
    "HEADER_KEYS_V3",
    "RowError",
    "StructuralRefusal",
    "admit_v3_row",
    "decode_event_row",
    "decode_header_record",
    "decode_v0_row",
    "encode_event_row",
    "encode_header_record",
    "expand_stream",
    "header_from_meta",
    "pack_source_seqs",
    "pack_stream",
    "source_seqs_admissible",
    "unpack_source_seqs",
]

MAX_SAFE: Final = MAX_SAFE_INTEGER

#: The v3 header key set, in written order (absent optional keys are omitted): the line's
#: ``type`` tag, then the session core's header keys in their order.
HEADER_KEYS_V3: Final = ("type", *HEADER_KEYS)
_HEADER_REQUIRED_V3: Final = frozenset(
    {"type", "version", "id", "createdAt", "isSeeded", "delegationDepth"}
)
#: v0 / v1 headers: ``seedLength`` (the fork cut) instead of ``isSeeded``, same place.
HEADER_KEYS_V0: Final = tuple("seedLength" if k == "isSeeded" else k for k in HEADER_KEYS_V3)
_HEADER_REQUIRED_V0: Final = frozenset({"type", "version", "id", "createdAt", "delegationDepth"})

_EVENT_REQUIRED: Final = ("type", "seq", "time", "data")
_EVENT_KEYS: Final = frozenset(
    {"type", "seq", "time", "data", "ignorable", "sourceEventSeqs", "surfaceOp"}
)

#: Top-level packed chunk row tags (v0 / v1 only).
CHUNK_ROW_TAGS: Final = {
    "text-chunks": "text-delta",
    "reasoning-chunks": "reasoning-delta",
    "tool-call-chunks": "tool-call-delta",
}


class RowError(ValueError):
    """One stored row is not a valid event record (why is the message)."""


def is_count(value: object) -> bool:
    """A non-negative safe integer (JSON ``-0`` parses as int 0, which JS also prints as 0)."""
    return type(value) is int and 0 <= value <= MAX_SAFE


# --------------------------------------------------------------------------- header


def header_from_meta(meta: Mapping[str, Any]) -> dict[str, Any]:
    """Validate header metadata handed to ``create`` and return it in v3 record order.

    The validation is the session core's (:func:`dsh_host._session.header.header_from_meta`:
    ``isSeeded`` or the older ``seedLength``, ``None`` as absent); this adds what a v3 record
    always carries: the ``type`` tag, ``isSeeded`` and ``delegationDepth`` (0 when absent).
    Raises ``ValueError`` (:class:`InvalidSessionHeaderError`) with the reason.
    """
    header = session_header_from_meta(meta).to_json()
    header.setdefault("isSeeded", False)
    header.setdefault("delegationDepth", 0)
    return encode_header_record({"type": "session", **header})


def encode_header_record(header: Mapping[str, Any]) -> dict[str, Any]:
    """The v3 header record in DSH's key order (``header`` as from :func:`header_from_meta`)."""
    return {key: header[key] for key in HEADER_KEYS_V3 if key in header}


#: Versions whose codec this build has (v0/v1 shape, v2/v3 shape, v4 as v3 rows lifted).
READABLE_VERSIONS: Final = frozenset({0, 1, 2, 3, V4_VERSION})


def decode_header_record(
    record: bytes, path: str, expected_version: int | None = None
) -> dict[str, Any]:
    """Parse the first record (``record`` includes its trailing newline).

    Order matters (DSH format.ts): JSON object first, then the version gate —
    a future header need not satisfy today's shape checks and must report
    "upgrade", never "corrupt" — then retired fields, then the exact shape.
    Returns the parsed record (with ``delegationDepth`` always present).
    """
    from . import _json

    at = f' (file "{path}")'
    if not record or record[-1:] != b"\n" or record.find(b"\n") != len(record) - 1:
        raise SessionPersistenceCorruptionError(
            f"empty or header-less session log{at}", path=path, offset=0
        )
    try:
        parsed = _json.loads(record[:-1], keep_negative_zero=True)
    except ValueError:
        raise SessionPersistenceCorruptionError(
            f"corrupt session log: header line is not valid JSON{at}", path=path, offset=0
        ) from None
    if not isinstance(parsed, dict):
        raise SessionPersistenceCorruptionError(
            f"corrupt session log: first line is not a JSON object{at}", path=path, offset=0
        )
    version = parsed.get("version")
    if type(version) is int and version not in READABLE_VERSIONS:
        raise format_refusal(str(parsed.get("id")), version, path, newest=V4_VERSION)
    if expected_version is not None and type(version) is int and version != expected_version:
        raise SessionPersistenceCorruptionError(
            f"corrupt session log: header version {version} does not match the generation "
            f"file name (v{expected_version}){at}",
            path=path,
            offset=0,
        )
    if "sandboxMode" in parsed or "approvalPolicy" in parsed:
        raise SessionPersistenceCorruptionError(
            f"session header uses retired policy baseline fields{at}", path=path, offset=0
        )
    problem = _header_shape_problem(parsed)
    if problem is not None:
        raise SessionPersistenceCorruptionError(
            f"corrupt session log: first line is not a session header ({problem}){at}",
            path=path,
            offset=0,
        )
    return parsed


def _header_shape_problem(value: dict[str, Any]) -> str | None:
    version = value.get("version")
    if type(version) is not int:
        return "version must be a number"
    v3_shape = version >= 2
    keys = HEADER_KEYS_V3 if v3_shape else HEADER_KEYS_V0
    required = _HEADER_REQUIRED_V3 if v3_shape else _HEADER_REQUIRED_V0
    for key in required:
        if key not in value:
            return f"missing {key}"
    for key in value:
        if key not in keys:
            return f"unexpected key {key}"
    if value["type"] != "session":
        return 'type must be "session"'
    if type(value["id"]) is not str:
        return "id must be a string"
    if not is_count(value["createdAt"]):
        return "createdAt must be a non-negative safe integer"
    if not is_count(value["delegationDepth"]):
        return "delegationDepth must be a non-negative safe integer"
    cwd = value.get("cwd")
    if cwd is not None and (type(cwd) is not str or not is_absolute_cwd(cwd)):
        return "cwd must be an absolute path"
    if "parentSession" in value and type(value["parentSession"]) is not str:
        return "parentSession must be a string"
    if v3_shape and type(value["isSeeded"]) is not bool:
        return "isSeeded must be a boolean"
    if not v3_shape and "seedLength" in value and not is_count(value["seedLength"]):
        return "seedLength must be a non-negative safe integer"
    if "origin" in value and value["origin"] != "subagent":
        return 'origin must be "subagent"'
    if "agentPreset" in value and type(value["agentPreset"]) is not str:
        return "agentPreset must be a string"
    return None


def header_json_bytes(header: Mapping[str, Any]) -> bytes:
    """The header line, newline included."""
    from . import _json

    return _json.dumps_bytes(encode_header_record(header)) + b"\n"


# --------------------------------------------------------------------------- sourceEventSeqs


def pack_source_seqs(values: Sequence[int]) -> list[Any]:
    """Store a strictly increasing list with runs of >= 3 as ``[start, end]`` pairs.

    A list that is not strictly increasing is stored verbatim (the pairs could
    not express its order). ``[1,2,3,5,6]`` → ``[[1,3],5,6]``.
    """
    if any(values[i] <= values[i - 1] for i in range(1, len(values))):
        return list(values)
    out: list[Any] = []
    i = 0
    while i < len(values):
        start = end = values[i]
        while i + 1 < len(values) and values[i + 1] == end + 1:
            i += 1
            end += 1
        if end - start >= 2:
            out.append([start, end])
        else:
            out.append(start)
            if end != start:
                out.append(end)
        i += 1
    return out


def source_seqs_admissible(sources: Sequence[int] | UnsetType, seq: int) -> bool:
    """True when a flat ``sourceEventSeqs`` (already non-negative safe integers) is what
    :func:`unpack_source_seqs` admits unchanged for the event at ``seq``: unique seqs, each
    earlier than ``seq`` (absent is admissible too)."""
    if isinstance(sources, UnsetType) or not sources:
        return True
    return max(sources) < seq and len(set(sources)) == len(sources)


def unpack_source_seqs(value: object, seq: int) -> list[int]:
    """Expand stored ``sourceEventSeqs`` of the event at ``seq`` (raises :class:`RowError`)."""
    if not isinstance(value, list):
        raise RowError("sourceEventSeqs must be an array")
    out: list[int] = []
    has_range = False
    for entry in value:
        if not isinstance(entry, list):
            if not is_count(entry):
                raise RowError("sourceEventSeqs member must be a non-negative safe integer")
            out.append(entry)
            continue
        if len(entry) != 2 or not is_count(entry[0]) or not is_count(entry[1]):
            raise RowError("sourceEventSeqs range must be a [start, end] pair")
        start, end = entry
        if start > end or end >= seq or end - start + 1 > seq - len(out):
            raise RowError("sourceEventSeqs range exceeds its event seq")
        out.extend(range(start, end + 1))
        has_range = True
    seen: set[int] = set()
    for source in out:
        if source >= seq or source in seen:
            raise RowError("sourceEventSeqs ranges must contain unique earlier seqs")
        seen.add(source)
    if has_range and any(out[i] <= out[i - 1] for i in range(1, len(out))):
        raise RowError("sourceEventSeqs ranges must be strictly increasing")
    return out


# --------------------------------------------------------------------------- event rows


def encode_event_row(event: Mapping[str, Any]) -> dict[str, Any]:
    """The stored record of a v3 event: the event, with ``sourceEventSeqs`` range-packed.

    ``event`` must already be plain JSON builtins (validated at admission).
    Key order is the event's own; readers never depend on it.
    """
    sources = event.get("sourceEventSeqs")
    if sources is None:
        return dict(event)
    row = dict(event)
    row["sourceEventSeqs"] = pack_source_seqs(sources)
    return row


def check_envelope(row: object) -> dict[str, Any]:
    """The v2/v3 envelope rules for one decoded row (raises :class:`RowError`)."""
    if not isinstance(row, dict):
        raise RowError("row is not a JSON object")
    for key in _EVENT_REQUIRED:
        if key not in row:
            raise RowError(f"row lacks required field {key}")
    for key in row:
        if key not in _EVENT_KEYS:
            raise RowError(f"row has unexpected field {key}")
    if type(row["type"]) is not str:
        raise RowError("row type must be a string")
    if not is_count(row["seq"]):
        raise RowError("row seq must be a non-negative safe integer")
    if not is_safe_int(row["time"]):
        raise RowError("row time must be a safe integer")
    if "ignorable" in row and row["ignorable"] is not True:
        raise RowError("row ignorable must be true when present")
    return row


class StructuralRefusal(Exception):
    """A v3 row DSH's structural admission refuses; no crash tail can excuse it.

    ``unsupported`` marks rows of a vocabulary this format retired (reported as
    :class:`SessionFormatUnsupportedError`); the others are corruption.
    """

    def __init__(self, message: str, *, unsupported: bool) -> None:
        super().__init__(message)
        self.unsupported = unsupported


#: The row types :func:`admit_v3_row` looks into (every other row passes it untouched).
ADMISSION_TYPES_V3: Final = frozenset(
    {"request/header", "system/message", "tool/code-dispatch", "tool/code-dispatch-start"}
)


def admit_v3_row(row: object) -> None:
    """DSH v3's structural row admission, checked before any torn-tail rule.

    DSH (``assertV3RowAdmission``) refuses the whole file — never drops the row
    as a damaged tail — when a parsed row is an object and is:

    * a ``request/header`` whose ``data`` or ``data.header`` is not an object, or
      whose header carries the retired ``system`` (the prompt is a ``system/message``);
    * a ``system/message`` DSH would not have written (exact keys, plugin source,
      content rules: :func:`~dsh_host._session.events.system_message_problem`);
    * a ``tool/code-dispatch`` or ``tool/code-dispatch-start`` not marked
      ``ignorable`` (v3 renamed them ``tool/ptc-dispatch*``).

    So a write handle never truncates a row DSH would refuse to drop.
    """
    if not isinstance(row, dict):
        return
    kind = row.get("type")
    if kind == "request/header":
        data = row.get("data")
        if not isinstance(data, dict):
            raise StructuralRefusal(
                "format v3 request/header data must be an object", unsupported=False
            )
        header = data.get("header")
        if not isinstance(header, dict):
            raise StructuralRefusal(
                "format v3 request/header header must be an object", unsupported=False
            )
        if "system" in header:
            raise StructuralRefusal(
                "format v3 request/header rejects retired header.system", unsupported=True
            )
    elif kind == "system/message":
        problem = system_message_problem(row.get("data"))
        if problem is not None:
            raise StructuralRefusal(
                f"format v3 system/message refused: {problem}", unsupported=False
            )
    elif (
        kind in ("tool/code-dispatch", "tool/code-dispatch-start")
        and row.get("ignorable") is not True
    ):
        raise StructuralRefusal(
            f'format v3 contains unknown event type "{kind}" at seq {row.get("seq")!r} '
            "(v3 writes tool/ptc-dispatch*)",
            unsupported=True,
        )


def decode_event_row(row: object) -> dict[str, Any]:
    """A v2/v3 row as its event (envelope checked, ``sourceEventSeqs`` expanded)."""
    event = check_envelope(row)
    if "sourceEventSeqs" in event:
        event["sourceEventSeqs"] = unpack_source_seqs(event["sourceEventSeqs"], event["seq"])
    return event


# --------------------------------------------------------------------------- v0/v1 rows


def _check_v0_envelope(row: dict[str, Any]) -> dict[str, Any]:
    event = check_envelope(row)
    sources = event.get("sourceEventSeqs")
    if sources is not None and (
        not isinstance(sources, list) or not all(is_count(s) for s in sources)
    ):
        raise RowError("sourceEventSeqs must be an array of non-negative safe integers")
    return event


def decode_v0_row(row: object) -> list[dict[str, Any]]:
    """One v0/v1 row as the events it stands for (a packed row expands to a run)."""
    if not isinstance(row, dict):
        raise RowError("row is not a JSON object")
    tag = row.get("type")
    if tag not in CHUNK_ROW_TAGS:
        return [_check_v0_envelope(row)]
    why = f"malformed {tag} storage row"
    if set(row) != {"type", "seq0", "time0", "data"}:
        raise RowError(f"{why}: envelope must be exactly {{type, seq0, time0, data}}")
    seq0, time0, data = row["seq0"], row["time0"], row["data"]
    if not is_count(seq0):
        raise RowError(f"{why}: seq0 must be a non-negative safe integer")
    if not is_safe_int(time0):
        raise RowError(f"{why}: time0 must be a safe integer")
    if not isinstance(data, dict):
        raise RowError(f"{why}: data must be an object")
    is_tool = tag == "tool-call-chunks"
    member_key = "args" if is_tool else "texts"
    base = {"turn", "step", "index", "dt", member_key}
    if is_tool:
        allowed = base | {"id", "name"}
        if not (base | {"id"}) <= set(data) or not set(data) <= allowed:
            raise RowError(
                f"{why}: data must be exactly {{turn, step, index, id, name?, dt, args}}"
            )
        if type(data["id"]) is not str or ("name" in data and type(data["name"]) is not str):
            raise RowError(f"{why}: id (and name when present) must be strings")
    elif set(data) != base:
        raise RowError(f"{why}: data must be exactly {{turn, step, index, dt, texts}}")
    if not all(type(data[k]) in (int, float) for k in ("turn", "step", "index")):
        raise RowError(f"{why}: turn/step/index must be numbers")
    members = data[member_key]
    if not isinstance(members, list) or not members or not all(type(m) is str for m in members):
        raise RowError(f"{why}: {member_key} must be a non-empty string array")
    dt = data["dt"]
    if not isinstance(dt, list) or not all(is_safe_int(d) for d in dt):
        raise RowError(f"{why}: dt must be an array of safe integers")
    if len(dt) != len(members) - 1:
        raise RowError(f"{why}: dt length {len(dt)} does not match {len(members)} members")
    if seq0 + len(members) - 1 > MAX_SAFE:
        raise RowError(f"{why}: member seqs must stay safe integers")
    events: list[dict[str, Any]] = []
    time = time0
    chunk_type = CHUNK_ROW_TAGS[tag]
    for k, member in enumerate(members):
        if k:
            time += dt[k - 1]
            if not is_safe_int(time):
                raise RowError(f"{why}: member times must stay safe integers")
        chunk: dict[str, Any]
        if is_tool:
            chunk = {"type": chunk_type, "index": data["index"], "id": data["id"]}
            if "name" in data:
                chunk["name"] = data["name"]
            chunk["argumentsDelta"] = member
        else:
            chunk = {"type": chunk_type, "index": data["index"], "text": member}
        events.append(
            {
                "type": "assistant/chunk",
                "seq": seq0 + k,
                "time": time,
                "data": {"turn": data["turn"], "step": data["step"], "chunk": chunk},
            }
        )
    return events


# --------------------------------------------------------------------------- stream records


def pack_stream(timed_chunks: Iterable[tuple[int, Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """Compact ``(time, chunk)`` pairs into v3 ``assistant/message.stream`` records.

    Consecutive deltas of one block (same kind and index; for tool calls the
    same id and name) become one run record ``{type, time0, index, dt, texts|args}``
    — even a run of one. Everything else (block-start/-end, usage, finish,
    a tool-call delta without id) is a raw ``{type:'chunk', time, chunk}``.
    Lossless: :func:`expand_stream` gives back the same pairs.
    """
    records: list[dict[str, Any]] = []
    last_time: int | None = None
    for time, chunk in timed_chunks:
        kind = chunk.get("type")
        prev = records[-1] if records else None
        gap = None if last_time is None else time - last_time
        gap_ok = gap is not None and is_safe_int(gap)
        if kind in ("text-delta", "reasoning-delta") and type(chunk.get("text")) is str:
            tag = "text-chunks" if kind == "text-delta" else "reasoning-chunks"
            if (
                prev is not None
                and prev["type"] == tag
                and prev["index"] == chunk["index"]
                and gap_ok
            ):
                prev["dt"].append(gap)
                prev["texts"].append(chunk["text"])
            else:
                records.append(
                    {
                        "type": tag,
                        "time0": time,
                        "index": chunk["index"],
                        "dt": [],
                        "texts": [chunk["text"]],
                    }
                )
        elif (
            kind == "tool-call-delta"
            and type(chunk.get("id")) is str
            and chunk["id"] != ""
            and chunk.get("name", None) != ""
        ):
            same = (
                prev is not None
                and prev["type"] == "tool-call-chunks"
                and prev["index"] == chunk["index"]
                and prev["id"] == chunk["id"]
                and ("name" in prev) == ("name" in chunk)
                and prev.get("name") == chunk.get("name")
                and gap_ok
            )
            if same:
                assert prev is not None
                prev["dt"].append(gap)
                prev["args"].append(chunk["argumentsDelta"])
            else:
                record: dict[str, Any] = {
                    "type": "tool-call-chunks",
                    "time0": time,
                    "index": chunk["index"],
                    "dt": [],
                    "id": chunk["id"],
                }
                if "name" in chunk:
                    record["name"] = chunk["name"]
                record["args"] = [chunk["argumentsDelta"]]
                records.append(record)
        else:
            records.append({"type": "chunk", "time": time, "chunk": dict(chunk)})
        last_time = time
    return records


def expand_stream(records: Sequence[Mapping[str, Any]]) -> list[tuple[int, dict[str, Any]]]:
    """Expand compact stream records back to ``(time, chunk)`` pairs (raises ``ValueError``)."""
    out: list[tuple[int, dict[str, Any]]] = []
    for record in records:
        kind = record.get("type")
        if kind == "chunk":
            if not is_safe_int(record.get("time")) or not isinstance(record.get("chunk"), Mapping):
                raise ValueError("stream chunk record needs a safe-integer time and a chunk object")
            out.append((record["time"], dict(record["chunk"])))
            continue
        if kind not in ("text-chunks", "reasoning-chunks", "tool-call-chunks"):
            raise ValueError(f"unknown stream record type {kind!r}")
        members = record.get("args" if kind == "tool-call-chunks" else "texts")
        dt = record.get("dt")
        if not isinstance(members, Sequence) or not isinstance(dt, Sequence):
            raise ValueError(f"{kind} record needs member and dt arrays")
        if len(dt) != len(members) - 1 or not all(is_safe_int(d) for d in dt):
            raise ValueError(f"{kind} dt must hold one safe-integer gap per member after the first")
        time = record.get("time0")
        if not is_safe_int(time):
            raise ValueError(f"{kind} time0 must be a safe integer")
        assert isinstance(time, int)
        for k, member in enumerate(members):
            if k:
                time += dt[k - 1]
            chunk: dict[str, Any]
            if kind == "tool-call-chunks":
                chunk = {"type": "tool-call-delta", "index": record["index"], "id": record["id"]}
                if "name" in record:
                    chunk["name"] = record["name"]
                chunk["argumentsDelta"] = member
            else:
                delta = "text-delta" if kind == "text-chunks" else "reasoning-delta"
                chunk = {"type": delta, "index": record["index"], "text": member}
            out.append((time, chunk))
    return out

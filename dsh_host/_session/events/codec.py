"""The wire codec: surface-marker parsing, envelope decoding, encoding."""

from __future__ import annotations

import builtins
import json
import re
from collections.abc import Iterator, Mapping
from typing import Any, Final, Literal, NamedTuple

import msgspec
import msgspec.inspect
from msgspec import UNSET, UnsetType

from dsh_host._jsonsafe import (
    FrozenJson,
    NonJsonValueError,
    is_safe_int,
    parse_js_float,
    to_json_builtins,
)
from dsh_host._session.errors import InvalidSessionEventError
from dsh_host._session.messages import NonNegativeInt, SafeInt

from .coerce import _ENCODER, _coerce_plain, _tool_result_consistent
from .envelope import ReplaceOp, SessionEvent, SurfaceOp
from .reasons import _dec_hook, _enc_hook
from .registry import _REGISTRY, EventTypeSpec, is_known_event_type

# --- surface marker parsing ----------------------------------------------------------------


def parse_surface_marker(
    type: str, surface_op: Any, source_event_seqs: Any, *, where: str | None = None
) -> tuple[SurfaceOp | UnsetType, tuple[int, ...] | UnsetType]:
    """Check the event-local shape of the surface marker and return it typed.

    This is the shape check only (eligibility, marker form, source list form);
    whether a replace range exists is the surface's job. ``surface_op`` and
    ``source_event_seqs`` are plain values or ``UNSET``.
    """
    spec = _REGISTRY.get(type)
    surface = spec is not None and spec.surface
    if surface and surface_op == "append" and source_event_seqs is UNSET:
        return "append", UNSET  # the common case, decided without building a label
    if not surface and surface_op is UNSET and source_event_seqs is UNSET:
        return UNSET, UNSET
    label = where or f'session event "{type}"'
    if not surface:
        if surface_op is not UNSET:
            raise InvalidSessionEventError(
                f"{label} is not surface-eligible and cannot carry surfaceOp", event_type=type
            )
        if source_event_seqs is not UNSET:
            raise InvalidSessionEventError(
                f"{label} is not surface-eligible and cannot carry sourceEventSeqs",
                event_type=type,
            )
        return UNSET, UNSET
    op: SurfaceOp
    if surface_op is UNSET or surface_op is None:
        raise InvalidSessionEventError(
            f"{label} is surface-eligible and requires a surfaceOp marker", event_type=type
        )
    if surface_op == "append":
        op = "append"
    elif isinstance(surface_op, ReplaceOp):
        op = surface_op
    elif isinstance(surface_op, Mapping):
        op = _parse_replace(type, surface_op, label)
    else:
        raise InvalidSessionEventError(f"{label} carries an invalid surfaceOp", event_type=type)
    sources: tuple[int, ...] | UnsetType = UNSET
    if source_event_seqs is not UNSET:
        if not isinstance(source_event_seqs, list | tuple):
            raise InvalidSessionEventError(
                f"{label}: sourceEventSeqs must be an array when present", event_type=type
            )
        for s in source_event_seqs:
            if not is_safe_int(s) or s < 0:
                raise InvalidSessionEventError(
                    f"{label} sourceEventSeqs must densely contain non-negative safe integers",
                    event_type=type,
                )
        sources = tuple(source_event_seqs)
    return op, sources


def _parse_replace(type: str, op: Mapping[str, Any], label: str) -> ReplaceOp:
    keys = set(op)
    if keys == {"op", "start", "end"}:
        start, end = op["start"], op["end"]
    elif keys == {"op", "startSeq", "endSeq"}:
        # DSH v3's spelling, which is also what this build writes.
        start, end = op["startSeq"], op["endSeq"]
    else:
        raise InvalidSessionEventError(
            f"{label} carries an invalid replace surfaceOp", event_type=type
        )
    if (
        op["op"] != "replace"
        or not is_safe_int(start)
        or not is_safe_int(end)
        or start < 0
        or end < 0
    ):
        raise InvalidSessionEventError(
            f"{label} carries an invalid replace surfaceOp", event_type=type
        )
    return ReplaceOp(start=start, end=end)


# --- wire codec ----------------------------------------------------------------------------


class _RawEnvelope(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    type: str
    seq: int
    time: int
    data: msgspec.Raw
    source_event_seqs: Any = UNSET
    surface_op: Any = UNSET
    ignorable: Any = UNSET


class _PlainEnvelope(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    type: str
    seq: int
    time: int
    data: Any
    source_event_seqs: Any = UNSET
    surface_op: Any = UNSET
    ignorable: Any = UNSET


_ENVELOPE_DECODER: Final = msgspec.json.Decoder(_RawEnvelope)
_SURROGATE_RE: Final = re.compile("[\ud800-\udfff]")


def _envelope_error(detail: str, where: str) -> InvalidSessionEventError:
    return InvalidSessionEventError(f"{where} has an invalid event envelope: {detail}")


def _check_envelope(env: _RawEnvelope | _PlainEnvelope, where: str) -> None:
    if not is_safe_int(env.seq) or env.seq < 0:
        raise _envelope_error(f"seq must be a non-negative safe integer, got {env.seq!r}", where)
    if not is_safe_int(env.time):
        raise _envelope_error(f"time must be a safe integer, got {env.time!r}", where)
    if env.ignorable is not UNSET and env.ignorable is not True:
        raise _envelope_error(f"ignorable must be exactly true, got {env.ignorable!r}", where)


def decode_event(
    raw: bytes | str | Mapping[str, Any],
    *,
    where: str = "session event",
    parsed_plain: bool = False,
    exact: bool = False,
) -> SessionEvent:
    """Decode one event from JSON text or an already parsed mapping (two-phase).

    Phase 1 checks the envelope (known keys only; ``seq`` a non-negative safe
    integer; ``time`` a safe integer; ``data`` present; ``ignorable`` exactly
    ``true``). Phase 2 decodes ``data`` through the registry. Raises
    :class:`UnknownEventTypeError` for an unregistered type without
    ``ignorable: true``, and :class:`InvalidSessionEventError` otherwise;
    messages start with ``where`` (e.g. ``seed event at index 3``).

    ``parsed_plain=True`` vouches that ``raw`` is a ``dict`` just produced by a
    strict JSON parser with JavaScript number semantics (integral floats already
    ints, no non-finite numbers) whose ``data`` holds no integer outside
    ±(2**53-1), and that the caller hands it over (nothing else holds it): its
    ``data`` is then used as is instead of being walked and copied by
    :func:`to_json_builtins`, which on such a value would only copy it. A reader
    that cannot vouch (it saw a long digit run in the row) leaves it False.

    The returned event keeps the record as :attr:`SessionEvent.wire` when its
    typed fields hold less than the record (compared as JSON values, so key
    order alone never counts); ``exact=True`` (a mapping built in a key order
    that matters, e.g. DSH's repair closers) also keeps it when only the order
    differs.
    """
    plain_data: Any
    record: Any = None
    if isinstance(raw, bytes | str | bytearray | memoryview):
        try:
            env: _RawEnvelope | _PlainEnvelope = _ENVELOPE_DECODER.decode(raw)
        except msgspec.ValidationError as exc:
            raise _envelope_error(str(exc), where) from exc
        except msgspec.DecodeError as exc:
            # msgspec refuses escaped lone surrogates ("\ud800"), which JavaScript writers
            # emit; the stdlib parser accepts them, so retry through the mapping path.
            try:
                parsed = json.loads(raw)
            except (ValueError, TypeError):
                raise InvalidSessionEventError(f"{where} is not valid JSON: {exc}") from exc
            if not isinstance(parsed, dict):
                raise _envelope_error("the record is not a JSON object", where) from exc
            return decode_event(parsed, where=where)
        _check_envelope(env, where)
        assert isinstance(env, _RawEnvelope)
        try:
            plain_data = msgspec.json.decode(env.data)
            record = msgspec.json.decode(raw)
        except msgspec.DecodeError as exc:  # pragma: no cover - envelope decode checked it
            raise _envelope_error(f"data is not JSON: {exc}", where) from exc
    elif isinstance(raw, Mapping):
        try:
            env = msgspec.convert(dict(raw), _PlainEnvelope)
        except msgspec.ValidationError as exc:
            raise _envelope_error(str(exc), where) from exc
        _check_envelope(env, where)
        try:
            if parsed_plain and type(raw) is dict:
                plain_data = env.data
                record = raw
            else:
                plain_data = to_json_builtins(env.data, f"{where} data")
                record = {
                    key: plain_data if key == "data" else to_json_builtins(value, where)
                    for key, value in raw.items()
                }
        except NonJsonValueError as exc:
            raise InvalidSessionEventError(
                f"{where} is not losslessly JSON-serializable: {exc.problem} at {exc.path}",
                event_type=env.type,
                seq=env.seq,
            ) from exc
    else:
        raise TypeError(f"decode_event expects bytes, str or a mapping, got {type(raw)!r}")
    subject = f'{where} "{env.type}" (seq {env.seq})'
    ignorable = env.ignorable is True
    try:
        data = _coerce_plain(env.type, plain_data, subject, ignorable)
        if not is_known_event_type(env.type):
            # Unknown ignorable records keep their metadata opaque and never join the surface.
            return _keep_wire(
                SessionEvent(
                    type=env.type,
                    seq=env.seq,
                    time=env.time,
                    data=data,
                    ignorable=True,
                ),
                record,
                exact,
            )
        surface_op, sources = parse_surface_marker(
            env.type,
            _plain_marker(env.surface_op),
            _plain_marker(env.source_event_seqs),
            where=subject,
        )
    except InvalidSessionEventError as exc:
        exc.seq = env.seq
        raise
    return _keep_wire(
        SessionEvent(
            type=env.type,
            seq=env.seq,
            time=env.time,
            data=data,
            source_event_seqs=sources,
            surface_op=surface_op,
            ignorable=True if ignorable else UNSET,
        ),
        record,
        exact,
    )


#: Types whose key order is the producer's, kept as read: DSH builds a developer message by
#: spreading its producer's input (``createDeveloperMessage``), so no one order is DSH's and
#: a v4 log must re-encode to its own bytes (docs/format.md §10.1).
_PRODUCER_ORDERED: Final = frozenset({"developer/message"})


def _keep_wire(event: SessionEvent, record: Any, exact: bool) -> SessionEvent:
    """``event``, carrying ``record`` as its wire form when the typed fields would lose it."""
    typed = encode_event(event)
    wire = _json_bytes(record)
    if wire == typed:
        return event  # the common case: the record is what this build writes
    if not exact and event.type not in _PRODUCER_ORDERED:
        try:
            same = msgspec.json.decode(typed) == record
        except msgspec.DecodeError:  # an escaped lone surrogate
            same = json.loads(typed) == record
        if same:
            return event  # only the key order differs
    return msgspec.structs.replace(event, wire=wire)


def _json_bytes(value: Any) -> bytes:
    """Compact JSON as a JavaScript writer prints it (a lone surrogate escaped, not an error)."""
    try:
        return _ENCODER.encode(value)
    except UnicodeEncodeError:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        return _SURROGATE_RE.sub(lambda m: f"\\u{ord(m.group()):04x}", text).encode("utf-8")


def _plain_marker(value: Any) -> Any:
    if isinstance(value, msgspec.Raw):  # pragma: no cover - defensive
        return msgspec.json.decode(value)
    return value


# --- the one-pass decode of a line this build wrote -----------------------------------------
#
# Reading a stored log, nearly every line is exactly what ``encode_event`` made of a valid
# event. For such a line one typed msgspec decode (envelope and data Struct in one C-level
# pass) gives the event the general path would give, without its second walk over plain
# values; re-encoding the event and finding the line byte for byte is what proves the line
# was that encoding. Every other line (another writer's key order or extra keys, a number
# or an escape printed differently, a refusal) returns None, and the caller takes the
# general path, which decides and explains exactly as before.

#: Types whose admission rules run on plain values (the retired ``header.system`` and
#: ``reason: "fallback"`` of a request header, DSH v3's ``system/message`` rules): always
#: the general path.
_GENERAL_PATH_TYPES: Final = frozenset({"request/header", "system/message"})
_LINE_PREFIX: Final = b'{"type":"'


_NO_FLOATS: Final = (
    *(msgspec.inspect.AnyType, msgspec.inspect.StrType, msgspec.inspect.BoolType),
    *(msgspec.inspect.NoneType, msgspec.inspect.IntType, msgspec.inspect.LiteralType),
    msgspec.inspect.CustomType,  # decoded by a hook from untyped values: the float hook's
)


def _decodes_floats(info: msgspec.inspect.Type, seen: set[builtins.type]) -> bool:
    """True when a typed decode of ``info`` may meet a JSON number as a float in a typed
    position, or a type this check does not know (either way: not for the one-pass decode).

    A typed float position decodes ``2.0`` as ``2.0`` where the general path (the text read
    with JavaScript semantics first, ``2``, then converted) may keep ``2`` (``int | float``).
    Untyped and hook-decoded positions are read with the same float hook on both paths.
    """
    mi = msgspec.inspect
    if isinstance(info, _NO_FLOATS):
        return False
    if isinstance(info, mi.StructType):
        if info.cls in seen:
            return False
        seen.add(info.cls)
        return any(_decodes_floats(f.type, seen) for f in info.fields)
    if isinstance(info, mi.ListType | mi.VarTupleType | mi.SetType | mi.FrozenSetType):
        return _decodes_floats(info.item_type, seen)
    if isinstance(info, mi.TupleType):
        return any(_decodes_floats(t, seen) for t in info.item_types)
    if isinstance(info, mi.DictType):
        return _decodes_floats(info.key_type, seen) or _decodes_floats(info.value_type, seen)
    if isinstance(info, mi.UnionType):
        return any(_decodes_floats(t, seen) for t in info.types)
    return True  # FloatType, and anything else (decimals, dates, ...)


class _LineDecoder(NamedTuple):
    spec: EventTypeSpec  #: the registry entry it was built for (stale once replaced)
    decoder: msgspec.json.Decoder[Any] | None  #: None: this type takes the general path


_LINE_DECODERS: dict[bytes, _LineDecoder] = {}


def _line_decoder(spec: EventTypeSpec) -> msgspec.json.Decoder[Any] | None:
    """The typed decoder of a whole stored line of ``spec.type``, or None for a type whose
    lines always take the general path."""
    if spec.type in _GENERAL_PATH_TYPES:
        return None
    data_type: Any = spec.data_type if spec.data_type is not None else FrozenJson
    if spec.data_type is not None and _decodes_floats(
        msgspec.inspect.type_info(spec.data_type), set()
    ):
        return None
    fields: list[tuple[str, Any] | tuple[str, Any, Any]] = [
        *(("type", Literal[spec.type]), ("seq", NonNegativeInt), ("time", SafeInt)),
        ("data", data_type),
    ]
    if spec.surface:
        fields.append(("surface_op", SurfaceOp))
        fields.append(("source_event_seqs", tuple[NonNegativeInt, ...] | UnsetType, UNSET))
    fields.append(("ignorable", Literal[True] | UnsetType, UNSET))
    row = msgspec.defstruct(
        "StoredLine", fields, kw_only=True, forbid_unknown_fields=True, rename="camel", gc=False
    )
    return msgspec.json.Decoder(row, dec_hook=_dec_hook, float_hook=parse_js_float)


def decode_event_line(line: bytes) -> SessionEvent | None:
    """The event a stored line is the exact encoding of, in one typed pass; else None.

    Returns the event only when ``line`` is byte for byte what :func:`encode_event` writes
    for a valid event of a registered type (envelope, data Struct, surface marker and every
    registered check satisfied); the event then equals what :func:`decode_event` gives for
    the line read as plain JSON with JavaScript number semantics (``parsed_plain=True``).
    Anything else -- an unknown type, another writer's key order or keys, a number or a
    string escape printed differently, a value the general path would refuse or keep as
    :attr:`SessionEvent.wire` -- returns None: the caller takes the general path, which
    decides and explains. Never raises for any input.

    The caller vouches, as for ``parsed_plain``, that the line holds no integer outside
    ±(2**53-1) (a reader checks for a run of 16 digits). Storage-level rules on top of
    the event (e.g. a log's ``sourceEventSeqs`` naming only earlier seqs) stay the caller's.
    """
    if not line.startswith(_LINE_PREFIX):
        return None
    end = line.find(b'"', len(_LINE_PREFIX))
    key = line[len(_LINE_PREFIX) : end]
    entry = _LINE_DECODERS.get(key)
    if entry is None or _REGISTRY.get(entry.spec.type) is not entry.spec:
        try:
            spec = _REGISTRY.get(key.decode("ascii"))
        except UnicodeDecodeError:
            return None
        if spec is None:
            return None  # unknown types (ignorable or not) take the general path
        entry = _LINE_DECODERS[key] = _LineDecoder(spec, _line_decoder(spec))
    decoder = entry.decoder
    if decoder is None:
        return None
    try:
        row = decoder.decode(line)
        if entry.spec.type == "tool/result" and not _tool_result_consistent(row.data):
            return None
        event = _event_of(entry.spec, row)
        if _ENCODER.encode(event) != line:
            return None
    except Exception:  # any refusal or doubt: the general path gives the verdict and its text
        return None
    return event


def _event_of(spec: EventTypeSpec, row: Any) -> SessionEvent:
    surface = spec.surface
    return SessionEvent(
        type=spec.type, seq=row.seq, time=row.time, data=row.data, ignorable=row.ignorable,
        source_event_seqs=row.source_event_seqs if surface else UNSET,
        surface_op=row.surface_op if surface else UNSET,
    )  # fmt: skip


def decode_accepted_line(line: bytes) -> SessionEvent | None:
    """:func:`decode_event_line` of a line it accepted before (a packed page, D37), without
    the checks that accepted these bytes; None if the type's decoder changed since."""
    end = line.find(b'"', len(_LINE_PREFIX))
    entry = _LINE_DECODERS.get(line[len(_LINE_PREFIX) : end])
    if entry is None or entry.decoder is None or _REGISTRY.get(entry.spec.type) is not entry.spec:
        return None
    return _event_of(entry.spec, entry.decoder.decode(line))


def decode_events(lines: Iterator[bytes | str] | list[bytes] | list[str]) -> list[SessionEvent]:
    """Decode a sequence of JSON event records (no contiguity check; see ``Session.restore``)."""
    return [decode_event(line) for line in lines]


def encode_event(event: SessionEvent) -> bytes:
    """Encode one event as compact JSON (camelCase keys, absent optionals omitted).

    Byte-compatible with a JavaScript writer: non-ASCII kept raw, and a lone
    surrogate escaped as ``\\udXXX`` instead of failing UTF-8 encoding. An
    event that carries its :attr:`~SessionEvent.wire` form is that form.
    """
    if event.wire is not UNSET:
        return event.wire
    try:
        return _ENCODER.encode(event)
    except UnicodeEncodeError:
        return _json_bytes(event_to_builtins(event))


def to_builtins(value: object) -> Any:
    """Any event payload or message as plain JSON values (frozen mappings included).

    What views print: ``msgspec.to_builtins`` alone refuses the read-only
    mappings a frozen payload holds (a runtime-context snapshot's ``sections``).
    """
    return msgspec.to_builtins(value, enc_hook=_enc_hook)


def event_to_builtins(event: SessionEvent) -> dict[str, Any]:
    """The event as plain JSON values (dicts, lists, scalars), e.g. for comparisons."""
    out: dict[str, Any]
    if event.wire is not UNSET:
        try:
            out = msgspec.json.decode(event.wire)
        except msgspec.DecodeError:  # an escaped lone surrogate: the stdlib parser reads it
            out = json.loads(event.wire)
        return out
    try:
        out = msgspec.json.decode(_ENCODER.encode(event))
    except UnicodeEncodeError:  # lone surrogates: the stdlib codec carries them
        out = json.loads(json.dumps(msgspec.to_builtins(event, enc_hook=_enc_hook)))
    return out

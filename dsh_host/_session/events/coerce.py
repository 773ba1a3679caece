"""Data coercion, shared by append and decode: shape checks, DSH v3 admission, the fast path."""

from __future__ import annotations

import builtins
from collections.abc import Mapping
from typing import Any, Final

import msgspec
import msgspec.inspect
from msgspec import UNSET

from dsh_host._jsonsafe import (
    MAX_SAFE_INTEGER,
    NonJsonValueError,
    check_json,
    freeze_json,
    is_safe_int,
    to_json_builtins,
)
from dsh_host._session.errors import InvalidSessionEventError, UnknownEventTypeError
from dsh_host._session.messages import (
    ToolResultBlock,
    ToolResultMessage,
)

from .reasons import _dec_hook, _enc_hook
from .registry import _REGISTRY

#: The JSON encoder of event data (turn-end reasons of unknown kinds encode verbatim).
_ENCODER: Final = msgspec.json.Encoder(enc_hook=_enc_hook)


# --- data coercion (append and decode share it) --------------------------------------------

_MESSAGE_ROLES: Final = {
    "user/message": "user",
    "assistant/message": "assistant",
    "tool/result": "user",
    "system/message": "system",
    "developer/message": "developer",
}


def _check_message_shape(type: str, data: Any, subject: str) -> None:
    """The message-shape checks of DSH's seed validation, with its exact texts.

    Run before the typed conversion so a malformed message is reported in
    terms of the message, not of msgspec's type paths.
    """
    if type == "user/message":
        message = data
    else:
        if not isinstance(data, Mapping):
            raise InvalidSessionEventError(f"{subject} data must be an object", event_type=type)
        message = data.get("message")
    if not isinstance(message, Mapping):
        raise InvalidSessionEventError(f"{subject} lacks an identified message", event_type=type)
    mid = message.get("id")
    if not isinstance(mid, str) or not mid:
        raise InvalidSessionEventError(f"{subject} lacks an identified message", event_type=type)
    role = _MESSAGE_ROLES[type]
    if message.get("role") != role:
        raise InvalidSessionEventError(
            f'{subject} message must have role "{role}"', event_type=type
        )
    source = message.get("source")
    if (
        not isinstance(source, Mapping)
        or not isinstance(source.get("kind"), str)
        or not source.get("kind")
    ):
        raise InvalidSessionEventError(f"{subject} message has invalid source", event_type=type)
    content = message.get("content")
    if not isinstance(content, list | tuple):
        raise InvalidSessionEventError(f"{subject} message has invalid content", event_type=type)
    if type == "assistant/message":
        if (
            source.get("kind") != "model"
            or not isinstance(source.get("provider"), str)
            or not source.get("provider")
            or not isinstance(source.get("model"), str)
            or not source.get("model")
        ):
            raise InvalidSessionEventError(
                f"{subject} message must have model source", event_type=type
            )
    elif type == "tool/result":
        call_id = source.get("callId")
        if source.get("kind") != "tool" or not isinstance(call_id, str) or not call_id:
            raise InvalidSessionEventError(
                f"{subject} message must have tool source", event_type=type
            )
        if (
            len(content) != 1
            or not isinstance(content[0], Mapping)
            or content[0].get("type") != "tool-result"
        ):
            raise InvalidSessionEventError(
                f"{subject} message must contain one tool-result block", event_type=type
            )
        if content[0].get("toolCallId") != call_id:
            raise InvalidSessionEventError(
                f"{subject} message has mismatched tool call ids", event_type=type
            )


# --- DSH v3's admission of system/message (payload.ts ``assertSystem``) ---------------------
#
# DSH refuses a whole v3 log holding a system/message it would not have written: data keys
# exactly {turn, step, message}, a message of exactly {id, role, source, content} with role
# "system" and a plugin source, and the released rules for its content and plugin source. The
# reader applies this before the torn-tail rule (a refused row is never a droppable tail), and
# append applies it so this harness never writes a row DSH cannot open.

_PLUGIN_FORMS: Final = ("instructions", "catalog", "snapshot", "notice", "relay", "recall")
_IMAGE_MEDIA: Final = ("image/png", "image/jpeg", "image/webp", "image/gif")


class _Shape(Exception):
    """Internal: the first rule a value breaks."""


def _exact_keys(
    value: Any, required: tuple[str, ...], optional: tuple[str, ...], label: str
) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _Shape(f"{label} must be an object")
    for key in required:
        if key not in value:
            raise _Shape(f"{label} lacks required field {key}")
    for key in value:
        if key not in required and key not in optional:
            raise _Shape(f"{label} has unexpected field {key}")
    return value


def _nonempty_str(value: Any, label: str) -> None:
    if not isinstance(value, str) or not value:
        raise _Shape(f"{label} must be a non-empty string")


def _count(value: Any, label: str, *, positive: bool = False) -> None:
    if not is_safe_int(value) or value < (1 if positive else 0):
        raise _Shape(f"{label} must be a {'positive' if positive else 'non-negative'} integer")


def _check_content_shape(blocks: Any, label: str) -> None:
    """DSH's released content rules: known block types are closed, any other is opaque."""
    if not isinstance(blocks, list | tuple):
        raise _Shape(f"{label} must be an array")
    for index, block in enumerate(blocks):
        where = f"{label}[{index}]"
        if not isinstance(block, Mapping):
            raise _Shape(f"{where} must be an object")
        kind = block.get("type")
        if kind in ("text", "reasoning"):
            _exact_keys(block, ("type", "text"), (), where)
            if not isinstance(block["text"], str):
                raise _Shape(f"{where} text must be a string")
        elif kind == "image":
            _exact_keys(block, ("type", "attachment"), (), where)
            attachment = _exact_keys(
                block["attachment"],
                ("attachmentId", "mediaType", "bytes", "width", "height"),
                ("name", "originalDimensions"),
                f"{where} attachment",
            )
            _nonempty_str(attachment["attachmentId"], f"{where} attachmentId")
            if attachment["mediaType"] not in _IMAGE_MEDIA:
                raise _Shape(f"{where} mediaType must be one of {', '.join(_IMAGE_MEDIA)}")
            _count(attachment["bytes"], f"{where} bytes")
            _count(attachment["width"], f"{where} width", positive=True)
            _count(attachment["height"], f"{where} height", positive=True)
        elif kind == "tool-call":
            _exact_keys(block, ("type", "id", "name", "arguments"), (), where)
            _nonempty_str(block["id"], f"{where} id")
            _nonempty_str(block["name"], f"{where} name")
            if not isinstance(block["arguments"], str):
                raise _Shape(f"{where} arguments must be a string")
        elif kind == "tool-result":
            _exact_keys(block, ("type", "toolCallId", "content"), ("isError",), where)
            _nonempty_str(block["toolCallId"], f"{where} toolCallId")
            _check_content_shape(block["content"], f"{where} content")
            if "isError" in block and not isinstance(block["isError"], bool):
                raise _Shape(f"{where} isError must be a boolean")
        else:
            _nonempty_str(kind, f"{where} type")


def _check_plugin_source(source: Mapping[str, Any], label: str) -> None:
    optional: tuple[str, ...] = ("form", "sections", "summary")
    if source.get("plugin") == "compact":
        optional += ("compactionId", "sourceCommandId")
    _exact_keys(source, ("kind", "plugin"), optional, label)
    _nonempty_str(source["plugin"], f"{label} plugin")
    if source["plugin"] == "compact":
        _nonempty_str(source.get("compactionId"), f"{label} compactionId")
    form = source.get("form")
    if form is None and "form" not in source:
        return
    if form not in _PLUGIN_FORMS:
        raise _Shape(f"{label} form must be one of {', '.join(_PLUGIN_FORMS)}")
    if form == "snapshot":
        sections = source.get("sections")
        if not isinstance(sections, list | tuple):
            raise _Shape(f"{label} sections must be an array")
        for index, section in enumerate(sections):
            item = _exact_keys(section, ("name", "text"), (), f"{label} sections[{index}]")
            _nonempty_str(item["name"], f"{label} sections[{index}] name")
            if not isinstance(item["text"], str):
                raise _Shape(f"{label} sections[{index}] text must be a string")
    elif "sections" in source:
        raise _Shape(f"{label} sections require snapshot form")
    if form == "notice":
        if not isinstance(source.get("summary"), str):
            raise _Shape(f"{label} summary must be a string")
    elif "summary" in source:
        raise _Shape(f"{label} summary requires notice form")


def system_message_problem(data: Any) -> str | None:
    """Why DSH v3 refuses this ``system/message`` data (plain JSON), or None when it admits it."""
    try:
        body = _exact_keys(data, ("turn", "step", "message"), (), "system/message data")
        _count(body["turn"], "system/message turn", positive=True)
        _count(body["step"], "system/message step", positive=True)
        message = _exact_keys(
            body["message"], ("id", "role", "source", "content"), (), "system message"
        )
        if not isinstance(message["id"], str) or not message["id"] or message["role"] != "system":
            raise _Shape("system message requires an id and system role")
        source = message["source"]
        if (
            not isinstance(source, Mapping)
            or source.get("kind") != "plugin"
            or not isinstance(source.get("plugin"), str)
            or not source.get("plugin")
        ):
            raise _Shape("system message requires plugin source")
        _check_content_shape(message["content"], "system message content")
        _check_plugin_source(source, "system message source")
    except _Shape as shape:
        return str(shape)
    return None


def _check_legacy(type: str, data: Any, subject: str) -> None:
    if type == "request/header-delta":
        raise InvalidSessionEventError(
            f"{subject} uses unsupported legacy request/header-delta format", event_type=type
        )
    if type == "request/header" and isinstance(data, Mapping) and data.get("reason") == "fallback":
        raise InvalidSessionEventError(
            f'{subject} uses unsupported legacy request/header reason "fallback"', event_type=type
        )
    if type == "request/header" and isinstance(data, Mapping):
        header = data.get("header")
        if isinstance(header, Mapping) and "system" in header:
            # A v3 reader refuses a log holding it, so it must not be written in the first place.
            raise InvalidSessionEventError(
                f"{subject} carries header.system, which DSH v3 retired: the system prompt is "
                "a system/message event (append one instead; the request header holds config, "
                "adapterDefaults and tools only)",
                event_type=type,
            )


def _refuse_system_message(plain: Any, subject: str) -> None:
    problem = system_message_problem(plain)
    if problem is not None:
        raise InvalidSessionEventError(
            f"{subject} is refused by DSH v3 (so this harness neither reads nor writes it): "
            f"{problem}",
            event_type="system/message",
        )


def coerce_event_data(
    type: str, data: Any, *, subject: str | None = None, ignorable: bool = False
) -> Any:
    """Validate ``data`` for ``type`` and return the immutable value the log stores.

    ``data`` may be the registered Struct or the equivalent plain JSON. The
    result is detached from the caller's object (later mutation of the input
    changes nothing) and deeply frozen. ``subject`` prefixes error messages
    (default ``session event "<type>"``).
    """
    spec = _REGISTRY.get(type)
    if spec is not None and spec.data_type is not None and builtins.type(data) is spec.data_type:
        fast = _coerce_typed_fast(type, data, spec.data_type)
        if fast is not None:
            return fast
    subject = subject if subject is not None else f'session event "{type}"'
    try:
        plain = to_json_builtins(data, f"{subject} data")
    except NonJsonValueError as exc:
        raise InvalidSessionEventError(
            f"{subject} carries non-JSON-serializable data: {exc.problem} at {exc.path}",
            event_type=type,
        ) from exc
    return _coerce_plain(type, plain, subject, ignorable)


# --- the typed fast path --------------------------------------------------------------------
#
# Appending a Struct of the registered type is the hot path (the loop does it for every
# event). msgspec's C encoder/decoder round trip validates every declared type and
# returns a fresh, tuple-based copy in ~2 us; what it cannot see is the lossless-JSON
# domain *inside* open values (FrozenJson fields, floats): it would write NaN as null
# and int keys as strings. So a check-only scan first visits exactly the fields whose
# declared type can hold such values (computed once per Struct type), and only those.
# Any doubt (a problem found, an exotic value, a lone surrogate) returns None and the
# caller takes the general path, which produces the precise error message.


class _Doubt(Exception):
    """Internal: the fast path declines; the general path decides (and explains)."""


_SCAN_PLAN: dict[builtins.type, tuple[str, ...]] = {}
_ROUND_TRIP: dict[builtins.type, msgspec.json.Decoder[Any]] = {}
#: Types whose values never need scanning: JSON-safe scalars and Structs with an empty plan.
_CLOSED: set[builtins.type] = {str, bool, builtins.type(None)}


def _type_needs_scan(info: msgspec.inspect.Type, seen: set[builtins.type]) -> bool:
    mi = msgspec.inspect
    if isinstance(info, mi.StrType | mi.BoolType | mi.LiteralType | mi.NoneType):
        return False
    if isinstance(info, mi.IntType):
        # Safe when the declared bounds (checked by the decoder) are within ±(2**53-1).
        low = info.ge if info.ge is not None else info.gt
        high = info.le if info.le is not None else info.lt
        return not (
            low is not None
            and high is not None
            and low >= -MAX_SAFE_INTEGER
            and high <= MAX_SAFE_INTEGER
        )
    if isinstance(info, mi.StructType):
        if info.cls in seen:
            return False
        seen.add(info.cls)
        return any(_type_needs_scan(f.type, seen) for f in info.fields)
    if isinstance(info, mi.VarTupleType | mi.ListType):
        return _type_needs_scan(info.item_type, seen)
    if isinstance(info, mi.UnionType):
        return any(_type_needs_scan(t, seen) for t in info.types)
    return True  # FloatType, CustomType (FrozenJson), AnyType, everything else


def _scan_plan(tp: builtins.type) -> tuple[str, ...]:
    plan = _SCAN_PLAN.get(tp)
    if plan is None:
        info = msgspec.inspect.type_info(tp)
        assert isinstance(info, msgspec.inspect.StructType)
        plan = tuple(f.name for f in info.fields if _type_needs_scan(f.type, {tp}))
        _SCAN_PLAN[tp] = plan
        if not plan:
            _CLOSED.add(tp)
    return plan


def _scan(value: Any) -> None:
    """Check-only visit of the parts of a typed payload the round trip cannot vouch for."""
    tp = builtins.type(value)
    plan = _SCAN_PLAN.get(tp)
    if plan is None:
        if isinstance(value, msgspec.Struct):
            plan = _scan_plan(tp)
        elif tp is tuple or tp is list:
            for item in value:
                if builtins.type(item) not in _CLOSED:
                    _scan(item)
            return
        else:
            try:
                check_json(value, "value")
            except NonJsonValueError as exc:
                raise _Doubt from exc
            return
    for attr in plan:
        item = getattr(value, attr)
        if item is not UNSET and builtins.type(item) not in _CLOSED:
            _scan(item)


def _coerce_typed_fast(type: str, data: Any, data_type: builtins.type) -> Any:
    """The validated frozen copy of a typed payload, or None when the general path must decide."""
    decoder = _ROUND_TRIP.get(data_type)
    if decoder is None:
        decoder = _ROUND_TRIP[data_type] = msgspec.json.Decoder(data_type, dec_hook=_dec_hook)
    try:
        _scan(data)
        result = decoder.decode(_ENCODER.encode(data))
    except (_Doubt, msgspec.ValidationError, msgspec.DecodeError, UnicodeEncodeError, TypeError):
        return None
    except NonJsonValueError:
        return None
    if type == "tool/result" and not _tool_result_consistent(result):
        return None
    if type == "request/header" and getattr(result.header, "system", UNSET) is not UNSET:
        return None  # retired in v3: the general path refuses it with its message
    if type == "system/message" and system_message_problem(
        msgspec.to_builtins(result, enc_hook=_enc_hook)
    ):
        return None  # the general path refuses it with its message
    return result


def _tool_result_consistent(data: Any) -> bool:
    message = getattr(data, "message", None)
    if not isinstance(message, ToolResultMessage) or len(message.content) != 1:
        return False
    block = message.content[0]
    return isinstance(block, ToolResultBlock) and block.tool_call_id == message.source.call_id


def _coerce_plain(type: str, plain: Any, subject: str, ignorable: bool) -> Any:
    """Coerce already validated plain JSON (fresh, owned) into the stored value."""
    _check_legacy(type, plain, subject)
    spec = _REGISTRY.get(type)
    if spec is None:
        if not ignorable:
            raise UnknownEventTypeError(
                f'{subject}: event type "{type}" is unknown to this harness and not marked '
                "ignorable; register it with register_event_type() (or mark the event "
                "ignorable: true if readers may keep it without understanding it)",
                event_type=type,
            )
        return freeze_json(plain, f"{subject} data")
    if spec.data_type is None:
        return freeze_json(plain, f"{subject} data")
    if type in _MESSAGE_ROLES:
        _check_message_shape(type, plain, subject)
    if type == "system/message":
        _refuse_system_message(plain, subject)
    try:
        return msgspec.convert(plain, spec.data_type, dec_hook=_dec_hook)
    except msgspec.ValidationError as exc:
        raise InvalidSessionEventError(
            f"{subject} data does not match {spec.data_type.__qualname__}: {exc}",
            event_type=type,
        ) from exc

"""Lossless JSON: the value domain every session event, header and surface marker lives in.

Why a dedicated check: the log is the single source of truth and is replayed by
re-deriving from the same bytes, so a value that JSON cannot carry exactly (NaN,
infinities, ``-0.0``, integers a JavaScript reader would round, non-string keys,
sets, dates, arbitrary objects) must be refused *at the append site*, where the
caller can still fix it, instead of being silently rewritten by an encoder
(msgspec writes NaN as ``null``; ``json`` writes ``-0.0`` back as ``-0.0`` but
DSH's writer would write ``0``).

Accepted: ``None``, ``bool``, ``str``, safe integers (|n| <= 2**53 - 1), finite
floats other than ``-0.0``, lists/tuples, and mappings (``dict`` /
``MappingProxyType``) with ``str`` keys. msgspec Structs are accepted as
mappings of their encoded (camelCase) field names, with ``UNSET`` fields left
out and the tag field of tagged Structs included, so a typed payload and the
equivalent plain mapping are the same JSON value.

Traversal is iterative (a 20,000-deep nesting is fine) and tracks ancestors
only, so shared sub-values that are not cycles are accepted and copied once per
occurrence.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final

import msgspec

from dsh_host.errors import DshError

__all__ = [
    "MAX_SAFE_INTEGER",
    "FrozenJson",
    "NonJsonValueError",
    "check_json",
    "freeze_json",
    "is_safe_int",
    "js_number",
    "json_dec_hook",
    "json_enc_hook",
    "may_hold_unsafe_int",
    "parse_js_float",
    "thaw_json",
    "to_json_builtins",
]

#: The largest integer every JSON reader (including JavaScript's) represents exactly.
MAX_SAFE_INTEGER: Final = 2**53 - 1


def js_number(value: float) -> str:
    """A number as JavaScript's ``JSON.stringify`` writes it (``500``, not ``500.0``).

    The one copy: model-visible texts that quote a number (a retry policy, a
    bash timeout marker) read the same as DSH's.
    """
    if isinstance(value, int):
        return str(value)
    number = float(value)
    return str(int(number)) if number.is_integer() else repr(number)


class NonJsonValueError(DshError, ValueError):
    """A value is not losslessly JSON-serializable.

    ``where`` says what was being checked (e.g. ``session event "tool/result" data``),
    ``path`` is the key path inside it (``$.message.content[0]``).
    """

    code = "NON_JSON_VALUE"

    def __init__(self, where: str, path: str, problem: str) -> None:
        self.where = where
        self.path = path
        self.problem = problem
        super().__init__(
            f"{where} is not losslessly JSON-serializable: {problem} at {path}; "
            "use only null, booleans, strings, safe integers, finite numbers other than -0, "
            "lists and string-keyed mappings"
        )


def parse_js_float(text: str) -> Any:
    """A JSON float token read as JavaScript's ``JSON.parse`` would hand it over: an integral
    value is an int (``2.0`` → ``2``); one overflowing a double is refused (``ValueError``).

    The float hook of every stored-log reader (one definition, so two readers of a line agree).
    """
    number = float(text)
    if number in (float("inf"), float("-inf")):
        raise ValueError(f"number {text} overflows a double")
    if number.is_integer() and abs(number) <= MAX_SAFE_INTEGER:
        return int(number)
    return number


#: Every digit byte mapped to ``0``, every other byte to a space (see may_hold_unsafe_int).
_DIGITS_AS_ZERO: Final = bytes(0x30 if 0x30 <= b <= 0x39 else 0x20 for b in range(256))
_LONG_DIGITS: Final = b"0" * 16


def may_hold_unsafe_int(text: bytes) -> bool:
    """True when JSON ``text`` has a run of sixteen digits: the shortest text of an integer
    outside ±(2**53-1) (and of many inside, or of digits in a string). Text without one holds
    only safe integers, so a reader may vouch for it (``parsed_plain``, ``decode_event_line``).
    ``bytes.translate`` + ``in``: ~7x faster than a regex search."""
    return _LONG_DIGITS in text.translate(_DIGITS_AS_ZERO)


def is_safe_int(value: object) -> bool:
    """True for an ``int`` (not ``bool``) within JavaScript's safe-integer range."""
    return type(value) is int and -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER


_STRUCT_KEYS: dict[type, tuple[tuple[str, str], ...]] = {}


def _struct_keys(tp: type) -> tuple[tuple[str, str], ...]:
    """(attribute, encoded name) pairs of a Struct type, cached per type."""
    keys = _STRUCT_KEYS.get(tp)
    if keys is None:
        names: tuple[str, ...] = tp.__struct_fields__  # type: ignore[attr-defined]
        encoded: tuple[str, ...] = tp.__struct_encode_fields__  # type: ignore[attr-defined]
        keys = tuple(zip(names, encoded, strict=True))
        _STRUCT_KEYS[tp] = keys
    return keys


def _describe(value: object) -> str:
    return f"a value of type {type(value).__qualname__}"


def _scalar_problem(value: object) -> str | None:
    """None when ``value`` is an acceptable JSON scalar, else a description of the problem."""
    tp = type(value)
    if tp is str or tp is bool or value is None:
        return None
    if tp is int:
        if -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:  # type: ignore[operator]
            return None
        return f"integer {value} outside the safe range ±(2**53-1)"
    if tp is float:
        if math.isnan(value) or math.isinf(value):  # type: ignore[arg-type]
            return f"non-finite number {value!r}"
        if value == 0.0 and math.copysign(1.0, value) < 0:
            return "negative zero (-0.0)"
        return None
    return _describe(value)


def _walk(value: Any, where: str, build: bool, freeze: bool) -> Any:
    """Validate ``value``; when ``build``, also return a copy (frozen when ``freeze``).

    One pass reads every property once, so the value stored is exactly the value
    validated. Containers are processed with an explicit stack (no recursion
    limit); ``ancestors`` holds the ids of the containers on the current path.
    """
    root_box: list[Any] = [None]
    # Stack frames: (value, path, parent container, key in parent, leaving?)
    ancestors: set[int] = set()
    stack: list[tuple[Any, str, Any, Any, bool]] = [(value, "$", root_box, 0, False)]
    while stack:
        node, path, parent, key, leaving = stack.pop()
        if leaving:
            ancestors.discard(id(node))
            if build and freeze:
                # Freeze the finished copy in place of the mutable builder.
                built = parent[key]
                parent[key] = tuple(built) if type(built) is list else MappingProxyType(built)
            continue
        ntp = type(node)
        if ntp is str or ntp is bool or node is None or ntp is int or ntp is float:
            problem = _scalar_problem(node)
            if problem is not None:
                raise NonJsonValueError(where, path, problem)
            if build:
                parent[key] = _normalize_number(node) if ntp is float else node
            continue
        items: Any
        is_list: bool
        if ntp is list or ntp is tuple:
            items = node
            is_list = True
        elif ntp is dict or ntp is MappingProxyType:
            items = node
            is_list = False
        elif isinstance(node, msgspec.Struct):
            items = _struct_items(node)
            is_list = False
        elif isinstance(node, Mapping):
            items = node
            is_list = False
        else:
            raise NonJsonValueError(where, path, _describe(node))
        nid = id(node)
        if nid in ancestors:
            raise NonJsonValueError(where, path, "a cycle (a container that contains itself)")
        ancestors.add(nid)
        stack.append((node, path, parent, key, True))
        if is_list:
            copy_list: list[Any] | None = [None] * len(items) if build else None
            if build:
                parent[key] = copy_list
            # Push in reverse so children are visited in order (stable error paths).
            for index in range(len(items) - 1, -1, -1):
                stack.append((items[index], f"{path}[{index}]", copy_list, index, False))
        else:
            copy_dict: dict[str, Any] | None = {} if build else None
            if build:
                parent[key] = copy_dict
            pending: list[tuple[Any, str, Any, Any, bool]] = []
            for k, v in items.items():
                if type(k) is not str:
                    raise NonJsonValueError(where, f"{path}", f"non-string key {k!r}")
                if build:
                    copy_dict[k] = None  # type: ignore[index]  # reserve insertion order
                pending.append((v, f"{path}.{k}", copy_dict, k, False))
            stack.extend(reversed(pending))
    return root_box[0] if build else None


def _struct_items(node: msgspec.Struct) -> dict[str, Any]:
    """A Struct as the mapping it encodes to (tag first, UNSET fields omitted)."""
    out: dict[str, Any] = {}
    config = node.__struct_config__
    if config.tag_field is not None:
        out[config.tag_field] = config.tag
    for attr, name in _struct_keys(type(node)):
        v = getattr(node, attr)
        if v is not msgspec.UNSET:
            out[name] = v
    return out


def _normalize_number(value: Any) -> Any:
    """Integral floats become ints, as a JavaScript writer would print them (``1.0`` → ``1``)."""
    if type(value) is float and value.is_integer() and abs(value) <= MAX_SAFE_INTEGER:
        return int(value)
    return value


def check_json(value: object, where: str) -> None:
    """Raise :class:`NonJsonValueError` unless ``value`` is lossless JSON.

    ``where`` names what is being checked; the error adds the key path.
    """
    try:
        _fast_check(value, 0)
    except _SlowPath:
        _walk(value, where, build=False, freeze=False)


def _fast_check(v: Any, depth: int) -> None:
    """Check-only twin of :func:`_fast_plain` (raises :class:`_SlowPath` on any doubt)."""
    tp = type(v)
    if tp is str or tp is bool or v is None:
        return
    if tp is int:
        if -MAX_SAFE_INTEGER <= v <= MAX_SAFE_INTEGER:
            return
        raise _SlowPath
    if depth > _FAST_DEPTH:
        raise _SlowPath
    if tp is dict or tp is MappingProxyType:
        for k, x in v.items():
            if type(k) is not str:
                raise _SlowPath
            _fast_check(x, depth + 1)
        return
    if tp is list or tp is tuple:
        for x in v:
            _fast_check(x, depth + 1)
        return
    if tp is float:
        if _scalar_problem(v) is not None:
            raise _SlowPath
        return
    if isinstance(v, msgspec.Struct):
        for attr, _name in _STRUCT_KEYS.get(tp) or _struct_keys(tp):
            x = getattr(v, attr)
            if x is not _UNSET:
                _fast_check(x, depth + 1)
        return
    raise _SlowPath


def _fast_frozen(v: Any, depth: int) -> Any:
    """Recursive validate-and-freeze for plain JSON values (raises :class:`_SlowPath`)."""
    tp = type(v)
    if tp is str or tp is bool or v is None:
        return v
    if tp is int:
        if -MAX_SAFE_INTEGER <= v <= MAX_SAFE_INTEGER:
            return v
        raise _SlowPath
    if depth > _FAST_DEPTH:
        raise _SlowPath
    if tp is dict or tp is MappingProxyType:
        out: dict[str, Any] = {}
        for k, x in v.items():
            if type(k) is not str:
                raise _SlowPath
            out[k] = _fast_frozen(x, depth + 1)
        return MappingProxyType(out)
    if tp is list or tp is tuple:
        return tuple([_fast_frozen(x, depth + 1) for x in v])
    if tp is float:
        if _scalar_problem(v) is not None:
            raise _SlowPath
        return _normalize_number(v)
    raise _SlowPath


def to_json_builtins(value: object, where: str) -> Any:
    """Validate and return a detached plain copy (``dict`` / ``list`` / scalars).

    Structs become mappings of their wire names; integral floats become ints.
    """
    try:
        return _fast_plain(value, 0)
    except _SlowPath:
        # Anything unusual (an error to report with its path, a cycle, deep nesting,
        # an exotic Mapping) is redone by the iterative walker, which explains itself.
        return _walk(value, where, build=True, freeze=False)


class _SlowPath(Exception):
    """Internal: the recursive fast path gives up; the iterative walker takes over."""


_FAST_DEPTH: Final = 200
_UNSET = msgspec.UNSET


def _fast_plain(v: Any, depth: int) -> Any:
    """Recursive validate-and-copy for the common case (shallow, valid data).

    The hot path of every ``Session.append``: recursion with no per-node
    bookkeeping is several times faster than the general walker. It handles only
    valid, shallow values and raises :class:`_SlowPath` for everything else.
    """
    tp = type(v)
    if tp is str or tp is bool or v is None:
        return v
    if tp is int:
        if -MAX_SAFE_INTEGER <= v <= MAX_SAFE_INTEGER:
            return v
        raise _SlowPath
    if depth > _FAST_DEPTH:
        raise _SlowPath
    if tp is dict or tp is MappingProxyType:
        out: dict[str, Any] = {}
        for k, x in v.items():
            if type(k) is not str:
                raise _SlowPath
            out[k] = _fast_plain(x, depth + 1)
        return out
    if tp is list or tp is tuple:
        return [_fast_plain(x, depth + 1) for x in v]
    if tp is float:
        if _scalar_problem(v) is not None:
            raise _SlowPath
        return _normalize_number(v)
    if isinstance(v, msgspec.Struct):
        res: dict[str, Any] = {}
        config = v.__struct_config__
        if config.tag_field is not None:
            res[config.tag_field] = config.tag
        for attr, name in _STRUCT_KEYS.get(tp) or _struct_keys(tp):
            x = getattr(v, attr)
            if x is not _UNSET:
                res[name] = _fast_plain(x, depth + 1)
        return res
    raise _SlowPath


def freeze_json(value: object, where: str = "value") -> Any:
    """Validate and return an immutable deep copy (``MappingProxyType`` / ``tuple`` / scalars)."""
    try:
        return _fast_frozen(value, 0)
    except _SlowPath:
        return _walk(value, where, build=True, freeze=True)


def thaw_json(value: Any) -> Any:
    """A mutable plain copy of a frozen JSON value (for callers that must edit a copy)."""
    return msgspec.json.decode(msgspec.json.encode(value, enc_hook=json_enc_hook))


def json_enc_hook(value: Any) -> Any:
    """msgspec ``enc_hook``: encode the frozen containers this module produces."""
    if isinstance(value, MappingProxyType):
        return dict(value)
    raise NotImplementedError(f"cannot encode {_describe(value)} as JSON")


if TYPE_CHECKING:
    #: A frozen JSON value (scalar, tuple, or MappingProxyType). For type checkers it is Any.
    FrozenJson = Any
else:

    class _AnyJsonMeta(type):
        """Makes every value an instance, so msgspec accepts what ``json_dec_hook`` returns."""

        def __instancecheck__(cls, instance: object) -> bool:
            return True

    class FrozenJson(metaclass=_AnyJsonMeta):
        """Annotation for an open JSON field of a Struct (``meta``, ``attachment``, ...).

        msgspec does not know this type, so it hands the decoded value to
        :func:`json_dec_hook`, which freezes it. That keeps events deeply
        immutable without walking every typed field after decoding.
        """


def json_dec_hook(tp: type, obj: Any) -> Any:
    """msgspec ``dec_hook``: freeze open JSON fields annotated as :data:`FrozenJson`.

    An annotation class may define ``__json_decode__(obj)`` (a static method) to
    decode an open union itself (e.g. content blocks whose unknown kinds stay
    opaque); this hook calls it.
    """
    if tp is FrozenJson:
        return freeze_json(obj)
    decode = getattr(tp, "__json_decode__", None)
    if decode is not None:
        return decode(obj)
    raise NotImplementedError(f"cannot decode into {tp!r}")

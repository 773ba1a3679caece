"""Lossless JSON: what check_json refuses, what freeze_json returns."""

from __future__ import annotations

import datetime
import decimal
from types import MappingProxyType
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsh_host._jsonsafe import (
    MAX_SAFE_INTEGER,
    NonJsonValueError,
    _fast_check,
    _fast_frozen,
    _fast_plain,
    _SlowPath,
    _walk,
    check_json,
    freeze_json,
    thaw_json,
    to_json_builtins,
)
from dsh_host._session import TextBlock, UserMessage, UserSource
from dsh_host.errors import DshError


@pytest.mark.parametrize(
    ("value", "problem", "path"),
    [
        (float("nan"), "non-finite", "$"),
        ({"a": [1, float("inf")]}, "non-finite", "$.a[1]"),
        ({"a": float("-inf")}, "non-finite", "$.a"),
        ({"x": -0.0}, "negative zero", "$.x"),
        ({1: "a"}, "non-string key 1", "$"),
        ({"a": {1, 2}}, "set", "$.a"),
        ({"a": b"bytes"}, "bytes", "$.a"),
        ({"when": datetime.date(2026, 1, 1)}, "date", "$.when"),
        ({"d": decimal.Decimal("1.5")}, "Decimal", "$.d"),
        ({"n": MAX_SAFE_INTEGER + 1}, "outside the safe range", "$.n"),
        ({"n": -(MAX_SAFE_INTEGER + 1)}, "outside the safe range", "$.n"),
        ([object()], "object", "$[0]"),
        ({"f": print}, "builtin_function_or_method", "$.f"),
    ],
)
def test_check_json_rejects_lossy_values_naming_where_and_path(
    value: Any, problem: str, path: str
) -> None:
    with pytest.raises(NonJsonValueError) as info:
        check_json(value, "the payload")
    message = str(info.value)
    assert message.startswith("the payload is not losslessly JSON-serializable")
    assert problem in message
    assert info.value.path == path
    assert isinstance(info.value, DshError)
    with pytest.raises(NonJsonValueError):
        freeze_json(value)


def test_cycle_is_rejected_but_shared_subvalues_are_accepted() -> None:
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    with pytest.raises(NonJsonValueError, match="cycle"):
        check_json(cyclic, "v")
    shared = {"k": [1, 2]}
    frozen = freeze_json({"a": shared, "b": shared})
    assert thaw_json(frozen) == {"a": {"k": [1, 2]}, "b": {"k": [1, 2]}}


def test_deep_nesting_has_no_recursion_limit() -> None:
    root: list[Any] = []
    node = root
    for _ in range(20_000):
        child: list[Any] = []
        node.append(child)
        node = child
    check_json(root, "deep")
    frozen = freeze_json(root)
    depth = 0
    while frozen:
        frozen = frozen[0]
        depth += 1
    assert depth == 20_000


def test_freeze_json_is_immutable_detached_and_normalizes_integral_floats() -> None:
    source: dict[str, Any] = {"a": [1, 2.0, {"b": 2.5}], "c": None, "d": True}
    frozen = freeze_json(source)
    assert isinstance(frozen, MappingProxyType)
    assert frozen["a"] == (1, 2, MappingProxyType({"b": 2.5}))
    assert type(frozen["a"][1]) is int  # 2.0 is written 2, as a JS writer would
    with pytest.raises(TypeError):
        frozen["x"] = 1  # type: ignore[index]
    source["a"].append(3)
    assert len(frozen["a"]) == 3
    assert thaw_json(frozen) == {"a": [1, 2, {"b": 2.5}], "c": None, "d": True}


def test_structs_are_json_values_with_their_wire_names() -> None:
    message = UserMessage(id="u", content=(TextBlock(text="x"),), source=UserSource())
    assert to_json_builtins(message, "m") == {
        "id": "u",
        "role": "user",
        "content": [{"type": "text", "text": "x"}],
        "source": {"kind": "user"},
    }


def test_bool_is_not_confused_with_int() -> None:
    assert freeze_json([True, 1]) == (True, 1)
    assert type(freeze_json(True)) is bool


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-MAX_SAFE_INTEGER, MAX_SAFE_INTEGER)
    | st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: f != 0 or str(f) == "0.0")
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4)
    ),
    max_leaves=20,
)


@given(json_values)
def test_property_freeze_round_trips_through_json(value: Any) -> None:
    frozen = freeze_json(value)
    text = msgspec.json.encode(thaw_json(frozen))
    assert msgspec.json.decode(text) == thaw_json(frozen)
    assert thaw_json(frozen) == msgspec.json.decode(msgspec.json.encode(value))


# --------------------------------------------------------------------------- fast = slow
#
# check_json, to_json_builtins and freeze_json each try a recursive fast path first and fall
# back to the iterative walker on any doubt. The fast paths must never decide differently:
# whatever a fast path returns is exactly what the walker returns (same types, same key
# order), and whatever the walker refuses the fast path hands over (raises _SlowPath).


class _Point(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    x_value: Any
    y_value: Any = msgspec.UNSET


class _Tagged(msgspec.Struct, frozen=True, tag="pt", tag_field="kind"):
    value: Any


_valid_leaves = (
    st.none()
    | st.booleans()
    | st.integers(-(2**53) + 1, 2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: f != 0 or f.hex()[0] != "-")
    | st.sampled_from([1.0, 0.0, 2.0**53 - 1, 1e300, 5e-324])
    | st.text()
)
_flawed_leaves = (
    st.integers().filter(lambda n: abs(n) > 2**53 - 1)
    | st.sampled_from([2**53, -(2**53), float("nan"), float("inf"), float("-inf"), -0.0])
    | st.text(st.characters(min_codepoint=0xD7F0, max_codepoint=0xE010, exclude_categories=()))
    | st.sampled_from([b"bytes", {1, 2}, frozenset(), decimal.Decimal("1.5"), object()])
)
#: mostly valid, so values get deep into the fast paths before a flaw (if any) is met
_leaves = st.one_of(_valid_leaves, _valid_leaves, _valid_leaves, _flawed_leaves)


def _containers(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    odd_keys = st.integers(0, 3) | st.sampled_from([None, (1,), 1.5])
    return st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=4).map(tuple),
        st.dictionaries(st.text(max_size=3), inner, max_size=4),
        st.dictionaries(st.text(max_size=3) | odd_keys, inner, max_size=3),
        st.dictionaries(st.text(max_size=3), inner, max_size=3).map(MappingProxyType),
        st.builds(_Point, x_value=inner, y_value=inner | st.just(msgspec.UNSET)),
        st.builds(_Tagged, inner),
    )


_wild = st.recursive(_leaves, _containers, max_leaves=16)
#: deeper than the fast paths' recursion limit, so the walker takes over part-way
def _nest(value: Any, depth: int) -> Any:
    for _ in range(depth):
        value = [value]
    return value


_deep = st.builds(_nest, _wild, st.integers(195, 210))


def _same(a: Any, b: Any) -> bool:
    """Equal, with the same types all the way down and the same key order."""
    if type(a) is not type(b):
        return False
    if type(a) in (dict, MappingProxyType):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if type(a) in (list, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b) or (a != a and b != b)


def _slow(value: Any, build: bool, freeze: bool) -> tuple[str, Any]:
    try:
        return "ok", _walk(value, "value", build=build, freeze=freeze)
    except NonJsonValueError as exc:
        return "refused", str(exc)


@settings(max_examples=400)
@given(_wild | _deep)
def test_every_fast_path_decides_as_the_walker_does(value: Any) -> None:
    for fast, build, freeze, public in (
        (_fast_check, False, False, lambda v: check_json(v, "value")),
        (_fast_plain, True, False, lambda v: to_json_builtins(v, "value")),
        (_fast_frozen, True, True, lambda v: freeze_json(v, "value")),
    ):
        verdict, expected = _slow(value, build, freeze)
        try:
            got = fast(value, 0)
        except _SlowPath:
            pass
        else:
            assert verdict == "ok", (fast.__name__, "accepted what the walker refuses", expected)
            assert _same(got, expected), (fast.__name__, got, expected)
        # and the public function gives the walker's outcome, error text included
        if verdict == "ok":
            assert _same(public(value), expected)
        else:
            with pytest.raises(NonJsonValueError) as info:
                public(value)
            assert str(info.value) == expected

"""Lossless JSON: what check_json refuses, what freeze_json returns."""

from __future__ import annotations

import datetime
import decimal
from types import MappingProxyType
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsh_host.errors import DshError
from dsh_host.jsonsafe import (
    MAX_SAFE_INTEGER,
    NonJsonValueError,
    check_json,
    freeze_json,
    thaw_json,
    to_json_builtins,
)
from dsh_host.session import TextBlock, UserMessage, UserSource


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

"""``@tool`` schemas: one golden JSON per supported type, and a clear refusal for the rest.

The golden file (``schemas.golden.json``) is what the model is shown; every schema in it must
also be accepted by the runtime's own subset check, so nothing shown goes unenforced.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import json
import uuid
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, TypedDict

import msgspec
import pytest

from dsh_host import ToolContext, tool
from dsh_host._tools import ToolRegistrationError, check_object_schema

GOLDEN = Path(__file__).with_name("schemas.golden.json")


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Point(msgspec.Struct):
    """A point on the plane."""

    x: int
    y: float = 0.0


@dataclasses.dataclass
class Person:
    name: str
    tags: list[str] = dataclasses.field(default_factory=list)


class Order(TypedDict):
    sku: str
    qty: int


class Shape(msgspec.Struct):
    points: list[Point]
    color: Color | None = None


TYPES: dict[str, Any] = {
    "int": int,
    "float": float,
    "str": str,
    "bool": bool,
    "none": None,
    "literal_str": Literal["asc", "desc"],
    "literal_int": Literal[1, 2, 3],
    "enum": Color,
    "int_enum": Level,
    "optional": Optional[int],  # noqa: UP045 - the spelling under test
    "union_none": str | None,
    "list": list[int],
    "list_untyped": list,
    "dict_untyped": dict,
    "any": Any,
    "struct": Point,
    "dataclass": Person,
    "typed_dict": Order,
    "nested": Shape,
    "optional_struct": Point | None,
    "annotated": Annotated[str, msgspec.Meta(description="the city")],
}


def schema_of(hint: Any) -> dict[str, Any]:
    def value(v):  # type: ignore[no-untyped-def]
        return v

    value.__annotations__ = {"v": hint, "return": None}
    schema = tool(value).definition.parameters
    check_object_schema(schema)
    return dict(schema["properties"]["v"])


def test_every_supported_type_matches_its_golden_schema() -> None:
    golden = json.loads(GOLDEN.read_text())
    produced = {name: schema_of(hint) for name, hint in TYPES.items()}
    assert produced == golden


def test_function_schema_docstring_defaults_and_context() -> None:
    @tool(name="lookup", concurrency_safe=True, timeout_s=30)
    def weather(
        ctx: ToolContext,
        city: str,
        units: Literal["c", "f"] = "c",
        days: Annotated[int, msgspec.Meta(description="how many days ahead")] = 1,
    ) -> dict[str, Any]:
        """Look up the weather.

        A second paragraph of the summary.

        Args:
            city: the city to look up,
                spelled as locals do.
            units (str): temperature units.
            days: ignored here: Annotated wins.

        Returns:
            the forecast.
        """
        return {}

    definition = weather.definition
    assert definition.name == "lookup"
    assert definition.description == "Look up the weather.\n\nA second paragraph of the summary."
    assert definition.timeout_ms == 30_000
    assert definition.is_concurrency_safe is not None and definition.is_concurrency_safe({})
    assert definition.parameters == {
        "type": "object",
        "properties": {
            "city": {"description": "the city to look up, spelled as locals do.", "type": "string"},
            "units": {
                "description": "temperature units.",
                "type": "string",
                "enum": ["c", "f"],
                "default": "c",
            },
            "days": {"description": "how many days ahead", "type": "integer", "default": 1},
        },
        "required": ["city"],
        "additionalProperties": False,
    }
    assert weather(None, "Oslo") == {}  # still the function


def test_plain_decorator_has_no_timeout_and_is_not_concurrency_safe() -> None:
    @tool
    async def ping() -> str:
        """Ping."""
        return "pong"

    assert ping.name == "ping"
    assert ping.definition.timeout_ms is None
    assert ping.definition.is_concurrency_safe is None
    assert ping.definition.parameters == {
        "type": "object",
        "properties": {},
        "additionalProperties": False,
    }


class Event(msgspec.Struct):
    when: datetime.datetime


class Tree(msgspec.Struct):
    children: list[Tree]


REFUSED: list[tuple[str, Any, str]] = [
    ("minimum", Annotated[int, msgspec.Meta(ge=0)], '"minimum" cannot be enforced'),
    ("pattern", Annotated[str, msgspec.Meta(pattern="^a")], '"pattern" cannot be enforced'),
    ("max_length", Annotated[str, msgspec.Meta(max_length=3)], '"maxLength" cannot be enforced'),
    ("datetime", datetime.datetime, "DateTime values travel as strings"),
    ("date", datetime.date, "Date values travel as strings"),
    ("uuid", uuid.UUID, "UUID values travel as strings"),
    ("bytes", bytes, "Bytes values travel as strings"),
    ("nested_datetime", list[Event], "DateTime values travel as strings"),
    ("dict_of", dict[str, int], "dict[str, X] cannot be enforced"),
    ("tuple", tuple[int, int], "use a list, a Struct or a dataclass instead of a tuple"),
    ("set", set[int], '"uniqueItems" cannot be enforced'),
    ("overlap", int | float, "a union whose members can match the same value"),
    ("two_objects", Point | Person, "may not contain more than one dict-like type"),
    ("mixed_literal", Literal["a", 1], "enum / Literal values must all be"),
    ("recursive", Tree, "type Tree contains itself"),
    ("object", object, "has a type msgspec cannot describe as JSON"),
]


@pytest.mark.parametrize(("label", "hint", "needle"), REFUSED, ids=[r[0] for r in REFUSED])
def test_unenforceable_types_are_refused_at_decoration(label: str, hint: Any, needle: str) -> None:
    def bad(v):  # type: ignore[no-untyped-def]
        return v

    bad.__annotations__ = {"v": hint, "return": None}
    with pytest.raises(ToolRegistrationError) as info:
        tool(bad)
    message = str(info.value)
    assert message.startswith('@tool test_unenforceable_types_are_refused_at_decoration.<locals>.bad: ')
    assert 'parameter "v"' in message
    assert needle in message


def test_signature_problems_are_refused_naming_the_parameter() -> None:
    def untyped(a, b: int) -> int:  # type: ignore[no-untyped-def]
        return b

    with pytest.raises(ToolRegistrationError, match='parameter "a" has no type annotation'):
        tool(untyped)

    def variadic(*args: int) -> int:
        return 0

    with pytest.raises(ToolRegistrationError, match=r'parameter "args": \*args, \*\*kwargs'):
        tool(variadic)

    def two_contexts(a: ToolContext, b: ToolContext) -> None:
        return None

    with pytest.raises(ToolRegistrationError, match="only one ToolContext parameter"):
        tool(two_contexts)


def test_options_are_checked() -> None:
    def f() -> None:
        return None

    with pytest.raises(ToolRegistrationError, match="tool name 'has space' must be 1-64"):
        tool(name="has space")(f)
    with pytest.raises(ToolRegistrationError, match='approval must be "ask" or None'):
        tool(approval="always")(f)  # type: ignore[call-overload]  # the bad input under test
    with pytest.raises(ToolRegistrationError, match="timeout_s must be a positive number"):
        tool(timeout_s=0)(f)
    assert tool(approval="ask")(f).approval == "ask"

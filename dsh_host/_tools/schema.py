"""The JSON Schema subset tools declare for their arguments and their output value.

Why a subset instead of a full validator: the schema is what the model is shown
*and* what the runtime enforces, so every keyword must mean the same thing on
both sides. A keyword the runtime does not enforce (``pattern``, ``minimum``...)
would be a promise the model trusts and nobody keeps. DSH restricts itself to
this subset for the same reason, and the violation texts below are DSH's, so
the model reads the same ``invalid arguments: missing required property "path"``
under either harness.

Supported keywords: one scalar ``type`` (``object | array | string | number |
integer | boolean | null``), object ``properties`` / ``required`` / boolean
``additionalProperties``, array ``items``, type-correct scalar ``enum`` /
``const``, exact-one ``oneOf``, and the annotations ``description``,
``title``, ``default``, ``examples``. A node with none of ``type`` / ``oneOf``
accepts any JSON value.

Two entry points: :func:`check_schema` refuses a schema outside the subset at
registration; :func:`validate` returns the violations of one value (empty when
it conforms).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any, Final

from dsh_host._jsonsafe import check_json, is_safe_int

from .errors import UnsupportedSchemaError

__all__ = ["SCHEMA_TYPES", "check_object_schema", "check_schema", "validate"]

SCHEMA_TYPES: Final = ("object", "array", "string", "number", "integer", "boolean", "null")
_ANNOTATIONS: Final = frozenset({"description", "title", "default", "examples", "$schema"})
_TYPE_KEYWORDS: Final = {
    "object": frozenset({"properties", "required", "additionalProperties"}),
    "array": frozenset({"items"}),
    "string": frozenset({"enum", "const"}),
    "number": frozenset({"enum", "const"}),
    "integer": frozenset({"enum", "const"}),
    "boolean": frozenset({"enum", "const"}),
    "null": frozenset({"enum", "const"}),
}
_ALL_KEYWORDS: Final = frozenset({"type", "oneOf"}).union(*_TYPE_KEYWORDS.values())


def _is_number(value: object) -> bool:
    return (type(value) is int and is_safe_int(value)) or (
        type(value) is float and math.isfinite(value)
    )


def _matches_type(schema_type: str, value: object) -> bool:
    if schema_type == "string":
        return isinstance(value, str)
    if schema_type == "boolean":
        return isinstance(value, bool)
    if schema_type == "null":
        return value is None
    if schema_type == "number":
        return _is_number(value)
    if schema_type == "integer":
        return _is_integer(value)
    return False


def _is_integer(value: object) -> bool:
    if type(value) is int:
        return is_safe_int(value)
    return type(value) is float and math.isfinite(value) and value.is_integer()


def check_schema(schema: object, where: str = "schema") -> None:
    """Raise :class:`UnsupportedSchemaError` unless ``schema`` is in the enforced subset."""
    violations: list[str] = []
    _check_node(schema, where, violations, set())
    if violations:
        raise UnsupportedSchemaError(violations)


def check_object_schema(schema: object, where: str = "schema") -> None:
    """:func:`check_schema` plus an object root (tool parameters are always an object)."""
    violations: list[str] = []
    _check_node(schema, where, violations, set())
    if not violations and not (isinstance(schema, Mapping) and schema.get("type") == "object"):
        violations.append(f'{where}.type must be "object" (tool parameters are object-rooted)')
    if violations:
        raise UnsupportedSchemaError(violations)


def _check_node(node: object, path: str, violations: list[str], active: set[int]) -> None:
    if not isinstance(node, Mapping):
        violations.append(f"{path} must be a schema object")
        return
    if id(node) in active:
        violations.append(f"{path} is circular")
        return
    active.add(id(node))
    try:
        _check_keywords(node, path, violations, active)
    finally:
        active.discard(id(node))


def _check_keywords(
    node: Mapping[Any, Any], path: str, violations: list[str], active: set[int]
) -> None:
    for key in node:
        if key in _ANNOTATIONS:
            try:
                check_json(node[key], f"{path}.{key}")
            except ValueError:
                violations.append(f"{path}.{key} annotation must be lossless JSON data")
            continue
        if key not in _ALL_KEYWORDS:
            violations.append(
                f"{path}.{key} is not a supported keyword (subset: type/oneOf/properties/"
                "required/additionalProperties/items/enum/const + annotations)"
            )
    for key in ("description", "title"):
        if key in node and not isinstance(node[key], str):
            violations.append(f"{path}.{key} must be a string")
    has_type = "type" in node
    if has_type and "oneOf" in node:
        violations.append(f"{path} cannot declare both type and oneOf")
        return
    if "oneOf" in node:
        for key in node:
            if key in _ALL_KEYWORDS and key != "oneOf":
                violations.append(f"{path}.{key} is not supported beside oneOf")
        branches = node["oneOf"]
        if not isinstance(branches, Sequence) or isinstance(branches, str) or len(branches) < 2:
            violations.append(f"{path}.oneOf must be an array of at least two schemas")
            return
        for index, branch in enumerate(branches):
            _check_node(branch, f"{path}.oneOf[{index}]", violations, active)
        return
    if not has_type:
        for key in node:
            if key in _ALL_KEYWORDS:
                violations.append(f"{path}.{key} requires type or oneOf")
        return
    schema_type = node["type"]
    if not isinstance(schema_type, str) or schema_type not in SCHEMA_TYPES:
        if isinstance(schema_type, list | tuple):
            violations.append(
                f"{path}.type must be a single type string (type arrays are not supported)"
            )
        else:
            violations.append(f"{path}.type must be one of {'/'.join(SCHEMA_TYPES)}")
        return
    allowed = _TYPE_KEYWORDS[schema_type]
    for key in node:
        if key in _ALL_KEYWORDS and key != "type" and key not in allowed:
            violations.append(f'{path}.{key} is not supported on type "{schema_type}"')
    if schema_type == "object":
        properties = node.get("properties", {})
        if not isinstance(properties, Mapping):
            violations.append(f"{path}.properties must be an object of schemas")
            properties = {}
        for name, child in properties.items():
            _check_node(child, f"{path}.properties.{name}", violations, active)
        if "required" in node:
            required = node["required"]
            if (
                not isinstance(required, Sequence)
                or isinstance(required, str)
                or not all(isinstance(k, str) for k in required)
            ):
                violations.append(f"{path}.required must be an array of strings")
            else:
                for key in required:
                    if key not in properties:
                        violations.append(
                            f'{path}.required names "{key}" which is not in properties'
                        )
        if "additionalProperties" in node and not isinstance(node["additionalProperties"], bool):
            violations.append(f"{path}.additionalProperties must be a boolean")
    elif schema_type == "array":
        if "items" in node:
            _check_node(node["items"], f"{path}.items", violations, active)
    else:
        if "enum" in node:
            enum = node["enum"]
            if (
                not isinstance(enum, Sequence)
                or isinstance(enum, str)
                or not enum
                or not all(_matches_type(schema_type, item) for item in enum)
            ):
                violations.append(f"{path}.enum must be a non-empty array of {schema_type} values")
        if "const" in node:
            const = node["const"]
            if not _matches_type(schema_type, const):
                violations.append(f"{path}.const must be a {schema_type} value")
            elif (
                "enum" in node and isinstance(node["enum"], Sequence) and const not in node["enum"]
            ):
                violations.append(f"{path}.const must be one of {path}.enum when both are declared")


# --------------------------------------------------------------------------- values


def _display(path: str, root: str) -> str:
    return path if path else root


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def validate(schema: Mapping[str, Any], value: object, root: str = "arguments") -> list[str]:
    """Violations of ``value`` against a schema accepted by :func:`check_schema`.

    ``root`` names the value in messages when the violation is at the top
    (``"arguments" must be an object``); nested paths are dotted property
    names (``missing required property "options.path"``).
    """
    violations: list[str] = []
    # Explicit stack: a deeply nested argument cannot exhaust the recursion limit.
    stack: list[tuple[Mapping[str, Any], object, str]] = [(schema, value, "")]
    while stack:
        node, current, path = stack.pop()
        violations.extend(_validate_node(node, current, path, root, stack))
    return violations


def _validate_node(
    node: Mapping[str, Any],
    value: object,
    path: str,
    root: str,
    stack: list[tuple[Mapping[str, Any], object, str]],
) -> list[str]:
    where = _display(path, root)
    if "oneOf" in node:
        matches = sum(1 for branch in node["oneOf"] if not validate(branch, value, root))
        if matches != 1:
            return [f'"{where}" must match exactly one oneOf branch (matched {matches})']
        return []
    schema_type = node.get("type")
    if schema_type is None:
        try:
            check_json(value, where)
        except ValueError:
            return [f'"{where}" must be a lossless JSON value']
        return []
    if schema_type == "object":
        if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
            return [f'"{where}" must be an object']
        properties: Mapping[str, Any] = node.get("properties", {})
        found = [
            f'missing required property "{_join(path, key)}"'
            for key in node.get("required", ())
            if key not in value
        ]
        children = [
            (child, value[key], _join(path, key))
            for key, child in properties.items()
            if key in value
        ]
        stack.extend(reversed(children))
        if node.get("additionalProperties") is False:
            found.extend(
                f'"{_join(path, key)}" is not a declared property (additionalProperties: false)'
                for key in value
                if key not in properties
            )
        return found
    if schema_type == "array":
        if not isinstance(value, list | tuple):
            return [f'"{where}" must be an array']
        items = node.get("items")
        if items is not None:
            indexed = list(enumerate(value))
            stack.extend((items, item, f"{path}[{index}]") for index, item in reversed(indexed))
        return []
    if schema_type == "string":
        if not isinstance(value, str):
            return [f'"{where}" must be a string']
        bad = _lone_surrogate(value)
        if bad is not None:
            return [
                f'"{where}" must be Unicode text, but character {bad} is a lone UTF-16 '
                f"surrogate (\\u{ord(value[bad]):04x}); send the text itself, not a broken escape"
            ]
    if schema_type == "boolean" and not isinstance(value, bool):
        return [f'"{where}" must be a boolean']
    if schema_type == "null" and value is not None:
        return [f'"{where}" must be null']
    if schema_type == "number":
        if isinstance(value, bool) or not isinstance(value, int | float):
            return [f'"{where}" must be a number']
        if not _is_number(value):
            return [f'"{where}" must be a finite JSON number']
    if schema_type == "integer" and (isinstance(value, bool) or not _is_integer(value)):
        return [f'"{where}" must be an integer']
    if "enum" in node and not any(_same_scalar(value, item) for item in node["enum"]):
        return [f'"{where}" must be one of {json.dumps(list(node["enum"]), ensure_ascii=False)}']
    if "const" in node and not _same_scalar(value, node["const"]):
        return [f'"{where}" must be {json.dumps(node["const"], ensure_ascii=False)}']
    return []


def _lone_surrogate(text: str) -> int | None:
    """The index of the first lone surrogate in ``text`` (a JSON ``\\udXXX`` escape), or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        return error.start
    return None


def _same_scalar(a: object, b: object) -> bool:
    """JSON equality of scalars: ``True`` is not ``1``, but ``1`` equals ``1.0``."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b

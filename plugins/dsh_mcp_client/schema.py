"""Server input schemas lowered into the registry's enforced JSON Schema subset.

dsh's registry shows the model only keywords it enforces (``dsh_host._tools.schema``). An MCP
server's schema often carries more (``minimum``, ``format``, ``anyOf``, ``$ref`` ...). Those
constraints are the server's to enforce, and it does (it validates ``tools/call``), but the model
should still read them: each node's unsupported keywords move into its ``description`` as
``(checked by the server: minimum 1, maximum 10)``, and the supported rest stays a schema the
registry enforces. A node whose *structure* is outside the subset (a type list, ``anyOf``,
``$ref``) becomes an open node carrying its whole JSON in that note.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from dsh_host.sdk import SCHEMA_TYPES, ToolError, check_object_schema

__all__ = ["lower_input_schema"]

_ANNOTATIONS: Final = ("description", "title", "default", "examples")
_SCALAR_KEYWORDS: Final = ("enum", "const")


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def _note(node: dict[str, Any], moved: dict[str, Any]) -> dict[str, Any]:
    if not moved:
        return node
    parts = ", ".join(f"{key} {_compact(value)}" for key, value in moved.items())
    note = f"(checked by the server: {parts})"
    description = node.get("description")
    node["description"] = f"{description} {note}" if isinstance(description, str) else note
    return node


def _lower(schema: Any) -> dict[str, Any]:
    if not isinstance(schema, Mapping):
        return {}
    node: dict[str, Any] = {k: schema[k] for k in _ANNOTATIONS if k in schema}
    moved: dict[str, Any] = {}
    kind = schema.get("type")
    structural = {"type", "properties", "required", "additionalProperties", "items", "oneOf"}
    if kind is not None and kind not in SCHEMA_TYPES:
        # a type list, or nonsense: the whole node is the server's to check
        moved = {k: v for k, v in schema.items() if k not in _ANNOTATIONS}
        return _note(node, moved)
    if kind is not None:
        node["type"] = kind
    if kind == "object":
        properties = schema.get("properties")
        if isinstance(properties, Mapping):
            node["properties"] = {str(k): _lower(v) for k, v in properties.items()}
        required = schema.get("required")
        if isinstance(required, list) and all(isinstance(r, str) for r in required):
            node["required"] = list(required)
        extra = schema.get("additionalProperties")
        if isinstance(extra, bool):
            node["additionalProperties"] = extra
        elif extra is not None:
            moved["additionalProperties"] = extra
    elif kind == "array" and "items" in schema:
        if isinstance(schema["items"], Mapping):
            node["items"] = _lower(schema["items"])
        else:
            moved["items"] = schema["items"]
    elif kind is not None and kind != "object":
        for key in _SCALAR_KEYWORDS:
            if key in schema:
                node[key] = schema[key]
    if kind is None and isinstance(schema.get("oneOf"), list):
        node["oneOf"] = [_lower(branch) for branch in schema["oneOf"]]
    for key, value in schema.items():
        if key in node or key in structural or key in _ANNOTATIONS or key == "$schema":
            continue
        if key in _SCALAR_KEYWORDS and kind is not None:
            continue
        moved[key] = value
    return _note(node, moved)


def lower_input_schema(schema: Any) -> tuple[dict[str, Any], bool]:
    """``(schema the registry accepts, whether anything moved into a note)``.

    The root must be an object schema; when the lowered schema still fails the registry's
    check (an unusual combination), the tool takes an open object whose description carries
    the server's schema.
    """
    original = dict(schema) if isinstance(schema, Mapping) else {}
    lowered = _lower(original)
    lowered["type"] = "object"
    try:
        check_object_schema(lowered, "MCP input schema")
    except ToolError:
        lowered = _note({"type": "object"}, {"schema": original})
    return lowered, lowered != {k: v for k, v in original.items() if k != "$schema"}

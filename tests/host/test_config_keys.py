"""Config keys are snake_case in every plugin; DSH's camelCase spellings are aliases (D21, issue 17).

Per plugin: every key of its config Struct, nested Structs included, is its snake_case Python
name (no ``rename="camel"``), and a row written with DSH's camelCase keys — at the top and inside
nested Structs and lists of them — loads to the same config as the snake_case row.
"""

from __future__ import annotations

import importlib.metadata
from typing import Any

import msgspec
import msgspec.inspect as mi
import pytest

from dsh_host._loader import accept_camel_keys


def plugin_configs() -> dict[str, type[msgspec.Struct]]:
    out: dict[str, type[msgspec.Struct]] = {}
    for entry in importlib.metadata.entry_points(group="dsh.plugins"):
        out[entry.name] = entry.load().Config
    return out


CONFIGS = plugin_configs()


def keys_of(info: mi.Type, path: str = "config") -> list[tuple[str, str, str]]:
    """(path, python name, key in YAML) of every field, through nested Structs and containers."""
    if isinstance(info, mi.Metadata):
        return keys_of(info.type, path)
    if isinstance(info, mi.UnionType):
        return [k for member in info.types for k in keys_of(member, path)]
    if isinstance(info, mi.ListType | mi.VarTupleType | mi.SetType | mi.FrozenSetType):
        return keys_of(info.item_type, f"{path}[]")
    if isinstance(info, mi.DictType):
        return keys_of(info.value_type, f"{path}{{}}")
    if isinstance(info, mi.StructType):
        out = []
        for field in info.fields:
            out.append((f"{path}.{field.name}", field.name, field.encode_name))
            out.extend(keys_of(field.type, f"{path}.{field.name}"))
        return out
    return []


@pytest.mark.parametrize("plugin", sorted(CONFIGS))
def test_every_config_key_is_snake_case(plugin: str) -> None:
    wrong = [
        f"{path} is spelled {key!r}"
        for path, name, key in keys_of(mi.type_info(CONFIGS[plugin]))
        if key != name or key != key.lower()
    ]
    assert not wrong, f"{plugin}: {wrong}"


#: plugin -> (DSH's camelCase row, the same row in snake_case)
ALIASED: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "agent": (
        {"maxStepsPerTurn": 3, "maxParallelToolCalls": 2, "includeRuntimeContext": False},
        {"max_steps_per_turn": 3, "max_parallel_tool_calls": 2, "include_runtime_context": False},
    ),
    "builtin-tools": (
        {"maxOutputBytes": 100, "envAllow": ["LANG"], "protectVirtualenvs": False},
        {"max_output_bytes": 100, "env_allow": ["LANG"], "protect_virtualenvs": False},
    ),
    "sandbox-local": (
        {"unixSockets": "allow", "probeTimeoutMs": 250, "pidsMax": 64},
        {"unix_sockets": "allow", "probe_timeout_ms": 250, "pids_max": 64},
    ),
    "timeout-policy": ({"toolTimeoutMs": {"bash": 5}}, {"tool_timeout_ms": {"bash": 5}}),
    "repeat-tool-reminder": ({"argumentsPreviewChars": 40}, {"arguments_preview_chars": 40}),
    "user-approval": ({"policy": "never"}, {"policy": "never"}),
    "llm-retry": ({}, {}),
    # nested Structs: a Struct field, and Structs inside a list
    "llm-openai-compatible": (
        {"apiKeyEnv": "K", "retryPolicy": {"maxRetries": 2, "backoff": {"initialDelayMs": 9}}},
        {"api_key_env": "K", "retry_policy": {"max_retries": 2, "backoff": {"initial_delay_ms": 9}}},
    ),
    "llm-scripted": (
        {"responses": [{"toolCalls": [{"name": "read_file"}]}], "reasoningEfforts": ["high"]},
        {"responses": [{"tool_calls": [{"name": "read_file"}]}], "reasoning_efforts": ["high"]},
    ),
}


@pytest.mark.parametrize("plugin", sorted(ALIASED))
def test_dsh_camel_case_keys_load_as_aliases(plugin: str) -> None:
    config_type = CONFIGS[plugin]
    camel, snake = ALIASED[plugin]
    from_camel = msgspec.convert(accept_camel_keys(camel, config_type), config_type)
    from_snake = msgspec.convert(accept_camel_keys(snake, config_type), config_type)
    assert from_camel == from_snake
    assert msgspec.structs.asdict(from_camel) != msgspec.structs.asdict(config_type()) or not camel

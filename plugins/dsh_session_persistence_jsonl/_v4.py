"""DSH's session format v4 (DSH 0.1.7 and later) at the JSONL boundary.

The core models v3 shapes; a v4 log is read and written by converting each row at
this one boundary: :func:`lower_row` turns an admitted v4 row into the v3 row the
core decodes, and :func:`lift_row` turns the core's v3 line into the row DSH 0.2
stores. The two are inverse on every row :func:`admit_v4_row` admits, so a v4 log
that is read and re-encoded is the same bytes (the fixture tests check that on
every row). docs/format.md §9 lists what v4 changes, with its source in DSH's code.

What v4 changes in an event row (DSH ``session-format-v3-to-v4``, ``tool-role.ts``,
``sources.ts``, ``message-sources.ts``):

* ``tool/result``: the message is first class — role ``tool``, ``toolCallId``,
  the result's content directly, optional ``isError`` — instead of a user-role
  message holding one ``tool-result`` wrapper block;
* message sources: ``{kind: "plugin", plugin: P}`` is gone; the producer names
  its own kind (``compact`` → ``compact-checkpoint``, an unknown plugin ``acme``
  → ``plugin:acme``, …); a v4 row with ``kind: "plugin"`` is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

__all__ = [
    "V4_VERSION",
    "V4RowError",
    "admit_v4_row",
    "lift_row",
    "lower_row",
]

#: The header version of DSH's format v4 (``SESSION_FORMAT_VERSION = 4``, DSH 0.1.7-alpha.1).
V4_VERSION: Final = 4

#: v3 plugin names whose v4 producer kind is another string (``sources.ts``). The
#: system-prompt plugin is role-sensitive and handled apart.
_RENAMED: Final[Mapping[str, str]] = {
    "compact": "compact-checkpoint",
    "tools-code-mode": "ptc-mode",
    "tools-ptc": "ptc-mode",
    "dsh-compaction-basic": "compact-basic",
}
_SYSTEM_PROMPT_PLUGIN: Final = "@deepseek-ai/dsh-system-prompt"

#: First-party v3 plugin names that keep their name as their v4 kind (``sources.ts``).
_SAME_NAME: Final = frozenset(
    {
        "agent-instructions",
        "session-reference",
        "team-message",
        "goal",
        "skill-invocation",
        "skill-catalog",
        "coordinator",
        "subagent-report",
        "subagent-settled",
        "webhook",
        "agent-message",
        "model-selection",
        "plan-mode",
        "time-context",
        "tmux-context",
        "user-approval",
        "repeat-tool-reminder",
        "tool-cordis",
        "cordis-host-runner",
        "tool-goal",
        "tool-jobs",
        "hooks-codex",
        "hooks-claude-code",
        "schedule",
        "dsh-session-title-llm",
    }
)

#: v4 kind → the v3 plugin it lowers to. ``ptc-mode`` has two v3 names and lowers to
#: ``tools-ptc`` (both lift back to ``ptc-mode``, so the v4 bytes survive a round trip).
_LOWERED: Final[Mapping[str, str]] = {
    "compact-checkpoint": "compact",
    "ptc-mode": "tools-ptc",
    "compact-basic": "dsh-compaction-basic",
    **{name: name for name in _SAME_NAME},
}

#: Plugin names a ``plugin:<name>`` kind must not lower to: they lift to another kind.
_NOT_PREFIXED: Final = frozenset({*_RENAMED, *_SAME_NAME, _SYSTEM_PROMPT_PLUGIN})

_WRAPPER_FIELDS: Final = frozenset({"type", "toolCallId", "content", "isError"})
_MESSAGE_FIELDS: Final = frozenset({"id", "role", "source", "content"})
_MESSAGE_EXT: Final = "plugin:message:"
_RESULT_EXT: Final = "plugin:result:"


class V4RowError(ValueError):
    """A row DSH's native v4 admission refuses (the text names the rule and the seq)."""


# --------------------------------------------------------------------------- message slots


def _map_messages(row: dict[str, Any], fn: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """Apply ``fn`` to the messages a first-party event carries (DSH's declared slots:
    ``user/message`` data, ``data.message`` of system/developer/assistant/tool rows,
    ``agent/inbox/spliced`` ``inserted[]``, ``session/title-llm-request`` ``messages[]``).
    Nothing else is traversed: arbitrary JSON keeps its meaning."""
    kind = row.get("type")
    data = row.get("data")
    if not isinstance(data, dict):
        return
    if kind == "user/message":
        row["data"] = fn(data)
        return
    if kind in ("system/message", "developer/message", "assistant/message", "tool/result"):
        message = data.get("message")
        if isinstance(message, dict):
            row["data"] = {**data, "message": fn(message)}
        return
    key = {"agent/inbox/spliced": "inserted", "session/title-llm-request": "messages"}.get(
        str(kind)
    )
    if key is None:
        return
    items = data.get(key)
    if isinstance(items, list):
        row["data"] = {
            **data,
            key: [fn(m) if isinstance(m, dict) else m for m in items],
        }


def _with_source(message: dict[str, Any], source: dict[str, Any]) -> dict[str, Any]:
    return {k: (source if k == "source" else v) for k, v in message.items()}


# --------------------------------------------------------------------------- v3 -> v4


def _v4_kind(plugin: str, role: object) -> str:
    if plugin == _SYSTEM_PROMPT_PLUGIN:
        return "system-prompt" if role == "system" else "runtime-context"
    renamed = _RENAMED.get(plugin)
    if renamed is not None:
        return renamed
    if plugin in _SAME_NAME:
        return plugin
    return f"plugin:{plugin}"


def _lift_source(message: dict[str, Any]) -> dict[str, Any]:
    source = message.get("source")
    if not isinstance(source, dict) or source.get("kind") != "plugin":
        return message
    plugin = source.get("plugin")
    if type(plugin) is not str:
        raise V4RowError("a v3 plugin source without a string plugin has no v4 form")
    kind = _v4_kind(plugin, message.get("role"))
    lifted = {k: (kind if k == "kind" else v) for k, v in source.items() if k != "plugin"}
    return _with_source(message, lifted)


def _lift_tool_message(message: dict[str, Any], seq: object) -> dict[str, Any]:
    if message.get("role") != "user":
        return message
    content = message.get("content")
    source = message.get("source")
    wrapper = content[0] if isinstance(content, list) and len(content) == 1 else None
    call_id = source.get("callId") if isinstance(source, dict) else None
    if (
        not isinstance(wrapper, dict)
        or wrapper.get("type") != "tool-result"
        or type(call_id) is not str
        or wrapper.get("toolCallId") != call_id
    ):
        raise V4RowError(
            f"tool/result at seq {seq} has no v4 form: it needs exactly one tool-result "
            "block answering its tool source"
        )
    out: dict[str, Any] = {
        "role": "tool",
        "source": source,
        "toolCallId": call_id,
        "content": wrapper.get("content"),
    }
    if "isError" in wrapper:
        out["isError"] = wrapper["isError"]
    out["id"] = message.get("id")
    out.update((_MESSAGE_EXT + k, v) for k, v in message.items() if k not in _MESSAGE_FIELDS)
    out.update((_RESULT_EXT + k, v) for k, v in wrapper.items() if k not in _WRAPPER_FIELDS)
    return out


def lift_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """The v4 row of one v3 event row (DSH's v3 → v4 representation, without the
    corpus-level steps of its migration: see docs/format.md §10.3)."""
    out = dict(row)
    _map_messages(out, _lift_source)
    if out.get("type") == "tool/result":
        data = out["data"]
        out["data"] = {**data, "message": _lift_tool_message(data["message"], out.get("seq"))}
    return out


# --------------------------------------------------------------------------- v4 -> v3


def _lower_source(message: dict[str, Any]) -> dict[str, Any]:
    source = message.get("source")
    if not isinstance(source, dict):
        return message
    kind = source.get("kind")
    if type(kind) is not str:
        return message
    plugin: str | None
    if kind == "system-prompt" and message.get("role") == "system":
        plugin = _SYSTEM_PROMPT_PLUGIN
    elif kind == "runtime-context" and message.get("role") != "system":
        plugin = _SYSTEM_PROMPT_PLUGIN
    elif kind.startswith("plugin:") and kind[7:] not in _NOT_PREFIXED:
        plugin = kind[7:]
    else:
        plugin = _LOWERED.get(kind)
    if plugin is None:  # a direct kind (user, model, tool, or one the core keeps opaque)
        return message
    lowered: dict[str, Any] = {}
    for key, value in source.items():
        if key == "kind":
            lowered["kind"] = "plugin"
            lowered["plugin"] = plugin
        else:
            lowered[key] = value
    return _with_source(message, lowered)


def _lower_tool_message(message: dict[str, Any]) -> dict[str, Any]:
    wrapper: dict[str, Any] = {
        "type": "tool-result",
        "toolCallId": message["toolCallId"],
        "content": message["content"],
    }
    if "isError" in message:
        wrapper["isError"] = message["isError"]
    wrapper.update(
        (k[len(_RESULT_EXT) :], v) for k, v in message.items() if k.startswith(_RESULT_EXT)
    )
    out: dict[str, Any] = {"id": message["id"], "role": "user", "content": [wrapper]}
    out["source"] = message["source"]
    out.update(
        (k[len(_MESSAGE_EXT) :], v) for k, v in message.items() if k.startswith(_MESSAGE_EXT)
    )
    return out


def lower_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """The v3 row the core decodes for one row :func:`admit_v4_row` admitted."""
    out = dict(row)
    if out.get("type") == "tool/result":
        data = out["data"]
        out["data"] = {**data, "message": _lower_tool_message(data["message"])}
    _map_messages(out, _lower_source)
    return out


# --------------------------------------------------------------------------- admission


def _check_source(message: dict[str, Any], seq: object) -> None:
    source = message.get("source")
    if isinstance(source, dict) and source.get("kind") == "plugin":
        raise V4RowError(
            f"format v4 message at seq {seq} uses the retired plugin source wrapper "
            '(kind "plugin"); v4 requires a producer-owned source kind'
        )


def _check_no_wrapper(message: dict[str, Any], seq: object) -> None:
    content = message.get("content")
    if isinstance(content, list) and any(
        isinstance(b, dict) and b.get("type") == "tool-result" for b in content
    ):
        raise V4RowError(
            f"format v4 message at seq {seq} holds a retired tool-result wrapper block"
        )


def _is_wrapper(block: object) -> bool:
    return isinstance(block, dict) and block.get("type") == "tool-result"


def _check_other_positions(row: dict[str, Any], seq: object) -> None:
    """The retired wrapper outside message slots: the positions DSH's ``retired-syntax.ts``
    inspects (direct block tags only; tool arguments and nested JSON stay opaque)."""
    kind = row.get("type")
    data = row.get("data")
    if not isinstance(data, dict):
        return
    lists: list[object] = []
    if kind == "team/message/queued" and isinstance(data.get("message"), dict):
        lists.append(data["message"].get("content"))
    elif kind == "compaction/summary":
        lists += [data.get("summary"), data.get("rawOutput")]
    elif kind == "tool/ptc-dispatch":
        lists.append(data.get("content"))
    elif kind in ("assistant/message", "assistant/attempt"):
        stream = data.get("stream")
        for record in stream if isinstance(stream, list) else []:
            chunk = record.get("chunk") if isinstance(record, dict) else None
            if not isinstance(chunk, dict) or record.get("type") != "chunk":
                continue
            if (chunk.get("type") == "block-start" and chunk.get("blockType") == "tool-result") or (
                chunk.get("type") == "block-end" and _is_wrapper(chunk.get("block"))
            ):
                raise V4RowError(
                    f"format v4 {kind} at seq {seq} streams a retired tool-result block"
                )
    for blocks in lists:
        if isinstance(blocks, list) and any(_is_wrapper(b) for b in blocks):
            raise V4RowError(f"format v4 {kind} at seq {seq} holds a retired tool-result block")


def _check_tool_result(data: object, seq: object) -> None:
    subject = f"format v4 tool/result at seq {seq}"
    if not isinstance(data, dict) or not isinstance(data.get("message"), dict):
        raise V4RowError(f"{subject} needs a message object")
    message = data["message"]
    source = message.get("source")
    call_id = message.get("toolCallId")
    msg_id = message.get("id")
    if type(msg_id) is not str or not msg_id:
        raise V4RowError(f"{subject} needs a non-empty string message id")
    if message.get("role") != "tool":
        raise V4RowError(f"{subject} needs a tool-role message")
    if not isinstance(source, dict) or source.get("kind") != "tool":
        raise V4RowError(f"{subject} needs a tool source")
    if type(call_id) is not str or not call_id or source.get("callId") != call_id:
        raise V4RowError(f"{subject} needs toolCallId matching its tool source")
    if not isinstance(message.get("content"), list):
        raise V4RowError(f"{subject} needs array content")
    if "isError" in message and type(message["isError"]) is not bool:
        raise V4RowError(f"{subject}: isError must be a boolean when present")
    if data.get("error") is not None and message.get("isError") is not True:
        raise V4RowError(f"{subject} carries error metadata for a non-error result")


_TOOL_CHANGES: Final = frozenset({"tool-addition", "tool-removal"})
_MAX_SAFE: Final = 2**53 - 1


def _is_count(value: object) -> bool:
    return type(value) is int and 0 <= value <= _MAX_SAFE


def _check_tool_changes(blocks: object, seq: object, *, developer: bool) -> None:
    """DSH's ``assertToolChange`` (``developer.ts``) on each block of one content list."""
    for block in blocks if isinstance(blocks, list) else []:
        if not isinstance(block, dict) or block.get("type") not in _TOOL_CHANGES:
            continue
        tag = block["type"]
        if not developer:
            raise V4RowError(f"format v4 {tag} at seq {seq} requires developer role")
        name = block.get("toolName")
        if type(name) is not str or not name:
            raise V4RowError(f"format v4 {tag} at seq {seq} requires a nonempty toolName")
        if tag == "tool-addition" and "tool" in block:
            raise V4RowError(
                f"format v4 tool-addition at seq {seq} must omit inline tool definitions"
            )


def _check_ordinary(message: dict[str, Any], seq: object) -> None:
    if message.get("role") == "developer":
        raise V4RowError(
            f"format v4 message at seq {seq}: developer/message and developer role must "
            "occur together"
        )
    _check_tool_changes(message.get("content"), seq, developer=False)


def _check_developer(data: object, seq: object) -> None:
    """DSH's native ``developer/message`` rules (``assertV4DeveloperData``)."""
    subject = f"format v4 developer/message at seq {seq}"
    if not isinstance(data, dict):
        raise V4RowError(f"{subject}: data must be an object")
    message = data.get("message")
    if not isinstance(message, dict) or message.get("role") != "developer":
        raise V4RowError(f"{subject} requires turn, step, and a developer message")
    for field in ("turn", "step"):
        if not _is_count(data.get(field)) or data[field] == 0:
            raise V4RowError(f"{subject}: {field} must be a positive integer")
    content = message.get("content")
    _check_tool_changes(content, seq, developer=True)
    source = message.get("source")
    kind = source.get("kind") if isinstance(source, dict) else None
    msg_id = message.get("id")
    if (
        type(msg_id) is not str
        or not msg_id
        or not isinstance(content, list)
        or type(kind) is not str
        or not kind
        or kind == "plugin"
    ):
        raise V4RowError(f"{subject} requires id, role, content, and a producer-owned source")
    additions = any(isinstance(b, dict) and b.get("type") == "tool-addition" for b in content)
    if additions and not _is_count(data.get("headerSeq")):
        raise V4RowError(f"{subject}: headerSeq must be a non-negative integer with additions")
    if not additions and "headerSeq" in data:
        raise V4RowError(f"{subject} must omit headerSeq without tool additions")


_CATALOG_MODES: Final = {0: ("continuable", "one-shot"), 1: ("continuable", "one-shot", "unknown")}


def _check_catalog(data: object, seq: object) -> None:
    """DSH's native ``subagent/catalog`` payload rules (v3-to-v4 README, "Parent catalog
    prerequisites"): version 0 or 1, string ``childId``, a count ``childCreatedAt``, a mode
    of the version, a string label for a continuable child (and any present label)."""
    subject = f"format v4 subagent/catalog at seq {seq}"
    if not isinstance(data, dict):
        raise V4RowError(f"{subject}: data must be an object")
    version = data.get("version")
    modes = _CATALOG_MODES.get(version) if type(version) is int else None
    if modes is None:
        raise V4RowError(f"{subject}: version must be 0 or 1, got {version!r}")
    if type(data.get("childId")) is not str:
        raise V4RowError(f"{subject}: childId must be a string")
    if not _is_count(data.get("childCreatedAt")):
        raise V4RowError(f"{subject}: childCreatedAt must be a non-negative integer")
    mode = data.get("mode")
    if mode not in modes:
        raise V4RowError(f"{subject}: mode must be one of {', '.join(modes)}, got {mode!r}")
    if "label" in data and type(data["label"]) is not str:
        raise V4RowError(f"{subject}: a present label must be a string")
    if mode == "continuable" and "label" not in data:
        raise V4RowError(f"{subject}: a continuable child needs a string label")


def _check_v4_only(row: dict[str, Any], seq: object) -> None:
    """The rows and blocks v4 added: developer messages and their tool-change blocks
    (nowhere else), ``deferLoading`` of request tools, ``subagent/catalog`` payloads."""
    kind = row.get("type")
    data = row.get("data")
    if kind == "developer/message":
        _check_developer(data, seq)
        return
    if kind == "subagent/catalog" and row.get("ignorable") is not True:
        _check_catalog(data, seq)
        return
    if not isinstance(data, dict):
        return
    if kind == "compaction/summary":
        _check_tool_changes(data.get("summary"), seq, developer=False)
        _check_tool_changes(data.get("rawOutput"), seq, developer=False)
    elif kind in ("assistant/message", "assistant/attempt"):
        stream = data.get("stream")
        for record in stream if isinstance(stream, list) else []:
            chunk = record.get("chunk") if isinstance(record, dict) else None
            if not isinstance(chunk, dict) or record.get("type") != "chunk":
                continue
            if chunk.get("type") == "block-end" and isinstance(chunk.get("block"), dict):
                _check_tool_changes([chunk["block"]], seq, developer=False)
            if chunk.get("type") == "block-start" and chunk.get("blockType") in _TOOL_CHANGES:
                raise V4RowError(
                    f"format v4 tool-change blocks at seq {seq} require developer role"
                )
    elif kind == "request/header" and isinstance(data.get("header"), dict):
        tools = data["header"].get("tools")
        for tool in tools if isinstance(tools, list) else []:
            if (
                isinstance(tool, dict)
                and "deferLoading" in tool
                and tool["deferLoading"] is not True
            ):
                raise V4RowError(
                    f"format v4 request/header at seq {seq}: tool deferLoading must be true "
                    "when present"
                )


def admit_v4_row(row: object) -> None:
    """DSH's native v4 row rules this build checks (``tool-role.ts``,
    ``message-sources.ts``, ``retired-syntax.ts``, ``developer.ts``, the catalog rules of
    the v3-to-v4 README); raises :class:`V4RowError`.

    Like DSH, these run before the torn-tail rule: a v4 writer never writes such a
    row, so it is refused, never dropped as a tail. A row that is not an object is
    left to the envelope check (it reports it with the line).
    """
    if not isinstance(row, dict):
        return
    seq = row.get("seq")

    def check(message: dict[str, Any]) -> dict[str, Any]:
        _check_source(message, seq)
        if row.get("type") != "tool/result":
            _check_no_wrapper(message, seq)
        if row.get("type") != "developer/message":
            _check_ordinary(message, seq)
        return message

    probe = dict(row)
    _map_messages(probe, check)
    _check_other_positions(row, seq)
    _check_v4_only(row, seq)
    if row.get("type") == "tool/result":
        _check_tool_result(row.get("data"), seq)
        _check_no_wrapper(row["data"]["message"], seq)

"""The script format of the scripted model: one response per model request.

::

    responses:
      - text: "optional assistant text"
        reasoning: "optional reasoning text"
        tool_calls:
          - name: bash
            arguments: {command: "echo hi"}     # a mapping (sent as JSON) or a raw string
        delay_ms: 0                             # before the first chunk
      - text: "done"

Other keys of a response (all optional): ``chunk_delay_ms`` (between chunks),
``finish`` (``stop`` / ``tool-calls`` / ``max-tokens``; default: ``tool-calls``
when there are tool calls, else ``stop``), ``usage`` (``{input_tokens,
output_tokens}``), ``error`` (``{code, message, status?, retry_after_ms?}``:
fail the request after streaming the response's content), ``hang: true``
(stream the content, then wait until the request is cancelled). A tool call
may pin its ``id``; by default it is ``call_<response number>_<call number>``.

Parsed with msgspec (YAML via PyYAML, or JSON), so a mistake is reported with
the file and the key path (``responses[2].tool_calls[0].name``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from dsh_host.sdk import ConfigError

__all__ = [
    "Script",
    "ScriptError",
    "ScriptedError",
    "ScriptedResponse",
    "ScriptedToolCall",
    "ScriptedUsage",
    "load_script",
    "validate_responses",
]

_NonNegative = Annotated[int, msgspec.Meta(ge=0)]


class ScriptError(ConfigError):
    """A script file or inline ``responses`` list is invalid."""

    code = "INVALID_SCRIPT"


class ScriptedToolCall(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    name: Annotated[str, msgspec.Meta(min_length=1)]
    #: a mapping is encoded as compact JSON; a string is sent verbatim (malformed JSON included)
    arguments: dict[str, Any] | str = msgspec.field(default_factory=dict)
    id: Annotated[str, msgspec.Meta(min_length=1)] | None = None


class ScriptedUsage(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    input_tokens: _NonNegative
    output_tokens: _NonNegative
    cache_read_tokens: _NonNegative | None = None
    cache_write_tokens: _NonNegative | None = None
    reasoning_tokens: _NonNegative | None = None


class ScriptedError(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    code: Annotated[str, msgspec.Meta(min_length=1)]
    message: Annotated[str, msgspec.Meta(min_length=1)]
    status: Annotated[int, msgspec.Meta(ge=100, le=599)] | None = None
    retry_after_ms: Annotated[int, msgspec.Meta(gt=0)] | None = None


class ScriptedResponse(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    text: str | None = None
    reasoning: str | None = None
    tool_calls: list[ScriptedToolCall] = msgspec.field(default_factory=list)
    delay_ms: _NonNegative = 0
    chunk_delay_ms: _NonNegative = 0
    finish: Literal["stop", "tool-calls", "max-tokens"] | None = None
    usage: ScriptedUsage | None = None
    error: ScriptedError | None = None
    hang: bool = False

    @property
    def has_content(self) -> bool:
        return bool(self.text) or bool(self.reasoning) or bool(self.tool_calls)


class Script(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    responses: list[ScriptedResponse]


def validate_responses(responses: list[ScriptedResponse], source: str) -> None:
    """Checks msgspec cannot express: every response must do something."""
    for index, response in enumerate(responses):
        if not (response.has_content or response.error is not None or response.hang):
            raise ScriptError(
                f"{source}: responses[{index}] is empty; give it text, reasoning, tool_calls, "
                "error or hang"
            )


def _humanize(exc: msgspec.ValidationError) -> str:
    message = str(exc)
    marker = " - at `$"
    where = ""
    if marker in message:
        message, _, rest = message.partition(marker)
        where = rest.rstrip("`").lstrip(".")
    message = message.replace("`", "")
    if message.startswith("Object contains unknown field "):
        field = message[len("Object contains unknown field "):]
        where = f"{where}.{field}" if where else field
        message = (
            "unknown key (response keys: text, reasoning, tool_calls, delay_ms, chunk_delay_ms, "
            "finish, usage, error, hang; tool call keys: name, arguments, id)"
        )
    elif message.startswith("Object missing required field "):
        field = message[len("Object missing required field "):]
        where = f"{where}.{field}" if where else field
        message = "required key is missing"
    return f"{where}: {message}" if where else message


def _decode_json(data: bytes) -> Script:
    """A JSON script; escaped lone surrogates (valid JSON, refused by msgspec) via the stdlib.

    They are what a model's stream may carry, so a script must be able to say them.
    """
    try:
        return msgspec.json.decode(data, type=Script)
    except msgspec.DecodeError as exc:
        try:
            plain = json.loads(data)
        except ValueError:
            raise exc from None
        return msgspec.convert(plain, type=Script)


def load_script(path: str | Path) -> list[ScriptedResponse]:
    """Read and validate a script file (``.json`` is JSON, anything else YAML)."""
    file = Path(path).expanduser()
    shown = str(file.resolve()) if not file.is_absolute() else str(file)
    try:
        data = file.read_bytes()
    except FileNotFoundError:
        raise ScriptError(
            f"scripted model: script file {shown} does not exist (config key `path`; relative "
            "paths are resolved against the current directory)"
        ) from None
    except OSError as exc:
        raise ScriptError(
            f"scripted model: cannot read script file {shown}: {exc.strerror}"
        ) from None
    try:
        if file.suffix.lower() == ".json":
            script = _decode_json(data)
        else:
            script = msgspec.yaml.decode(data, type=Script)
    except msgspec.ValidationError as exc:
        raise ScriptError(f"scripted model: {shown}: {_humanize(exc)}") from None
    except msgspec.DecodeError as exc:
        raise ScriptError(f"scripted model: {shown} is not valid YAML/JSON: {exc}") from None
    validate_responses(script.responses, f"scripted model: {shown}")
    return script.responses

"""Model spec strings (``demo``, ``scripted:PATH``, ``PREFIX:MODEL``) to rows.

One parser for the front doors: ``dsh run --model SPEC``, ``dsh serve --model SPEC`` and
``Agent(model=SPEC)``. A spec names the model adapter row to compose and the
``provider`` / ``model`` the agent row routes its requests to. ``PREFIX:MODEL`` specs are
declared by the model adapters' plugins (``Plugin.model_route``: ``openai-compatible``,
``anthropic``), read from the shipped plugins' table so parsing a spec imports no adapter.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from dsh_host._shipped_plugins import FRONT_DOOR_ROWS, declared_model_routes
from dsh_host.errors import ConfigError

from .demo import DEMO_RESPONSES

if TYPE_CHECKING:
    from dsh_host._loader import Row

__all__ = ["MODEL_SPECS", "ModelChoice", "parse_model"]

MODEL_SPECS: Final = " | ".join(
    ["demo", "scripted:PATH", *(f"{prefix}:MODEL" for prefix in declared_model_routes())]
)


@dataclass(frozen=True, slots=True)
class ModelChoice:
    """The adapter row of a spec (row id ``model``) and the route the agent requests."""

    row: Row
    provider: str
    model: str


def parse_model(spec: str, flag: str = "--model") -> ModelChoice:
    """The row and route of ``spec``; a :class:`ConfigError` naming ``flag`` otherwise."""
    from dsh_host._loader import Row  # on use: `dsh run --help` shows MODEL_SPECS, no loader

    scripted = FRONT_DOOR_ROWS["scripted-model"]

    if spec == "demo":
        return ModelChoice(
            Row(id=scripted.id, name=scripted.plugin,
                config={"responses": DEMO_RESPONSES, "provider": "demo", "model": "demo"}),
            "demo",
            "demo",
        )
    kind, sep, value = spec.partition(":") if isinstance(spec, str) else ("", "", "")
    if sep and kind == "scripted" and value:
        path = Path(value)
        if not path.is_file():
            raise ConfigError(f"{flag} {spec}: script file {value} does not exist")
        return ModelChoice(
            Row(id=scripted.id, name=scripted.plugin, config={"path": str(path)}),
            "scripted",
            "scripted",
        )
    route = declared_model_routes().get(kind) if sep and value else None
    if route is not None:
        plugin, provider = route
        return ModelChoice(Row(id="model", name=plugin, config={"model": value}), provider, value)
    raise ConfigError(f"{flag} {spec!r} is not a model spec; use {MODEL_SPECS}")

"""From a YAML list of rows to a running host.

A composition is a top-level YAML list; each row is ``{id?, name, config?,
disabled?}``. ``name`` is an entry-point name in the ``dsh.plugins`` group
(``session-persistence-jsonl``), a DSH spelling of one
(``@deepseek-ai/dsh-session-persistence-jsonl``, ``dsh-session-persistence-jsonl``),
or ``package.module:Attr`` for a plugin that is not installed as a
distribution. Each row gets its own plugin instance, registered with pluggy
under the row id, so one plugin can serve two rows with two configs.

Rows mount sequentially in YAML order (a row whose injected services are not
live yet waits and mounts when they appear). Listener order, and therefore
around-chain nesting, is deterministic: an earlier row's hook is the outer one.
DSH mounts rows concurrently; this is a deliberate tightening (D3 in docs/decisions.md).

The only custom YAML tag is ``!env NAME`` / ``!env [NAME, default]``; nothing
in a composition can evaluate code.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import msgspec
import msgspec.inspect as mi
import pluggy

from ._context import Fiber, FiberState, Host
from ._plugin import PROJECT, HookSpecs, PluginMeta
from ._shipped_plugins import SHIPPED_PLUGINS, DeclaredPlugin
from .errors import (
    BootError,
    ConfigError,
    DuplicateRowIdError,
    MissingExtraError,
    PluginRegistrationError,
    UnknownPluginError,
)

if TYPE_CHECKING:
    import importlib.metadata

ENTRY_POINT_GROUP = "dsh.plugins"
_DSH_SCOPE = "@deepseek-ai/"


class Row(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One row of a composition."""

    name: str
    id: str | None = None
    config: dict[str, Any] | None = None
    disabled: bool = False


@dataclass(frozen=True, slots=True)
class LocatedRow:
    row: Row
    #: "file.yml:12" or "row 3" -- where to point the user
    where: str
    #: ``None``: the row may import code (``module:Attr``) and set config keys that choose
    #: executables (user-level, explicitly named or programmatic config). Otherwise why it may
    #: not, with the fix: such a row is refused at mount (D16).
    restricted: str | None = None


# -- YAML (docs/decisions.md D44: PyYAML is imported only to parse, in ._config_yaml) ---------


def parse_rows(
    text: str, source: str = "<config>", *, restricted: str | None = None
) -> list[LocatedRow]:
    """Parse a composition; every error names the file, line/row and key path.

    ``restricted`` marks every row (see :attr:`LocatedRow.restricted`).
    """
    from ._config_yaml import compose_rows

    composed, _ = compose_rows(text, source, convert_row)
    return [LocatedRow(row, where_of(source, line, i), restricted)
            for i, (_, line, row) in enumerate(composed)]


def where_of(source: str, line: int, index: int) -> str:
    """``file.yml:12 (row 3)``: where a row is, for the user (``line``, ``index`` 0-based)."""
    return f"{source}:{line + 1} (row {index + 1})"


def convert_row(data: Any, where: str) -> Row:
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: a row must be a mapping like `- name: sessions`, got {data!r}")
    try:
        return msgspec.convert(data, Row)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{where}: {_humanize(exc, prefix='')}") from None


def load_rows(
    path: str | os.PathLike[str], *, restricted: str | None = None
) -> list[LocatedRow]:
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file {file} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {file}: {exc.strerror}") from None
    return parse_rows(text, str(file), restricted=restricted)


_AT = re.compile(r" - at `\$(?P<path>[^`]*)`$")


def _choices(config_type: Any, path: str) -> list[Any] | None:
    """The allowed values of the ``Literal`` field at ``path`` (dotted) of ``config_type``."""
    import typing

    current: Any = config_type
    for name in path.split("."):
        try:
            hints = typing.get_type_hints(current, include_extras=False)
        except Exception:
            return None
        if name not in hints:
            return None
        current = hints[name]
    options = [current, *typing.get_args(current)]  # a Literal, or an Optional of one
    for option in options:
        if typing.get_origin(option) is typing.Literal:
            return list(typing.get_args(option))
    return None


def _humanize(
    exc: msgspec.ValidationError, prefix: str, config_type: Any = None
) -> str:
    """Turn msgspec's message into ``config.root: expected str, got int``."""
    message = str(exc)
    path = ""
    match = _AT.search(message)
    if match:
        path = match.group("path").lstrip(".")
        message = message[: match.start()]
    message = message.replace("`", "")
    message = message[:1].lower() + message[1:]
    unknown = re.match(r"object contains unknown field (\S+)", message)
    if unknown:
        field = unknown.group(1)
        path = f"{path}.{field}" if path else field
        message = "unknown key (check the spelling; see the plugin's README for its keys)"
    missing = re.match(r"object missing required field (\S+)", message)
    if missing:
        field = missing.group(1)
        path = f"{path}.{field}" if path else field
        message = "required key is missing"
    if message.startswith("invalid enum value") and config_type is not None and path:
        choices = _choices(config_type, path)
        if choices:
            message += "; valid values: " + ", ".join(repr(c) for c in choices)
    full = ".".join(p for p in (prefix, path) if p)
    return f"{full}: {message}" if full else message


#: where a camelCase word boundary falls (``apiKey``, ``baseURL``, ``URLPath``)
_CAMEL_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")


def accept_camel_keys(data: Any, config_type: Any, prefix: str = "config") -> Any:
    """D21: DSH's camelCase spelling of a snake_case config key is an alias of it.

    Walks ``data`` along ``config_type`` (a msgspec Struct, nested Structs,
    lists and dicts of them) and renames ``apiKeyEnv`` to ``api_key_env``
    wherever the Struct's key is snake_case. Values of free-form mappings
    (``headers``) are left alone; a row that spells one key both ways is refused.
    """
    return _camel_aliases(data, mi.type_info(config_type), prefix)


def _camel_aliases(data: Any, info: mi.Type, path: str) -> Any:
    if isinstance(info, mi.Metadata):
        return _camel_aliases(data, info.type, path)
    if isinstance(info, mi.UnionType):
        for member in info.types:
            if isinstance(member, mi.Metadata):
                member = member.type
            if isinstance(data, dict) and isinstance(member, mi.StructType | mi.DictType):
                return _camel_aliases(data, member, path)
            if isinstance(data, list) and isinstance(member, mi.ListType):
                return _camel_aliases(data, member, path)
        return data
    if isinstance(info, mi.ListType) and isinstance(data, list):
        return [_camel_aliases(item, info.item_type, f"{path}[{n}]") for n, item in enumerate(data)]
    if isinstance(info, mi.DictType) and isinstance(data, dict):
        return {k: _camel_aliases(v, info.value_type, f"{path}.{k}") for k, v in data.items()}
    if not (isinstance(info, mi.StructType) and isinstance(data, dict)):
        return data
    fields = {field.encode_name: field for field in info.fields}
    out: dict[Any, Any] = {}
    for key, value in data.items():
        target = key
        if isinstance(key, str) and key not in fields:
            snake = _CAMEL_BOUNDARY.sub("_", key).lower()
            if snake in fields:
                if snake in data:
                    raise ConfigError(
                        f"{path}: {key} and {snake} are the same key (DSH's spelling and "
                        "this project's); keep one"
                    )
                target = snake
        field = fields.get(target)
        out[target] = (
            _camel_aliases(value, field.type, f"{path}.{target}") if field is not None else value
        )
    return out


# -- plugin resolution --------------------------------------------------------------


def canonical_name(name: str) -> str:
    """``@deepseek-ai/dsh-x`` and ``dsh-x`` are aliases of ``x`` (DSH YAML works as is)."""
    if name.startswith(_DSH_SCOPE):
        name = name[len(_DSH_SCOPE):]
    if name.startswith("dsh-"):
        name = name[len("dsh-"):]
    return name


_installed: tuple[tuple[str, ...], dict[str, importlib.metadata.EntryPoint]] | None = None


def installed_plugins() -> dict[str, importlib.metadata.EntryPoint]:
    """The ``dsh.plugins`` entry points by name. Scanning every installed distribution is
    slow (a composition resolves a dozen rows), so the scan is kept while ``sys.path`` is
    unchanged; a row naming a shipped plugin needs no scan (:func:`declared_plugin`)."""
    import importlib.metadata  # itself a tenth of a cold start; most commands never need it

    global _installed
    path = tuple(sys.path)
    if _installed is None or _installed[0] != path:
        found = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
        _installed = (path, {ep.name: ep for ep in found})
    return dict(_installed[1])


def declared_plugin(name: str) -> DeclaredPlugin | None:
    """The shipped plugin a row name resolves to, known without importing it or scanning the
    installed entry points; None when only that can tell (``module:Attr``, a third-party entry
    point, a DSH spelling that a distribution registers as it is)."""
    if imports_code(name):
        return None
    declared = SHIPPED_PLUGINS.get(name)
    if declared is not None:
        return declared
    canonical = canonical_name(name)
    if canonical == name or canonical not in SHIPPED_PLUGINS or name in installed_plugins():
        return None
    return SHIPPED_PLUGINS[canonical]


def _load_entry_point(value: str) -> Any:
    """What an entry point's ``module:attr.path`` names (as ``EntryPoint.load`` finds it)."""
    module_name, _, attrs = value.partition(":")
    found: Any = importlib.import_module(module_name)
    for attr in filter(None, attrs.split(".")):
        found = getattr(found, attr)
    return found


def resolve_plugin(name: str, where: str) -> tuple[Any, str]:
    """Return (plugin factory, "module:attr") for a row name."""
    if imports_code(name):
        module_name, _, attr = name.partition(":")
        try:
            module = importlib.import_module(module_name)
            return getattr(module, attr), name
        except (ImportError, AttributeError) as exc:
            raise UnknownPluginError(f"{where}: cannot import plugin {name!r}: {exc}") from None
    declared = declared_plugin(name)
    entry_point: importlib.metadata.EntryPoint | None = None
    if declared is not None:
        value = declared.entry_point
    else:
        plugins = installed_plugins()
        entry_point = plugins.get(name if name in plugins else canonical_name(name))
        if entry_point is None:
            known = ", ".join(sorted(set(plugins) | set(SHIPPED_PLUGINS)))
            raise UnknownPluginError(
                f"{where}: unknown plugin {name!r}; installed plugins (entry-point group "
                f"{ENTRY_POINT_GROUP}): {known}"
            )
        value = entry_point.value
    try:
        return (_load_entry_point(value) if entry_point is None else entry_point.load()), value
    except MissingExtraError as exc:
        raise UnknownPluginError(f"{where}: plugin {name!r} {exc}") from exc
    except Exception as exc:
        raise UnknownPluginError(
            f"{where}: plugin {name!r} is installed ({value}) but failed to import: "
            f"{type(exc).__name__}: {exc}"
        ) from exc


def _make_plugin_manager() -> pluggy.PluginManager:
    manager = pluggy.PluginManager(PROJECT)
    manager.add_hookspecs(HookSpecs)
    return manager


@dataclass(slots=True)
class PreparedRow:
    row_id: str
    name: str
    entry_point: str
    instance: Any
    meta: PluginMeta
    config: Any
    where: str


def _camel(key: str) -> str:
    head, *rest = key.split("_")
    return head + "".join(part.title() for part in rest)


def _refuse_restricted(located: LocatedRow, executable_keys: Sequence[str] = ()) -> None:
    """Refuse what a restricted row may not do: import code, set an executable-choosing key."""
    if located.restricted is None:
        return
    row, where = located.row, located.where
    if imports_code(row.name):
        raise ConfigError(
            f"{where}: row {row.name!r} imports Python code by module path; {located.restricted}"
        )
    for key in executable_keys:
        for spelling in dict.fromkeys((key, _camel(key))):
            if row.config is not None and spelling in row.config:
                raise ConfigError(
                    f"{where}: config key {spelling} of {row.name} chooses an executable; "
                    f"{located.restricted}"
                )


def imports_code(name: str) -> bool:
    return ":" in name and not name.startswith(_DSH_SCOPE)


def prepare_row(manager: pluggy.PluginManager, located: LocatedRow, row_id: str) -> PreparedRow:
    row, where = located.row, located.where
    _refuse_restricted(located)  # before anything is imported
    factory, entry_point = resolve_plugin(row.name, where)
    try:
        instance = factory() if isinstance(factory, type) else factory
    except Exception as exc:
        raise PluginRegistrationError(
            f"{where}: constructing plugin {row.name!r} failed: {exc}"
        ) from exc
    try:
        manager.register(instance, name=row_id)
        manager.check_pending()
    except (pluggy.PluginValidationError, ValueError) as exc:
        if manager.is_registered(instance):
            manager.unregister(instance)
        raise PluginRegistrationError(f"{where}: plugin {row.name!r} is malformed: {exc}") from exc
    meta = manager.hook.dsh_plugin_meta.get_hookimpls()
    meta_impls = [impl for impl in meta if impl.plugin is instance]
    if not meta_impls:
        manager.unregister(instance)
        raise PluginRegistrationError(
            f"{where}: plugin {row.name!r} does not implement dsh_plugin_meta (subclass "
            "dsh_host.Plugin or implement the dsh_plugin_meta and dsh_apply hooks)"
        )
    info = meta_impls[0].function()
    if not isinstance(info, PluginMeta):
        manager.unregister(instance)
        raise PluginRegistrationError(
            f"{where}: dsh_plugin_meta of {row.name!r} returned {info!r}, not a PluginMeta"
        )
    if not (isinstance(info.config_type, type) and issubclass(info.config_type, msgspec.Struct)):
        manager.unregister(instance)
        raise PluginRegistrationError(
            f"{where}: plugin {row.name!r} declares Config={info.config_type!r}; "
            "a plugin's Config must be a msgspec.Struct subclass"
        )
    try:
        _refuse_restricted(located, info.executable_keys)
    except ConfigError:
        manager.unregister(instance)
        raise
    label = f"row {row_id!r} ({row.name})"
    if where and not where.startswith("row "):  # "file.yml:12": point at the row in its file
        label = f"{where}: {label}"
    try:
        raw = accept_camel_keys(row.config or {}, info.config_type)
        config = msgspec.convert(raw, info.config_type)
    except ConfigError as exc:
        manager.unregister(instance)
        raise ConfigError(f"{label}: {exc}") from None
    except msgspec.ValidationError as exc:
        manager.unregister(instance)
        message = _humanize(exc, prefix="config", config_type=info.config_type)
        raise ConfigError(f"{label}: {message}") from None
    return PreparedRow(row_id, row.name, entry_point, instance, info, config, where)


def prepared_plugin(located: LocatedRow) -> tuple[Any, Any]:
    """``located``'s plugin instance and its config, resolved and validated as mounting would
    (the same errors), with nothing applied: what a command that reads a store without booting
    the composition calls the plugin with (docs/decisions.md D39)."""
    manager = _make_plugin_manager()
    item = prepare_row(manager, located, located.row.id or "row")
    manager.unregister(item.instance)
    return item.instance, item.config


def check_rows(rows: Sequence[LocatedRow]) -> list[tuple[LocatedRow, PluginMeta]]:
    """Resolve and validate every enabled row as mounting would (plugin, config, restrictions),
    without applying anything; the rows with their plugin's metadata."""
    manager = _make_plugin_manager()
    prepared: list[tuple[LocatedRow, PreparedRow]] = []
    try:
        for index, located in enumerate(rows):
            if not located.row.disabled:
                prepared.append((located, prepare_row(manager, located, f"row-{index}")))
    finally:
        for _located, item in prepared:
            manager.unregister(item.instance)
    return [(located, item.meta) for located, item in prepared]


def rows_needed_for(
    rows: Sequence[LocatedRow], services: Sequence[str], *, repair: bool = False
) -> list[LocatedRow]:
    """The enabled rows that provide ``services``, plus (transitively) the providers of what
    those rows inject, in composition order: a command that only reads sessions boots these and
    nothing else (no tools, no sandbox probe). ``repair``: also every row whose plugin declares
    ``boots_for_repair`` (and what it injects), for a resume that only repairs the log.

    A row of a shipped plugin is told apart by what its plugin declares
    (:mod:`.shipped_plugins`), so it is imported and validated only when it is needed; any
    other row (a third-party entry point, ``module:Attr``) is resolved and validated as mounting
    would, to learn what it provides. Either way a name that resolves to no plugin is an error,
    and every row is refused what its file may not do (D16), needed or not."""
    manager = _make_plugin_manager()
    prepared: dict[int, PreparedRow] = {}
    declared: dict[int, DeclaredPlugin] = {}
    services_of: dict[int, tuple[tuple[str, ...], tuple[str, ...]]] = {}
    repairing: set[int] = set()
    drifted = False
    try:
        for index, located in enumerate(rows):
            if located.row.disabled:
                continue
            plugin = declared_plugin(located.row.name)
            if plugin is None:
                prepared[index] = item = prepare_row(manager, located, f"row-{index}")
                services_of[index] = (item.meta.provides, item.meta.inject)
                if item.meta.boots_for_repair:
                    repairing.add(index)
            else:
                _refuse_restricted(located, plugin.executable_keys)
                declared[index] = plugin
                services_of[index] = (plugin.provides, plugin.inject)
                if plugin.boots_for_repair:
                    repairing.add(index)
        if not repair:
            repairing.clear()
        keep = _providers(services_of, services, repairing)
        for index in keep:
            plugin = declared.get(index)
            if plugin is not None:
                prepared[index] = item = prepare_row(manager, rows[index], f"row-{index}")
                drifted |= (
                    item.meta.provides, item.meta.inject, item.meta.boots_for_repair
                ) != (plugin.provides, plugin.inject, plugin.boots_for_repair)
    finally:
        for item in prepared.values():
            manager.unregister(item.instance)
    if drifted:  # a shipped plugin no longer says what its line says: import every row
        metas = dict(zip(
            (i for i, r in enumerate(rows) if not r.row.disabled),
            (meta for _located, meta in check_rows(rows)),
            strict=True,
        ))
        checked = {index: (meta.provides, meta.inject) for index, meta in metas.items()}
        also = {index for index, meta in metas.items() if repair and meta.boots_for_repair}
        keep = _providers(checked, services, also)
    return [rows[index] for index in keep]


def _providers(
    services_of: Mapping[int, tuple[tuple[str, ...], tuple[str, ...]]],
    services: Sequence[str],
    also: set[int] | frozenset[int] = frozenset(),
) -> list[int]:
    """The rows (``index -> (provides, inject)``) providing ``services``, the rows ``also``, and,
    transitively, what they inject; ascending."""
    wanted, keep = set(services), set(also)
    for index in also:
        wanted.update(services_of[index][1])
    grown = True
    while grown:
        grown = False
        for index, (provides, inject) in services_of.items():
            if index not in keep and wanted.intersection(provides):
                keep.add(index)
                wanted.update(inject)
                grown = True
    return sorted(keep)


# -- booting ---------------------------------------------------------------------


def assign_ids(rows: Sequence[LocatedRow]) -> list[str]:
    ids: list[str] = []
    seen: dict[str, str] = {}
    for located in rows:
        row_id = located.row.id or os.urandom(4).hex()
        if row_id in seen:
            raise DuplicateRowIdError(
                f"duplicate loader entry id: {row_id} ({seen[row_id]} and {located.where}); "
                "give each row a unique `id`"
            )
        seen[row_id] = located.where
        ids.append(row_id)
    return ids


def _locate(rows: Sequence[Row | LocatedRow]) -> list[LocatedRow]:
    return [
        r if isinstance(r, LocatedRow) else LocatedRow(r, f"row {i + 1} ({r.name})")
        for i, r in enumerate(rows)
    ]


class PluginHost(Host):
    """A :class:`Host` that also keeps the pluggy manager of its rows."""

    def __init__(self, task_group: Any) -> None:
        super().__init__(task_group)
        self.plugin_manager = _make_plugin_manager()

    async def mount(self, rows: Sequence[Row | LocatedRow]) -> None:
        """Validate every row first (all-or-nothing), then mount them in order."""
        located = _locate(rows)
        ids = assign_ids(located)
        taken = {fiber.id for fiber in self.fibers}
        for row_id, loc in zip(ids, located, strict=True):
            if row_id in taken:
                raise DuplicateRowIdError(f"duplicate loader entry id: {row_id} ({loc.where})")
        prepared: list[PreparedRow | tuple[str, LocatedRow]] = []
        try:
            for row_id, loc in zip(ids, located, strict=True):
                if loc.row.disabled:
                    prepared.append((row_id, loc))
                else:
                    prepared.append(prepare_row(self.plugin_manager, loc, row_id))
        except BaseException:
            for item in prepared:
                if isinstance(item, PreparedRow):
                    self.plugin_manager.unregister(item.instance)
            raise
        for item in prepared:
            if isinstance(item, PreparedRow):
                fiber = Fiber(
                    self,
                    item.row_id,
                    item.name,
                    item.instance,
                    item.config,
                    item.meta.inject,
                    item.meta.provides,
                    item.entry_point,
                )
                self.add_fiber(fiber)
                await self.settle()
            else:
                row_id, loc = item
                fiber = Fiber(self, row_id, loc.row.name, None, None, (), ())
                fiber.state = FiberState.DISABLED
                self.add_fiber(fiber)

    def problems(self) -> list[str]:
        """One line per enabled row that is not active, for the boot audit."""
        lines = []
        for fiber in self.fibers:
            if fiber.state in (FiberState.ACTIVE, FiberState.DISABLED):
                continue
            lines.append(f"row {fiber.id!r} ({fiber.plugin_name}): {fiber.describe_state()}")
        return lines

    async def close(self) -> None:
        await super().close()
        for fiber in self.fibers:
            if fiber.instance is not None and self.plugin_manager.is_registered(fiber.instance):
                self.plugin_manager.unregister(fiber.instance)


@asynccontextmanager
async def open_host(
    rows: Sequence[Row | LocatedRow] = (), *, strict: bool = True
) -> AsyncIterator[PluginHost]:
    """Boot a host from rows; dispose everything on exit.

    With ``strict`` (the default), a row that did not become active (failed
    or still waiting for a service) makes the boot fail with
    :class:`BootError` after the partial host was disposed, like DSH's boot
    audit. ``strict=False`` keeps such rows in their state for inspection
    (``dsh plugins``).
    """
    # Errors from the body or from booting are re-raised *outside* the task
    # group, so callers see the ConfigError itself rather than an
    # ExceptionGroup wrapping it.
    failure: Exception | None = None
    async with anyio.create_task_group() as task_group:
        host = PluginHost(task_group)
        try:
            await host.mount(rows)
            problems = host.problems()
            if strict and problems:
                noun = "entry" if len(problems) == 1 else "entries"
                raise BootError(
                    f"{len(problems)} {noun} did not activate:\n  " + "\n  ".join(problems),
                    problems,
                )
            yield host
        except Exception as exc:
            failure = exc
        finally:
            await host.close()
            task_group.cancel_scope.cancel()
    if failure is not None:
        raise failure


def open_host_from_yaml(
    path: str | os.PathLike[str], *, strict: bool = True
) -> Any:
    """``open_host`` over the rows of a YAML file."""
    return open_host(load_rows(path), strict=strict)

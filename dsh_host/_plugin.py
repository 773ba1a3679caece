"""What a plugin is, as far as the host is concerned.

A plugin is a class (the value of an entry point in the ``dsh.plugins``
group). The host instantiates it once per YAML row, registers the instance
with pluggy under the row id, and calls its ``dsh_apply`` hook with a
:class:`~dsh_host._context.Context` and the row's validated config. pluggy
hooks are synchronous, so they carry only metadata and ``apply``; every async
chain lives on the host's :class:`~dsh_host._bus.EventBus`.

Most plugins subclass :class:`Plugin` and write ``apply``::

    class Greeter(Plugin):
        name = "greeter"
        Config = GreeterConfig          # a msgspec.Struct, validated at load
        inject = ("tools",)             # apply runs only while these are live
        provides = ()                   # services this plugin provides

        def apply(self, ctx: Context, config: GreeterConfig) -> None:
            ctx.on(TOOLS_EXECUTE, self.around_execute)   # a typed key: mypy checks the listener

Mistakes are caught at registration (pluggy's lesson): a misspelled hook
implementation, a ``Config`` that is not a msgspec Struct, a ``provides``
that is not a tuple of names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import msgspec
import pluggy

if TYPE_CHECKING:
    from ._context import Context

PROJECT = "dsh"
_hookspec = pluggy.HookspecMarker(PROJECT)
#: Marks ``dsh_plugin_meta`` / ``dsh_apply`` of a plugin object that does not subclass
#: :class:`Plugin`. pluggy checks them at registration; it does not dispatch dsh's events
#: (docs/design.md).
hookimpl = pluggy.HookimplMarker(PROJECT)


class NoConfig(msgspec.Struct, forbid_unknown_fields=True):
    """The config type of plugins that take no configuration."""


class ModelRoute(msgspec.Struct, frozen=True):
    """A model adapter's ``--model PREFIX:MODEL`` spelling, declared by its plugin.

    ``dsh run --model anthropic:claude-sonnet-4-5``, ``Agent(model=...)`` and ``dsh serve
    --model`` compose a row of the declaring plugin (row id ``model``) with ``{"model":
    MODEL}`` and route the agent to ``provider`` (the route the row registers by default).
    Declared by the plugin, so adding a provider needs no edit of the front doors.
    """

    #: the text before the colon (``anthropic``)
    prefix: str
    #: the provider route the row registers when its config names none
    provider: str


class StoreUrl(msgspec.Struct, frozen=True):
    """A session store addressed by URL, declared by its plugin.

    ``Agent(store="postgresql://...")`` composes a row of the declaring plugin (row id
    ``session-persistence``) with ``{key: URL}`` when the URL's scheme is one of ``schemes``;
    any other ``store=`` is a directory for the default file store. Declared by the plugin, so
    adding a URL-addressed store needs no edit of the front door.
    """

    #: the URL schemes it takes (``postgresql`` for ``postgresql://...``)
    schemes: tuple[str, ...]
    #: the config key the URL goes in (``dsn``)
    key: str


class RunTermKeys(msgspec.Struct, frozen=True, kw_only=True):
    """Which config keys of a row carry a session's run terms (D22), declared by its plugin.

    A session runs under terms decided once and recorded in its log: the workspace, the
    sandbox mode and network, the approval policy and what an unanswered ask becomes. Every
    entry point (``dsh run`` flags, ``dsh serve``, a resumed session's recorded terms, the
    Python ``Agent``) writes a term into the rows that declare it and reads it back from them,
    so the host names a term, never the plugin that takes it: a plugin that replaces the
    built-in tools or the approval row declares the same keys and every front door follows.
    A field left None: the row does not take that term.
    """

    #: the directory the tools work in
    workspace: str | None = None
    #: the sandbox mode of each call (``read-only``, ``workspace-write``, ...)
    sandbox: str | None = None
    #: the sandbox's network policy
    network: str | None = None
    #: the approval policy (``ask``, ``never``, ...)
    approval_policy: str | None = None
    #: what an ask nobody answers becomes (``fail``, ``deny``, ``defer``)
    unanswered: str | None = None

    def pairs(self) -> tuple[tuple[str, str], ...]:
        """``(term, config key)`` for every term the row takes."""
        return tuple(
            (term, key)
            for term in self.__struct_fields__
            if isinstance(key := getattr(self, term), str)
        )


class PluginMeta(msgspec.Struct, frozen=True):
    name: str
    inject: tuple[str, ...] = ()
    provides: tuple[str, ...] = ()
    config_type: type[msgspec.Struct] = NoConfig
    #: config keys (snake_case; the camelCase spelling is matched too) that choose an
    #: executable or code to run; honoured only from trusted config (D16)
    executable_keys: tuple[str, ...] = ()
    #: the ``--model PREFIX:MODEL`` spelling of a model adapter (None: not a model adapter)
    model_route: ModelRoute | None = None
    #: a file store's config key for its directory: ``--root DIR`` sets it (None: not one)
    root_key: str | None = None
    #: how ``Agent(store=URL)`` addresses a session store (None: not by URL)
    store_url: StoreUrl | None = None
    #: the config keys that carry a session's run terms (None: none)
    run_terms: RunTermKeys | None = None
    #: a resume that only repairs the log boots this row too (it follows every append, or it
    #: refines a repair's closers): the store and the agent alone are booted otherwise
    boots_for_repair: bool = False
    #: the row runs code or commands through the sandbox (the Python front door keeps it only
    #: when a sandbox mode is asked for)
    runs_confined: bool = False
    #: project files (``.claude/hooks.json``) the plugin reads only when trusted; ``dsh trust``
    #: takes them, checked by the plugin's ``check_trusted_file(data, path)``
    project_files: tuple[str, ...] = ()


class HookSpecs:
    """The pluggy hook specifications every dsh plugin implements."""

    @_hookspec(firstresult=True)
    def dsh_plugin_meta(self) -> PluginMeta:  # type: ignore[empty-body]
        """Static metadata: name, injected and provided services, config type."""

    @_hookspec
    def dsh_apply(self, ctx: Context, config: Any) -> None:
        """Register listeners and services on ``ctx``. Runs once per activation."""


class Plugin:
    """Convenience base class: metadata as class attributes, ``apply`` as a method."""

    name: ClassVar[str] = ""
    inject: ClassVar[tuple[str, ...]] = ()
    provides: ClassVar[tuple[str, ...]] = ()
    Config: ClassVar[type[msgspec.Struct]] = NoConfig
    executable_keys: ClassVar[tuple[str, ...]] = ()
    model_route: ClassVar[ModelRoute | None] = None
    #: a session store that keeps its logs under a directory names the config key for it;
    #: ``dsh run/chat/sessions --root DIR`` sets that key on the row (no host edit per store)
    root_key: ClassVar[str | None] = None
    #: a session store addressed by URL (``store="postgresql://..."``) says how
    store_url: ClassVar[StoreUrl | None] = None
    #: the config keys that carry a session's run terms (workspace, sandbox mode, network,
    #: approval policy): every front door writes and reads the terms through them
    run_terms: ClassVar[RunTermKeys | None] = None
    #: True for a row a repair-only resume must boot too: one that follows every append
    #: (a trace exporter: the closers must reach it) or refines the closers (sub-agents)
    boots_for_repair: ClassVar[bool] = False
    #: True for a row that runs code or commands through the sandbox (tools, a skill's
    #: scripts, command hooks): ``Agent(...)`` keeps it only when ``sandbox=`` is given
    runs_confined: ClassVar[bool] = False
    #: project files the plugin reads only when ``dsh trust`` recorded them (paths relative to
    #: the project directory); the class then has ``check_trusted_file(data, path)``
    project_files: ClassVar[tuple[str, ...]] = ()

    @hookimpl
    def dsh_plugin_meta(self) -> PluginMeta:
        return PluginMeta(
            name=self.name or type(self).__name__,
            inject=tuple(self.inject),
            provides=tuple(self.provides),
            config_type=self.Config,
            executable_keys=tuple(self.executable_keys),
            model_route=self.model_route,
            root_key=self.root_key,
            store_url=self.store_url,
            run_terms=self.run_terms,
            boots_for_repair=self.boots_for_repair,
            runs_confined=self.runs_confined,
            project_files=tuple(self.project_files),
        )

    @hookimpl
    def dsh_apply(self, ctx: Context, config: Any) -> None:
        self.apply(ctx, config)

    def apply(self, ctx: Context, config: Any) -> None:
        """Override: register what the plugin contributes. Undone on dispose."""
        raise NotImplementedError(f"plugin {type(self).__name__} does not implement apply()")

    def list_stored(self, config: Any, unreadable: list[Any]) -> list[Any] | None:
        """Optional, for a ``sessionPersistence`` provider: every stored session's header
        (``SessionListing``, as its service's ``list(unreadable=...)`` answers, damaged ones
        appended to ``unreadable`` as ``UnreadableListing``), read synchronously with the row's
        validated ``config`` and nothing applied: no host, no event loop, no other row. ``dsh
        sessions list`` lists this way and boots the composition only for a log it must read
        (docs/decisions.md D39). It must be the very read the service's ``list`` does, not a
        second one. None (the default): not offered; the caller boots the row and asks the
        service."""
        return None

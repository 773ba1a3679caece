"""The ``session-persistence-jsonl`` plugin: the backend as a service, bound to live sessions.

Live sessions are persisted by the session layer's binder
(:mod:`dsh_host._persistence.binding`): ``session/created`` binds the session to a
write handle (the one a resumer already opened, else a fresh ``create``, else
— for a log already on disk — an ``open(id, "write")`` whose stored prefix the
live session must reproduce), ``session/event`` buffers each committed event
(the fixed 200 ms window starts with the first one), ``session/flush`` drains
now, ``session/disposed`` drains and releases, and plugin disposal drains every
handle. A binding failure is raised by the session's next flush (fail closed).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Annotated, Any, Literal

import msgspec

from dsh_host.sdk import (
    Context,
    Plugin,
    SessionListing,
    UnreadableListing,
    default_session_root,
    offload,
)

from ._layout import JsonlLayout

if TYPE_CHECKING:  # a listing needs no writer: write_behind is not imported (D44)
    from dsh_host.sdk import Spawn

__all__ = ["JsonlConfig", "SessionPersistenceJsonl"]


class JsonlConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Config of a ``session-persistence-jsonl`` row."""

    #: Root directory of all session logs (``~`` expanded, a relative path resolved against the
    #: process cwd at load). Unset: ``$DSH_SESSION_ROOT``, else ``$XDG_DATA_HOME/dsh/sessions``
    #: (``~/.local/share/dsh/sessions``): outside every workspace (D15).
    root: str | None = None
    #: ``zstd`` (default): one checksummed Zstandard frame per durable batch;
    #: ``none``: raw JSONL lines. One root holds one encoding.
    compression: Literal["zstd", "none"] = "zstd"
    #: A barrier (compress + write + fsync of one batch) runs on the event loop instead of a
    #: worker thread when no other barrier work is in flight, the previous barrier of the run
    #: was this storage's, and recent barriers took at most this many milliseconds (a thread
    #: hop costs ~0.1 ms; a fast disk's fsync 0.15-0.6 ms). 0: always on a worker thread.
    #: The format new sessions are written in: ``v3`` (default; DSH 0.1.5-0.1.6 read it) or
    #: ``v4`` (DSH 0.1.7 and later). A session on disk keeps its own format (README).
    format: Literal["v3", "v4"] = "v3"
    inline_barrier_ms: Annotated[float, msgspec.Meta(ge=0, le=1000)] = (
        offload.DEFAULT_INLINE_BUDGET * 1000
    )


class SessionPersistenceJsonl(Plugin):
    """Entry point ``session-persistence-jsonl``: provides ``sessionPersistence``."""

    name = "session-persistence-jsonl"
    provides = ("sessionPersistence",)
    inject = ("sessions",)
    root_key = "root"
    Config = JsonlConfig

    def apply(self, ctx: Context, config: Any) -> None:
        assert isinstance(config, JsonlConfig)
        from dsh_host.sdk import wire_storage  # here: a listing binds nothing (D39, D44)

        from ._backend import JsonlSessionPersistence  # here: a listing needs no writer (D39)

        def service(spawn: Spawn, logger: logging.Logger) -> JsonlSessionPersistence:
            return JsonlSessionPersistence(
                default_session_root() if config.root is None else config.root,
                config.compression,
                spawn=spawn,
                logger=logger,
                inline_barrier=config.inline_barrier_ms / 1000,
                write_version=4 if config.format == "v4" else 3,
            )

        wire_storage(ctx, name=self.name, service=service)

    def list_stored(
        self, config: Any, unreadable: list[UnreadableListing]
    ) -> list[SessionListing]:
        """The service's ``list(unreadable=...)`` without booting: the same synchronous read
        (``JsonlLayout.list_sync``, which the service's storage runs on a worker thread), on
        this thread, with none of the writer imported (docs/decisions.md D39)."""
        assert isinstance(config, JsonlConfig)
        layout = JsonlLayout(
            default_session_root() if config.root is None else config.root, config.compression
        )
        return layout.list_sync(unreadable)

"""``session-persistence-jsonl``: DSH's v3 on-disk session log (``sessionPersistence``).

See README.md (what it provides, config, limits) and docs/format.md (the
format and the crash-safety protocol).

Names are imported on first use (PEP 562): ``dsh sessions list`` resolves the plugin class and
lists with :mod:`._layout` alone, without the writer, its locks and its event-loop lane
(docs/decisions.md D39).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dsh_host.sdk import lazy_names

if TYPE_CHECKING:
    from ._backend import (
        LIVE_WRITE_BATCH_MAX_DELAY,
        JsonlLease,
        JsonlSessionPersistence,
        JsonlStorage,
    )
    from ._paths import CURRENT_VERSION, encode_segment, generation_filename, project_key
    from ._plugin import JsonlConfig, SessionPersistenceJsonl

__all__ = [
    "CURRENT_VERSION",
    "LIVE_WRITE_BATCH_MAX_DELAY",
    "JsonlConfig",
    "JsonlLease",
    "JsonlSessionPersistence",
    "JsonlStorage",
    "SessionPersistenceJsonl",
    "encode_segment",
    "generation_filename",
    "project_key",
]

#: Each public name -> the module (of this package) that defines it.
_DEFINED_IN = {
    "LIVE_WRITE_BATCH_MAX_DELAY": "_backend",
    "JsonlLease": "_backend",
    "JsonlSessionPersistence": "_backend",
    "JsonlStorage": "_backend",
    "CURRENT_VERSION": "_paths",
    "encode_segment": "_paths",
    "generation_filename": "_paths",
    "project_key": "_paths",
    "JsonlConfig": "_plugin",
    "SessionPersistenceJsonl": "_plugin",
}


__getattr__ = lazy_names(__name__, _DEFINED_IN)


def __dir__() -> list[str]:
    return sorted({*globals(), *_DEFINED_IN})

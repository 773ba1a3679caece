"""``session-persistence-jsonl``: DSH's v3 on-disk session log (``sessionPersistence``).

See README.md (what it provides, config, limits) and docs/format.md (the
format and the crash-safety protocol).
"""

from ._backend import (
    LIVE_WRITE_BATCH_MAX_DELAY,
    JsonlLease,
    JsonlSessionPersistence,
    JsonlStorage,
)
from ._lock import SessionLockUnsafeError
from ._paths import CURRENT_VERSION, encode_segment, generation_filename, project_key
from ._plugin import JsonlConfig, SessionPersistenceJsonl

__all__ = [
    "CURRENT_VERSION",
    "LIVE_WRITE_BATCH_MAX_DELAY",
    "JsonlConfig",
    "JsonlLease",
    "JsonlSessionPersistence",
    "JsonlStorage",
    "SessionLockUnsafeError",
    "SessionPersistenceJsonl",
    "encode_segment",
    "generation_filename",
    "project_key",
]

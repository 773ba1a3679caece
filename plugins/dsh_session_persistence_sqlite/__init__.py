"""``session-persistence-sqlite``: session logs in one SQLite file (WAL, ``synchronous=FULL``).

The worked example of the storage seam (docs/storage.md); see README.md.
"""

from ._storage import SCHEMA_VERSION, SqliteLease, SqliteStorage
from .plugin import SessionPersistenceSqlite, SqliteConfig, SqliteSessionPersistence

__all__ = [
    "SCHEMA_VERSION",
    "SessionPersistenceSqlite",
    "SqliteConfig",
    "SqliteLease",
    "SqliteSessionPersistence",
    "SqliteStorage",
]

"""``session-persistence-postgres``: session logs in PostgreSQL, shared by many machines.

The same persistence seam as ``session-persistence-jsonl`` (D7, D12):
lazy materialization, a 200 ms write-behind window, ``flush`` as the durability
barrier (one ``synchronous_commit = on`` transaction), contiguity enforced by
the database, and single-writer ownership through a session-level advisory lock
held by the writer's own connection. See README.md.
"""

from dsh_host.sdk import require_extra

with require_extra("postgres"):
    from ._backend import (
        PostgresLease,
        PostgresSessionPersistence,
        PostgresStorage,
        SessionStoreUnavailableError,
    )
    from ._schema import SCHEMA_VERSION, advisory_key
    from .plugin import PostgresConfig, SessionPersistencePostgres

__all__ = [
    "SCHEMA_VERSION",
    "PostgresConfig",
    "PostgresLease",
    "PostgresSessionPersistence",
    "PostgresStorage",
    "SessionPersistencePostgres",
    "SessionStoreUnavailableError",
    "advisory_key",
]

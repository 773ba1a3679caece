"""The database schema: tables, the append-only rules, and versioned migration.

Everything lives in one PostgreSQL schema (``dsh`` by default; tests use a
random one), so several stores can share a database without seeing each other::

    <schema>.meta      key/value: schema_version, store_id
    <schema>.sessions  one row per published session: id, header (JSON text), created_at
    <schema>.events    one row per event: (session_id, seq) primary key, event (JSON text)

Why the database itself enforces the log's shape:

* ``events_pkey (session_id, seq)`` — a seq is written at most once. Two
  writers racing for the same seq cannot both commit.
* ``events_prev_fkey (session_id, prev_seq) → events (session_id, seq)``, with
  ``prev_seq`` generated as ``seq - 1`` (NULL for seq 0) — every event after the
  first needs its predecessor. With the primary key this makes each session's
  rows exactly ``0..n-1``: an insert at any seq other than the stored next seq
  is refused by a constraint, not by a client-side check.
* ``events_session_fkey`` — events need a published header.
* Statement triggers refuse ``UPDATE``, ``DELETE`` and ``TRUNCATE`` on both
  tables: a published header and a stored event never change.

The event column is ``text`` holding exactly the JSON the session core
encoded, not ``jsonb``. ``jsonb`` is not lossless for this log: it refuses
lone surrogates and ``\\u0000`` inside strings (both valid in a session log,
as JSON allows) and does not keep key order; it is also slower to insert and to read
back (bench/postgres_vs_jsonl.py measures it: see the plugin README).

Migration runs on first use, in one transaction holding a transaction-level
advisory lock on the schema name, so concurrent first users serialize and
exactly one applies each step. A schema newer than this build is refused.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal

import psycopg
from psycopg import sql

from dsh_host.sdk import SessionFormatUnsupportedError

__all__ = [
    "SCHEMA_VERSION",
    "EventStorage",
    "SchemaInfo",
    "advisory_key",
    "ensure_schema",
    "read_schema_info",
]

#: The schema version this build creates and reads.
SCHEMA_VERSION: Final = 1

#: How the event JSON is stored. ``text`` is the only lossless choice and the
#: default; ``jsonb`` exists so the benchmark can measure it (see the module docstring).
EventStorage = Literal["text", "jsonb"]


@dataclass(frozen=True, slots=True)
class SchemaInfo:
    """What a store's ``meta`` table says."""

    version: int
    #: Random id minted when the schema was created: distinguishes stores in revisions
    #: and in advisory-lock keys (advisory locks are per database, not per schema).
    store_id: str
    storage: EventStorage


def advisory_key(*parts: str) -> int:
    """A signed 64-bit advisory-lock key for ``parts`` (BLAKE2b, NUL-separated).

    Two different sessions share a key only by a 64-bit hash collision (for a
    million sessions, a chance of about 3 in 10^8); the cost would be a spurious
    ``SessionAlreadyOwnedError`` while both are open, never two writers.
    """
    digest = hashlib.blake2b("\0".join(parts).encode("utf-8", "surrogatepass"), digest_size=8)
    return int.from_bytes(digest.digest(), "big", signed=True)


def _v1(schema: sql.Identifier, storage: EventStorage) -> list[sql.Composed]:
    event_type = sql.SQL(storage)
    return [
        sql.SQL(
            """CREATE TABLE {s}.sessions (
                id text NOT NULL,
                header text NOT NULL,
                created_at bigint NOT NULL,
                CONSTRAINT sessions_pkey PRIMARY KEY (id)
            )"""
        ).format(s=schema),
        sql.SQL(
            """CREATE TABLE {s}.events (
                session_id text NOT NULL,
                seq bigint NOT NULL,
                prev_seq bigint GENERATED ALWAYS AS (NULLIF(seq, 0) - 1) STORED,
                event {t} NOT NULL,
                CONSTRAINT events_pkey PRIMARY KEY (session_id, seq),
                CONSTRAINT events_seq_range CHECK (seq >= 0 AND seq <= 9007199254740991),
                CONSTRAINT events_session_fkey FOREIGN KEY (session_id)
                    REFERENCES {s}.sessions (id),
                CONSTRAINT events_prev_fkey FOREIGN KEY (session_id, prev_seq)
                    REFERENCES {s}.events (session_id, seq)
            )"""
        ).format(s=schema, t=event_type),
        sql.SQL(
            """CREATE FUNCTION {s}.refuse_mutation() RETURNS trigger
               LANGUAGE plpgsql AS $$
               BEGIN
                   RAISE EXCEPTION 'dsh session logs are append-only: % on %.% refused',
                       TG_OP, TG_TABLE_SCHEMA, TG_TABLE_NAME
                       USING ERRCODE = 'restrict_violation';
               END $$"""
        ).format(s=schema),
        sql.SQL(
            """CREATE TRIGGER sessions_append_only
               BEFORE UPDATE OR DELETE OR TRUNCATE ON {s}.sessions
               FOR EACH STATEMENT EXECUTE FUNCTION {s}.refuse_mutation()"""
        ).format(s=schema),
        sql.SQL(
            """CREATE TRIGGER events_append_only
               BEFORE UPDATE OR DELETE OR TRUNCATE ON {s}.events
               FOR EACH STATEMENT EXECUTE FUNCTION {s}.refuse_mutation()"""
        ).format(s=schema),
    ]


#: version → statements that bring the schema from version - 1 to version.
_MIGRATIONS: Final[dict[int, Callable[[sql.Identifier, EventStorage], list[sql.Composed]]]] = {
    1: _v1,
}


def _info(rows: list[tuple[Any, ...]]) -> dict[str, str]:
    return {str(key): str(value) for key, value in rows}


def read_schema_info(conn: psycopg.Connection[Any], schema: str) -> SchemaInfo | None:
    """The store's meta, or None when the schema has not been created (blocking)."""
    ident = sql.Identifier(schema)
    exists = conn.execute(
        "SELECT to_regclass(format('%%I.meta', %s::text)) IS NOT NULL", (schema,)
    ).fetchone()
    if not exists or not exists[0]:
        return None
    query = sql.SQL("SELECT key, value FROM {s}.meta").format(s=ident)
    meta = _info(conn.execute(query).fetchall())
    if "schema_version" not in meta:
        return None
    return _checked(meta, schema)


def _checked(meta: dict[str, str], schema: str) -> SchemaInfo:
    version = int(meta["schema_version"])
    if version > SCHEMA_VERSION:
        raise SessionFormatUnsupportedError(
            f'PostgreSQL schema "{schema}" is at dsh schema version {version}, newer than the '
            f"version {SCHEMA_VERSION} this harness reads: it was migrated by a newer harness — "
            "upgrade the harness to use it",
            location=schema,
        )
    storage = meta.get("event_storage", "text")
    if storage not in ("text", "jsonb"):
        raise SessionFormatUnsupportedError(
            f'PostgreSQL schema "{schema}" stores events as "{storage}", which this harness '
            "does not read",
            location=schema,
        )
    return SchemaInfo(version=version, store_id=meta["store_id"], storage=storage)  # type: ignore[arg-type]


def ensure_schema(
    conn: psycopg.Connection[Any], schema: str, storage: EventStorage = "text"
) -> SchemaInfo:
    """Create or migrate ``schema`` to :data:`SCHEMA_VERSION` and return its meta (blocking).

    The fast path (already current) is one read without locks. ``storage``
    only matters when the schema is created; an existing store keeps its own.
    """
    info = read_schema_info(conn, schema)
    if info is not None and info.version == SCHEMA_VERSION:
        return info
    ident = sql.Identifier(schema)
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (advisory_key("dsh-schema", schema),))
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {s}").format(s=ident))
        conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {s}.meta (key text PRIMARY KEY, value text NOT NULL)"
            ).format(s=ident)
        )
        meta = _info(
            conn.execute(sql.SQL("SELECT key, value FROM {s}.meta").format(s=ident)).fetchall()
        )
        current = int(meta.get("schema_version", "0"))
        if current > SCHEMA_VERSION:
            return _checked(meta, schema)  # raises: newer than this build
        if current == 0:
            meta["store_id"] = str(uuid.uuid4())
            meta["event_storage"] = storage
        chosen: EventStorage = meta["event_storage"]  # type: ignore[assignment]
        for version in range(current + 1, SCHEMA_VERSION + 1):
            for statement in _MIGRATIONS[version](ident, chosen):
                conn.execute(statement)
        meta["schema_version"] = str(SCHEMA_VERSION)
        for key, value in meta.items():
            conn.execute(
                sql.SQL(
                    "INSERT INTO {s}.meta (key, value) VALUES (%s, %s) "
                    "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value"
                ).format(s=ident),
                (key, value),
            )
    return _checked(meta, schema)

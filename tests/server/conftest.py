"""Fixtures of the server tests: the PostgreSQL ones are shared with tests/postgres."""

from postgres.conftest import pg_dsn, pg_prefix

__all__ = ["pg_dsn", "pg_prefix"]

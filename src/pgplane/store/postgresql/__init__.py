"""The store for a control plane of several processes: PostgreSQL (psycopg 3, async)."""

from pgplane.store.postgresql.store import PostgresStore

__all__ = ["PostgresStore"]

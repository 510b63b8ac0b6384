"""Both store backends for the tests that hold for each: a fresh SQLite file, or a fresh
database on this test process's PostgreSQL cluster (tests/pgstore.py)."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg

from pgplane.store import Store
from pgplane.store.postgresql import PostgresStore
from pgplane.store.postgresql.conn import translate
from pgplane.store.sqlite import SqliteStore
from tests.pgstore import store_cluster

BACKENDS = ("sqlite", "postgresql")

# What a unique index broken raises when SQL is sent past the store's methods.
UNIQUE_ERRORS = (sqlite3.IntegrityError, psycopg.errors.UniqueViolation)


def new_location(backend: str, tmp_path: Path) -> str | Path:
    """Where a fresh store of ``backend`` lives: a file path, or a new database's URL."""
    return tmp_path / "store.db" if backend == "sqlite" else store_cluster().database()


async def open_at(where: str | Path) -> Store:
    """A store (another process's, say) on a location from :func:`new_location`."""
    if isinstance(where, Path):
        return SqliteStore(where)
    return await PostgresStore.open(where)


def raw_sql(store: Store, sql: str, params: Sequence[Any] = ()) -> None:
    """Run SQL (SQLite's placeholders) as another program would, past the store's methods."""
    if isinstance(store, SqliteStore):
        with sqlite3.connect(store.path) as db:
            db.execute(sql, params)
        return
    assert isinstance(store, PostgresStore)
    with psycopg.connect(store.url, autocommit=True) as conn:
        psycopg.RawCursor(conn).execute(translate(sql), params)

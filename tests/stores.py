"""Both store backends for the tests that hold for each: a fresh SQLite file, or a fresh
database on this test process's PostgreSQL cluster (tests/pgstore.py); and a running server's
store read or changed past the API, whichever backend it runs on."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg

from pgplane.store import Store
from pgplane.store.postgresql import PostgresStore
from pgplane.store.postgresql.conn import translate
from pgplane.store.sqlite import SqliteStore
from tests.pgstore import store_cluster
from tests.support import Server

BACKENDS = ("sqlite", "postgresql")

# What a unique index broken raises when SQL is sent past the store's methods.
UNIQUE_ERRORS = (sqlite3.IntegrityError, psycopg.errors.UniqueViolation)


def new_location(backend: str, tmp_path: Path) -> str | Path:
    """Where a fresh store of ``backend`` lives: a file path, or a new database's URL."""
    return tmp_path / "store.db" if backend == "sqlite" else store_cluster().database()


def server_store(backend: str) -> str | None:
    """The ``store`` a new server of ``backend`` is given (``running_server(store=…)``): None,
    the SQLite file in its data directory; or a fresh database of this process's cluster."""
    return None if backend == "sqlite" else store_cluster().database()


async def open_at(where: str | Path) -> Store:
    """A store (another process's, say) on a location from :func:`new_location`."""
    if isinstance(where, Path):
        return SqliteStore(where)
    return await PostgresStore.open(where)


async def open_server_store(server: Server) -> Store:
    """The store a running server uses, opened as another process of the platform would."""
    return await open_at(server.env.get("PGPLANE_STORE") or server.data_dir / "pgplane.db")


def raw_sql(store: Store, sql: str, params: Sequence[Any] = ()) -> None:
    """Run SQL (SQLite's placeholders) as another program would, past the store's methods."""
    if isinstance(store, SqliteStore):
        with sqlite3.connect(store.path) as db:
            db.execute(sql, params)
        return
    assert isinstance(store, PostgresStore)
    with psycopg.connect(store.url, autocommit=True) as conn:
        psycopg.RawCursor(conn).execute(translate(sql), params)


class StoreSQL:
    """A server's store as a plain connection, for what a test reads or changes past the API:
    statements in SQLite's placeholders, run on either backend (translated for PostgreSQL as
    the platform's own statements are), each committed on its own."""

    def __init__(self, server: Server) -> None:
        self._url = server.env.get("PGPLANE_STORE")
        self._path = server.data_dir / "pgplane.db"

    @contextlib.contextmanager
    def _cursor(self) -> Iterator[Any]:
        if self._url:
            with psycopg.connect(self._url, autocommit=True) as conn:
                yield psycopg.RawCursor(conn)
            return
        # The server writes meanwhile: wait for its writer as its own connections do.
        db = sqlite3.connect(self._path, timeout=10)
        try:
            with db:
                yield db.cursor()
        finally:
            db.close()

    def _sql(self, sql: str) -> str:
        return translate(sql) if self._url else sql

    def rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._cursor() as cur:
            cur.execute(self._sql(sql), list(params))
            return [tuple(r) for r in cur.fetchall()]

    def one(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        found = self.rows(sql, params)
        return found[0] if found else None

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        with self._cursor() as cur:
            cur.execute(self._sql(sql), list(params))


def store_sql(server: Server) -> StoreSQL:
    return StoreSQL(server)

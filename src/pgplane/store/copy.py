"""Copying a SQLite store into an empty PostgreSQL one, so a single-machine platform can grow
without starting over.

Both are first brought to the current schema (the same migrations, so the same tables and
columns: tests/unit/test_store_schema.py). The SQLite side is read in one transaction (one
snapshot, whatever else has the file open); the PostgreSQL side is written in one transaction,
holding the writers' lock, and only into a store that holds nothing yet: a copy lands whole or
not at all, and never mixes with a running platform's data. Tables go parents first, by COPY;
the ids the store assigns (API keys, databases) continue after the copied ones; every table's
row count is checked before the commit.
"""

from __future__ import annotations

import logging
import sqlite3
from graphlib import TopologicalSorter
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from pgplane.errors import Conflict, NotFound
from pgplane.store.postgresql.conn import configure_types
from pgplane.store.postgresql.migrate import WRITE_LOCK
from pgplane.store.postgresql.migrate import migrate as pg_migrate
from pgplane.store.sqlite.migrate import migrate as sqlite_migrate

log = logging.getLogger(__name__)

# Bookkeeping, not data: each store keeps its own.
_SKIPPED = {"schema_migrations", "health"}
_BATCH = 1000


def _tables(db: sqlite3.Connection) -> list[str]:
    """The data tables, each after the tables it refers to."""
    names = [
        r[0]
        for r in db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        )
        if r[0] not in _SKIPPED
    ]
    graph = {
        name: {fk[2] for fk in db.execute(f"PRAGMA foreign_key_list({name})")} - {name}
        for name in names
    }
    return list(TopologicalSorter(graph).static_order())


def _value(v: Any) -> Any:
    # JSON columns were written as bytes (msgspec's encoding): SQLite kept them as blobs.
    return v.decode() if isinstance(v, bytes) else v


def _open_sqlite(source: Path) -> sqlite3.Connection:
    try:  # never create an empty store where the path is wrong
        uri = f"{source.absolute().as_uri()}?mode=rw"
        return sqlite3.connect(uri, uri=True, isolation_level=None)
    except sqlite3.OperationalError:
        raise NotFound(f"no SQLite store at {source}") from None


async def copy_store(source: Path, target_url: str) -> dict[str, int]:
    """Copy every row; returns the number of rows per table. (A CLI's work: the SQLite side
    runs on the event loop, with nothing else to serve.)"""
    db = _open_sqlite(source)
    try:
        sqlite_migrate(db)
        db.execute("BEGIN")  # one snapshot for every table
        tables = _tables(db)
        async with await psycopg.AsyncConnection.connect(
            target_url, autocommit=True, connect_timeout=10
        ) as conn:
            configure_types(conn)
            await pg_migrate(conn)
            async with conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock(%s)", (WRITE_LOCK,))
                for table in tables:
                    q = sql.SQL("SELECT EXISTS (SELECT 1 FROM {})").format(sql.Identifier(table))
                    row = await (await conn.execute(q)).fetchone()
                    if row and row[0]:
                        raise Conflict(
                            f"the PostgreSQL store already holds data (table {table}):"
                            " copy only into an empty one"
                        )
                counts = {t: await _copy_table(db, conn, t) for t in tables}
                await _continue_ids(conn, tables)
        db.execute("COMMIT")
    finally:
        db.close()
    return counts


async def _copy_table(
    db: sqlite3.Connection, conn: psycopg.AsyncConnection[Any], table: str
) -> int:
    columns = [r[1] for r in db.execute(f"PRAGMA table_info({table})")]
    listed = sql.SQL(", ").join(map(sql.Identifier, columns))
    copy_sql = sql.SQL("COPY {} ({}) FROM STDIN").format(sql.Identifier(table), listed)
    select = f"SELECT {', '.join(columns)} FROM {table}"  # noqa: S608 - our own schema's names
    rows = db.execute(select)
    copied = 0
    async with conn.cursor().copy(copy_sql) as copy:
        while batch := rows.fetchmany(_BATCH):
            for row in batch:
                await copy.write_row([_value(v) for v in row])
            copied += len(batch)
    q = sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table))
    stored = await (await conn.execute(q)).fetchone()
    if stored is None or stored[0] != copied:
        raise RuntimeError(f"{table}: {copied} rows read, {stored} stored")
    log.info("copied %d rows of %s", copied, table)
    return copied


async def _continue_ids(conn: psycopg.AsyncConnection[Any], tables: list[str]) -> None:
    """Ids the store assigns start after the largest copied one."""
    cur = await conn.execute(
        "SELECT table_name, column_name FROM information_schema.columns"
        " WHERE table_schema = current_schema() AND is_identity = 'YES'"
    )
    for table, column in await cur.fetchall():
        if table not in tables:
            continue
        q = sql.SQL(
            "SELECT setval(pg_get_serial_sequence({t}, {c}), max({ci})) FROM {ti}"
            " HAVING count(*) > 0"
        ).format(
            t=sql.Literal(table),
            c=sql.Literal(column),
            ci=sql.Identifier(column),
            ti=sql.Identifier(table),
        )
        await conn.execute(q)

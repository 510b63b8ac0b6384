"""What the statements of every aggregate share: the connection they run on, JSON columns,
unique-index conflicts.

The statements (one mixin per aggregate, in this folder) are written once, in the SQL that
SQLite and PostgreSQL both accept, with ``?`` and ``?N`` placeholders, and run on a
:class:`Conn`: :class:`SqliteConn` here, :class:`pgplane.store.postgresql.conn.PgConn` for
PostgreSQL (which rewrites the placeholders). So both backends read and write the same way,
aggregate by aggregate; a backend overrides a method only where the engines differ on purpose
(a claim takes ``FOR UPDATE SKIP LOCKED`` on PostgreSQL).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

import msgspec

from pgplane.errors import AlreadyExists, Conflict
from pgplane.store.sqlite.memo import ReadMemo

_json_encode = msgspec.json.encode
_json_decode = msgspec.json.decode

# What a unique index broken raises: a fixed error, or one chosen by the index's description
# (SQLite's message, "UNIQUE constraint failed: endpoints.port"; PostgreSQL's constraint name,
# "endpoints_unique_port": both name the column).
Conflicting = Conflict | Callable[[str], Conflict]


class Rows(Protocol):
    """What a statement returns: its rows, or how many it changed."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...


class Conn(Protocol):
    """One transaction's connection, as the statements see it."""

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> Rows: ...

    async def one(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """The first row, or None."""
        ...

    async def all(self, sql: str, params: Sequence[Any] = ()) -> list[Any]: ...

    async def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None: ...

    async def write(self, sql: str, params: Sequence[Any], conflict: Conflicting) -> Rows:
        """Execute an INSERT or UPDATE; a unique index it breaks raises ``conflict``.

        The indexes are the guarantee (two requests racing for one name both pass any check made
        before): whatever the services checked, a duplicate ends here as a 409, never a 500.
        """
        ...

    async def write_one(self, sql: str, params: Sequence[Any], conflict: Conflicting) -> Any:
        """:meth:`write` for a statement that returns a row (``RETURNING``)."""
        ...


def conflict_for(conflict: Conflicting, index: str) -> Conflict:
    return conflict if isinstance(conflict, Conflict) else conflict(index)


def _unique_violation(exc: sqlite3.IntegrityError) -> bool:
    """A unique index or primary key broken (not a foreign key or NOT NULL: those are bugs)."""
    return exc.sqlite_errorcode in (
        sqlite3.SQLITE_CONSTRAINT_UNIQUE,
        sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY,
    )


class SqliteConn:
    """The SQLite connection as a :class:`Conn`: each statement runs at once, on the event loop
    (tens of microseconds; the coroutine never suspends, so no other task runs in between)."""

    __slots__ = ("_c",)

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._c = conn

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> Rows:
        return self._c.execute(sql, params)

    async def one(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self._c.execute(sql, params).fetchone()

    async def all(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        return self._c.execute(sql, params).fetchall()

    async def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        self._c.executemany(sql, rows)

    async def write(self, sql: str, params: Sequence[Any], conflict: Conflicting) -> Rows:
        try:
            return self._c.execute(sql, params)
        except sqlite3.IntegrityError as exc:
            if _unique_violation(exc):
                raise conflict_for(conflict, str(exc)) from exc
            raise

    async def write_one(self, sql: str, params: Sequence[Any], conflict: Conflicting) -> Any:
        # The row is read inside the try: SQLite checks a RETURNING statement's constraints as it
        # steps it, so a violation may surface with the first row.
        try:
            return self._c.execute(sql, params).fetchone()
        except sqlite3.IntegrityError as exc:
            if _unique_violation(exc):
                raise conflict_for(conflict, str(exc)) from exc
            raise


def _taken(kind: str, name: str) -> AlreadyExists:
    """Neon's message, the name quoted as Go's %q does: ``role already exists; role_name:"x"``."""
    quoted = json.dumps(name, ensure_ascii=False)
    return AlreadyExists(kind, f"{kind} already exists; {kind}_name:{quoted}")


class Statements:
    """The connection every mixin of :class:`~pgplane.store.sqlite.tx.SqliteTx` runs on, and,
    on SQLite's reader alone, the answers kept of its hottest reads (``memo.py``)."""

    _c: Conn
    _memo: ReadMemo | None = None

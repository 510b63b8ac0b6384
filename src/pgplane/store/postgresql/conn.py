"""The shared statements on a psycopg connection: placeholders, parameters and errors.

The statements (``pgplane.store.sqlite``'s mixins) are written once, in the SQL both engines
accept, with SQLite's placeholders. Here they run on PostgreSQL through a small, explicit
translation, done once per statement text:

- ``?N`` becomes ``$N`` and a bare ``?`` the number SQLite gives it (one more than the largest
  number before it), so a parameter named twice is sent once (psycopg's raw cursor);
- ``IS ?`` becomes ``IS NOT DISTINCT FROM $N`` (SQLite's null-safe comparison);
- parameters: a ``bool`` is sent as the integer the column holds (the schema keeps SQLite's
  integers for flags), ``bytes`` (our JSON columns, encoded by msgspec) as text; a text with a
  NUL character, which PostgreSQL cannot store (names refuse control characters before, but
  not every field a client sets is a name), is a 400;
- results: ``numeric`` (what ``sum()`` of bigints is in PostgreSQL; the schema has no numeric
  column) comes back as an ``int`` when whole, as SQLite gives it.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
from decimal import Decimal
from typing import Any

import psycopg
from psycopg import errors
from psycopg.adapt import Buffer, Loader

from pgplane.errors import BadRequest
from pgplane.store.sqlite.common import Conflicting, Rows, conflict_for

_IS_PARAM = re.compile(r"\bIS\s+\?")
_PARAM = re.compile(r"\?(\d*)|'[^']*'")


@functools.lru_cache(maxsize=1024)
def translate(sql: str) -> str:
    """SQLite's placeholders as PostgreSQL's (``$N``); literals are left alone."""
    sql = _IS_PARAM.sub("IS NOT DISTINCT FROM ?", sql)
    largest = 0

    def number(m: re.Match[str]) -> str:
        nonlocal largest
        if m.group(0).startswith("'"):
            return m.group(0)
        n = int(m.group(1)) if m.group(1) else largest + 1
        largest = max(largest, n)
        return f"${n}"

    return _PARAM.sub(number, sql)


def _param(value: Any) -> Any:
    kind = type(value)
    if kind is str:
        if "\x00" in value:  # PostgreSQL's text cannot hold it: the client's error, not a 500
            raise BadRequest("text must not contain NUL characters")
        return value
    if kind is bool:
        return int(value)
    if kind is bytes:
        return value.decode()
    return value


class _WholeNumeric(Loader):
    """``numeric`` as ``int`` when it has no fraction (a ``sum()``), else ``float``."""

    def load(self, data: Buffer) -> Any:
        d = Decimal(bytes(data).decode())
        return int(d) if d == d.to_integral_value() else float(d)


def configure_types(conn: psycopg.AsyncConnection[Any]) -> None:
    conn.adapters.register_loader("numeric", _WholeNumeric)


class _Buffered:
    """A statement's rows, fetched at once (``Rows``)."""

    __slots__ = ("_rows", "rowcount")

    def __init__(self, rows: list[Any], rowcount: int) -> None:
        self._rows = rows
        self.rowcount = rowcount

    def fetchone(self) -> Any:
        return self._rows[0] if self._rows else None

    def fetchall(self) -> list[Any]:
        return self._rows


def unique_index(exc: errors.UniqueViolation) -> str:
    return exc.diag.constraint_name or ""


class PgConn:
    """A psycopg connection as a :class:`pgplane.store.sqlite.common.Conn`.

    ``before`` runs once, before the first statement: the write transaction's lock
    (:mod:`pgplane.store.postgresql.store`), taken only by transactions that need it.
    """

    __slots__ = ("_before", "_conn")

    def __init__(self, conn: psycopg.AsyncConnection[Any], before: str | None = None) -> None:
        self._conn = conn
        self._before = before

    async def _cursor(self) -> psycopg.AsyncRawCursor[Any]:
        cur = psycopg.AsyncRawCursor(self._conn)
        if self._before is not None:
            before, self._before = self._before, None
            await cur.execute(before)
        return cur

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> Rows:
        cur = await self._cursor()
        await cur.execute(translate(sql), [_param(p) for p in params])
        rows = await cur.fetchall() if cur.description is not None else []
        return _Buffered(rows, cur.rowcount)

    async def one(self, sql: str, params: Sequence[Any] = ()) -> Any:
        cur = await self._cursor()
        await cur.execute(translate(sql), [_param(p) for p in params])
        return await cur.fetchone()

    async def all(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        cur = await self._cursor()
        await cur.execute(translate(sql), [_param(p) for p in params])
        return await cur.fetchall()

    async def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        batch = [[_param(p) for p in row] for row in rows]
        if batch:  # psycopg refuses an empty batch; SQLite runs nothing
            cur = await self._cursor()
            await cur.executemany(translate(sql), batch)

    async def write(self, sql: str, params: Sequence[Any], conflict: Conflicting) -> Rows:
        try:
            return await self.execute(sql, params)
        except errors.UniqueViolation as exc:
            raise conflict_for(conflict, unique_index(exc)) from exc

    async def write_one(self, sql: str, params: Sequence[Any], conflict: Conflicting) -> Any:
        try:
            return await self.one(sql, params)
        except errors.UniqueViolation as exc:
            raise conflict_for(conflict, unique_index(exc)) from exc

    async def unlocked(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """The first row of a statement that needs no write lock (a compare-and-set of one row,
        whose own WHERE is its guarantee), leaving the lock for a later statement."""
        cur = psycopg.AsyncRawCursor(self._conn)
        await cur.execute(sql, [_param(p) for p in params])
        return await cur.fetchone()

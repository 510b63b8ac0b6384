"""SQLite implementation of the store contract.

One writer connection guarded by an asyncio lock (SQLite has one writer; the lock queues our own
writers without spinning on SQLITE_BUSY) and one reader connection (WAL readers never block the
writer). Statements run synchronously on the event loop: each is tens of microseconds, far less
than handing it to a thread would cost. Other processes (the CLI) wait at most ``busy_timeout``.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from pgplane.errors import Unavailable
from pgplane.store.base import Store, Tx
from pgplane.store.sqlite.migrate import migrate
from pgplane.store.sqlite.tx import SqliteTx

BUSY_TIMEOUT_MS = 5000


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    conn.execute("PRAGMA journal_mode = WAL")
    # FULL: an operation acknowledged to a client survives a power cut, not just a crash.
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("PRAGMA foreign_keys = ON")
    return conn


class SqliteStore(Store):
    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._writer = _connect(path)
        migrate(self._writer)
        self._reader = _connect(path)
        self._write_lock = asyncio.Lock()

    @asynccontextmanager
    async def read(self) -> AsyncIterator[Tx]:
        yield SqliteTx(self._reader)

    @asynccontextmanager
    async def write(self) -> AsyncIterator[Tx]:
        async with self._write_lock:
            try:
                self._writer.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                # Locked past busy_timeout by another process: a retryable condition, not a bug.
                raise Unavailable(
                    "the platform's store is busy; retry shortly", headers={"Retry-After": "1"}
                ) from exc
            try:
                yield SqliteTx(self._writer)
            except BaseException:
                self._writer.execute("ROLLBACK")
                raise
            self._writer.execute("COMMIT")

    async def close(self) -> None:
        self._reader.close()
        self._writer.close()

"""SQLite implementation of the store contract.

One writer connection guarded by an asyncio lock (SQLite has one writer; the lock queues our own
writers without spinning on SQLITE_BUSY) and one reader connection (WAL readers never block the
writer). Statements run synchronously on the event loop: each is tens of microseconds, far less
than handing it to a thread would cost; only the commit, which waits for the disk, runs in a
thread. Other processes (the CLI) wait at most ``busy_timeout``.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
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
    # Read pages through a memory map instead of a pread() per page: reads are the hot path.
    conn.execute("PRAGMA mmap_size = 268435456")
    conn.execute("PRAGMA cache_size = -65536")
    return conn


class _Reading:
    """``async with store.read() as tx``: readers need no transaction of their own in WAL mode."""

    __slots__ = ("_tx",)

    def __init__(self, tx: SqliteTx) -> None:
        self._tx = tx

    async def __aenter__(self) -> Tx:
        return self._tx

    async def __aexit__(self, *exc: object) -> None:
        return None


class SqliteStore(Store):
    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._writer = _connect(path)
        migrate(self._writer)
        self._reader = _connect(path)
        self._read = _Reading(SqliteTx(self._reader))
        self._write_lock = asyncio.Lock()

    def read(self) -> AbstractAsyncContextManager[Tx]:
        # The hot path of every request: one reusable object, not a generator per call.
        return self._read

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
            # The commit waits for fsync (synchronous=FULL), which can take long on a busy disk;
            # off the event loop, readers keep being served meanwhile. The lock is still held.
            await asyncio.to_thread(self._writer.execute, "COMMIT")

    async def close(self) -> None:
        self._reader.close()
        self._writer.close()

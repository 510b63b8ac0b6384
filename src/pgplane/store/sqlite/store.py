"""SQLite implementation of the store contract.

One writer connection guarded by an asyncio lock (SQLite has one writer; the lock queues our own
writers without spinning on SQLITE_BUSY) and one reader connection (WAL readers never block the
writer). Statements run synchronously on the event loop: each is tens of microseconds, far less
than handing it to a thread would cost; only the commit, which waits for the disk, runs in a
thread.

When another process holds the store's write lock (the CLI, or anything else that opened the
file), the writer waits for it asynchronously, never blocking the event loop, for at most
``BUSY_SECONDS`` (or the store's own ``busy_seconds``). A store that stays locked, or fails (a
full disk, an I/O error), is a 503 with ``Retry-After``: SQLite rolls the transaction back
whole, so nothing is half written.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import stat
import time
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import TypeGuard

from pgplane.core import clock
from pgplane.core.models import Operation
from pgplane.errors import Unavailable
from pgplane.store.base import Store, Tx
from pgplane.store.sqlite.common import SqliteConn
from pgplane.store.sqlite.memo import ReadMemo
from pgplane.store.sqlite.migrate import migrate
from pgplane.store.sqlite.tx import SqliteTx
from pgplane.telemetry import logs
from pgplane.telemetry.metrics import NO_METRICS, Metrics

log = logging.getLogger(__name__)

BUSY_SECONDS = 5.0
# SQLite's own wait, which blocks the thread it runs on: the event loop's, for the reader. WAL
# readers are blocked only briefly (another process recovering the WAL), so a short wait.
_READER_BUSY_MS = 200
_FIRST_PAUSE = 0.002
_RETRY_AFTER = {"Retry-After": "1"}


def store_fault(exc: BaseException | None) -> TypeGuard[sqlite3.Error]:
    """An error of the store's file or disk, not of our statements: locked, full, I/O, corrupt.

    ``DatabaseError`` itself (not its subclasses: a constraint or a misuse is a bug of ours) is
    what SQLite raises for a damaged file, "database disk image is malformed".
    """
    return isinstance(exc, sqlite3.OperationalError) or type(exc) is sqlite3.DatabaseError


# SQLite's primary result codes of the faults, as the reasons /metrics counts them by.
_REASONS = {
    sqlite3.SQLITE_BUSY: "locked",
    sqlite3.SQLITE_LOCKED: "locked",
    sqlite3.SQLITE_FULL: "full",
    sqlite3.SQLITE_IOERR: "io",
    sqlite3.SQLITE_CORRUPT: "corrupt",
    sqlite3.SQLITE_NOTADB: "corrupt",
    sqlite3.SQLITE_READONLY: "readonly",
    sqlite3.SQLITE_CANTOPEN: "io",
}


def fault_reason(exc: sqlite3.Error) -> str:
    """One of a few words for a store fault, never its message (bounded, for a label)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return "other" if code is None else _REASONS.get(code & 0xFF, "other")


def unavailable(exc: sqlite3.Error) -> Unavailable:
    return Unavailable(
        f"the platform's store is unavailable ({exc}); retry shortly", headers=_RETRY_AFTER
    )


def _connect(path: Path, busy_ms: int) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute(f"PRAGMA busy_timeout = {busy_ms}")
    conn.execute("PRAGMA journal_mode = WAL")
    # FULL: an operation acknowledged to a client survives a power cut, not just a crash.
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("PRAGMA foreign_keys = ON")
    # Read pages through a memory map instead of a pread() per page: reads are the hot path.
    conn.execute("PRAGMA mmap_size = 268435456")
    conn.execute("PRAGMA cache_size = -65536")
    return conn


def _make_private(path: Path) -> None:
    """The store (role passwords, key digests) readable and writable by the platform alone.

    SQLite gives its -wal and -shm files the mode of the database file, so a database created
    0600 (or made so) keeps all three private; an existing store of an earlier version is
    mended at the first open.
    """
    os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600))
    for name in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        with contextlib.suppress(FileNotFoundError):
            if stat.S_IMODE(name.stat().st_mode) != 0o600:
                name.chmod(0o600)


class _Reading:
    """``async with store.read() as tx``: readers need no transaction of their own in WAL mode.

    Not timed: reads are the hot path of every request, each tens of microseconds.
    """

    __slots__ = ("_metrics", "_tx")

    def __init__(self, tx: SqliteTx, metrics: Metrics) -> None:
        self._tx = tx
        self._metrics = metrics

    async def __aenter__(self) -> Tx:
        return self._tx

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        if store_fault(exc):  # not a bug of ours
            self._metrics.store_error(fault_reason(exc))
            raise unavailable(exc) from exc


class SqliteStore(Store):
    def __init__(
        self, path: Path, metrics: Metrics = NO_METRICS, *, busy_seconds: float = BUSY_SECONDS
    ) -> None:
        """``busy_seconds``: how long a writer waits while another process holds the store
        (the CLI, which says that it waits, waits longer than a request should)."""
        self.path = path
        self._metrics = metrics
        self._busy_seconds = busy_seconds
        path.parent.mkdir(parents=True, exist_ok=True)
        _make_private(path)
        self._writer = _connect(path, int(busy_seconds * 1000))
        migrate(self._writer)
        # Past migrations, the writer never waits inside SQLite: write() waits without blocking.
        self._writer.execute("PRAGMA busy_timeout = 0")
        self._reader = _connect(path, _READER_BUSY_MS)
        # Never a write through the reader: the memo's counter moves only for other connections'.
        self._reader.execute("PRAGMA query_only = ON")
        reading = SqliteTx(SqliteConn(self._reader))
        reading._memo = self._memo = ReadMemo(self._reader)
        self._read = _Reading(reading, metrics)
        self._write_lock = asyncio.Lock()
        # The commit's own thread: in the default pool it waited behind whatever held every
        # thread there (tenants' schema dumps did), with the write lock held, so every write
        # of every account waited too.
        self._committer = ThreadPoolExecutor(1, thread_name_prefix="pgplane-store-commit")

    def read(self) -> AbstractAsyncContextManager[Tx]:
        # The hot path of every request: one reusable object, not a generator per call.
        return self._read

    @asynccontextmanager
    async def write(self) -> AsyncIterator[Tx]:
        asked = time.monotonic()
        async with self._write_lock:
            await self._begin()
            begun = time.monotonic()
            tx = SqliteTx(SqliteConn(self._writer))
            try:
                yield tx
                # The commit waits for fsync (synchronous=FULL), which can take long on a busy
                # disk; off the event loop, readers keep being served meanwhile.
                await asyncio.get_running_loop().run_in_executor(
                    self._committer, self._writer.execute, "COMMIT"
                )
                self._memo.forget()  # this turn's reads must see the commit too
            except BaseException as exc:
                self._memo.forget()  # a failed COMMIT may have committed all the same
                if self._writer.in_transaction:
                    self._writer.execute("ROLLBACK")
                if store_fault(exc):  # a full disk, say
                    self._metrics.store_error(fault_reason(exc))
                    raise unavailable(exc) from exc
                raise
            self._metrics.store_write(begun - asked, time.monotonic() - begun)
        log_queued(tx.queued)

    async def _begin(self) -> None:
        """BEGIN IMMEDIATE, waiting asynchronously while another process holds the lock."""
        deadline = asyncio.get_running_loop().time() + self._busy_seconds
        pause = _FIRST_PAUSE
        while True:
            try:
                self._writer.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                # Extended codes (SQLITE_BUSY_RECOVERY...) carry the primary one in the low byte.
                code = exc.sqlite_errorcode & 0xFF
                locked = code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
                if not locked or asyncio.get_running_loop().time() >= deadline:
                    self._metrics.store_error(fault_reason(exc))
                    raise unavailable(exc) from exc
                if pause == _FIRST_PAUSE:  # once per wait: another program holds the file
                    log.info(
                        "the store is locked by another process: waiting up to %.0f s",
                        self._busy_seconds,
                    )
                await asyncio.sleep(pause)
                pause = min(pause * 2, 0.1)
            else:
                return

    async def probe(self) -> None:
        async with self.read():
            self._reader.execute("SELECT checked_at FROM health").fetchall()
        async with self.write():
            self._writer.execute(
                "INSERT INTO health (id, checked_at) VALUES (1, ?)"
                " ON CONFLICT (id) DO UPDATE SET checked_at = excluded.checked_at",
                (clock.now_us(),),
            )

    async def close(self) -> None:
        self._committer.shutdown(wait=True)
        self._reader.close()
        self._writer.close()


def log_queued(queued: Sequence[Operation]) -> None:
    """Say which operations a transaction queued, once they are sure to exist (committed)."""
    for op in queued:
        log.info(
            "operation %s %s queued",
            op.id,
            op.action,
            extra={
                "operation_id": op.id,
                "project_id": op.project_id,
                "branch_id": op.branch_id,
                "endpoint_id": op.endpoint_id,
            },
        )
        logs.queued(op.id)

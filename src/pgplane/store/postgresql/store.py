"""PostgreSQL implementation of the store contract, for a control plane of several processes.

Connections come from a pool (psycopg_pool) of ``PGPLANE_STORE_POOL_SIZE`` per process, each in
autocommit: a reader runs each statement in a snapshot of its own, as SQLite's WAL reader does,
and sees every commit of every process at once (a revoked key included: nothing is cached). A
connection is looked at before it is handed out (:func:`_check`), so a restart of the store's
server costs no request an error: each connection it ended is replaced, not used.

Writers keep SQLite's model, one at a time, across every process: a write transaction takes a
transaction-level advisory lock before its first statement, so the services' read-then-write
rules (quotas count, then insert; a timestamp moved past the project's latest) hold as they do on
SQLite, at READ COMMITTED, with no serialization failures to retry. The exception is the
engine's claim (:meth:`PgTx.claim_operation`): a compare-and-set of one row whose own WHERE is
its guarantee, it takes no writer lock and skips a row another claimer holds
(``FOR UPDATE SKIP LOCKED``), so dispatchers on many nodes never queue behind each other or
behind the API's writes.

A transaction that queued or settled operations announces it (``NOTIFY``, delivered at commit);
:meth:`PostgresStore.watch_operations` listens and wakes the engine, whose polling remains the
fallback. A pool that cannot connect, a lock not had within ``BUSY_SECONDS``, a connection lost:
a 503 with ``Retry-After``, the transaction rolled back whole.
"""

from __future__ import annotations

import asyncio
import logging
import select
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeGuard

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from pgplane.core import clock
from pgplane.errors import Unavailable
from pgplane.store.base import Store, Tx
from pgplane.store.postgresql.conn import PgConn, configure_types
from pgplane.store.postgresql.migrate import WRITE_LOCK, migrate
from pgplane.store.postgresql.tx import PgTx
from pgplane.store.sqlite.store import log_queued
from pgplane.telemetry.metrics import NO_METRICS, Metrics

log = logging.getLogger(__name__)

BUSY_SECONDS = 5.0  # waiting for a connection, or for the writer lock, as SQLite waits
# Connections per process (the engine's workers, the scheduler, the heartbeat and concurrent API
# requests each hold one only for a transaction); N nodes take N x (this + 1, the listener) of
# the server's max_connections (100 by default).
POOL_SIZE = 10
CHANNEL = "pgplane_operations"
_LOCK = f"SELECT pg_advisory_xact_lock({WRITE_LOCK})"
_RETRY_AFTER = {"Retry-After": "1"}
_LISTEN_PAUSE_CAP = 5.0


def store_fault(exc: BaseException | None) -> TypeGuard[Exception]:
    """The server unreachable, a connection lost, a lock or a connection not had in time: not a
    bug of ours (those are ProgrammingError, IntegrityError, DataError...)."""
    return isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError | PoolTimeout)


def fault_reason(exc: Exception) -> str:
    """One of a few words for a fault, never its message (bounded, for a label)."""
    if isinstance(exc, PoolTimeout | psycopg.errors.LockNotAvailable):
        return "locked"
    if isinstance(exc, psycopg.errors.TransactionRollback):  # a deadlock, say
        return "conflict"
    return "unreachable"


def redacted(url: str) -> str:
    """The URL without its password, for logs."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "postgresql://…"
    host, db = info.get("host", ""), info.get("dbname", "")
    return f"postgresql://{host}/{db}"


class PostgresStore(Store):
    """Open with :meth:`open` (connects and migrates)."""

    def __init__(
        self,
        url: str,
        metrics: Metrics = NO_METRICS,
        *,
        pool_size: int = POOL_SIZE,
        application_name: str = "pgplane",
    ):
        if pool_size < MIN_POOL_SIZE:
            raise ValueError(f"the store's pool size must be at least {MIN_POOL_SIZE}")
        self.url = url
        self._metrics = metrics
        # Named, so an operator's pg_stat_activity says which node holds which connection.
        self._application_name = application_name[:63]
        self._pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]] = AsyncConnectionPool(
            url,
            min_size=1,
            max_size=pool_size,
            open=False,
            timeout=BUSY_SECONDS,
            kwargs={
                "autocommit": True,
                "connect_timeout": 10,
                "application_name": self._application_name,
            },
            configure=_configure,
            check=self._check,
            name="pgplane-store",
        )

    @classmethod
    async def open(
        cls,
        url: str,
        metrics: Metrics = NO_METRICS,
        *,
        pool_size: int = POOL_SIZE,
        application_name: str = "pgplane",
    ) -> PostgresStore:
        # One connection first, for the migrations: a server not there fails at once, with its
        # reason (the pool would retry until its timeout).
        try:
            async with await psycopg.AsyncConnection.connect(
                url, autocommit=True, connect_timeout=10
            ) as conn:
                await migrate(conn)
        except psycopg.OperationalError as exc:
            raise Unavailable(
                f"cannot reach the store at {redacted(url)} ({type(exc).__name__})"
            ) from exc
        store = cls(url, metrics, pool_size=pool_size, application_name=application_name)
        try:
            await store._pool.open(wait=True, timeout=30)
        except PoolTimeout as exc:
            await store._pool.close()
            raise Unavailable(f"cannot connect to the store at {redacted(url)}") from exc
        log.info("pgplane store: PostgreSQL at %s", redacted(url))
        return store

    @asynccontextmanager
    async def read(self) -> AsyncIterator[Tx]:
        try:
            async with self._pool.connection() as conn:
                yield PgTx(PgConn(conn))
        except Exception as exc:
            if store_fault(exc):
                raise self._unavailable(exc) from exc
            raise

    @asynccontextmanager
    async def write(self) -> AsyncIterator[Tx]:
        asked = time.monotonic()
        try:
            async with self._pool.connection() as conn:
                begun = time.monotonic()
                async with conn.transaction():
                    tx = PgTx(PgConn(conn, before=_LOCK))
                    yield tx
                    if tx.announce:  # delivered at commit, to every listener
                        await conn.execute("SELECT pg_notify(%s, '')", (CHANNEL,))
                self._metrics.store_write(begun - asked, time.monotonic() - begun)
        except Exception as exc:
            if store_fault(exc):
                raise self._unavailable(exc) from exc
            raise
        log_queued(tx.queued)

    def _unavailable(self, exc: Exception) -> Unavailable:
        self._metrics.store_error(fault_reason(exc))
        return Unavailable(
            f"the platform's store is unavailable ({type(exc).__name__}); retry shortly",
            headers=_RETRY_AFTER,
        )

    async def probe(self) -> None:
        async with self.read() as tx:
            assert isinstance(tx, PgTx)  # noqa: S101 - this store's own
            await tx.conn.all("SELECT checked_at FROM health")
        async with self.write() as tx:
            assert isinstance(tx, PgTx)  # noqa: S101
            await tx.conn.execute(
                "INSERT INTO health (id, checked_at) VALUES (1, ?)"
                " ON CONFLICT (id) DO UPDATE SET checked_at = excluded.checked_at",
                (clock.now_us(),),
            )

    async def watch_operations(self, wake: Callable[[], None]) -> None:
        """Call ``wake`` whenever any process commits new or settled operations; forever.

        On its own connection (LISTEN holds one); lost, it is made again, with a wake for what
        was announced meanwhile.
        """
        pause = 0.1
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self.url,
                    autocommit=True,
                    connect_timeout=10,
                    application_name=self._application_name,
                )
                async with conn:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    wake()
                    pause = 0.1
                    async for _ in conn.notifies():
                        wake()
            except psycopg.Error as exc:
                log.warning(
                    "listening for new operations failed (%s); polling meanwhile",
                    type(exc).__name__,
                )
            await asyncio.sleep(pause)
            pause = min(pause * 2, _LISTEN_PAUSE_CAP)

    async def _check(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Refuse (raise) a pooled connection its server has ended, before a request gets it.

        An idle connection in autocommit is sent nothing unasked, so one with something to read
        has been told something: as a rule that its server shut down (its FATAL, then the end of
        the stream). Only such a one costs a round trip to find out; the others cost one
        ``poll``. A first one found dead means the server restarted and took the rest with it:
        those are all checked now, so the pool's retries (paced a second and more apart after
        the second) meet a live one next, not the next dead one.
        """
        if not (conn.closed or conn.broken or _has_input(conn)):
            return
        try:
            await AsyncConnectionPool.check_connection(conn)
        except psycopg.Error:
            log.info("a store connection was ended by its server: checking the others")
            await self._pool.check()
            raise

    async def close(self) -> None:
        await self._pool.close()


MIN_POOL_SIZE = 1


def _has_input(conn: psycopg.AsyncConnection[Any]) -> bool:
    """Whether the connection's socket has bytes (or its end) waiting, without reading them."""
    try:
        fd = conn.pgconn.socket
    except psycopg.OperationalError:  # no socket left at all
        return True
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


async def _configure(conn: psycopg.AsyncConnection[Any]) -> None:
    configure_types(conn)
    # The writer lock (and any row lock) waits as long as SQLite's writer waits, then fails
    # with a 503; a transaction left open by a stuck client of ours ends on its own.
    ms = int(BUSY_SECONDS * 1000)
    await conn.execute(f"SET lock_timeout = {ms}")
    await conn.execute("SET idle_in_transaction_session_timeout = 60000")

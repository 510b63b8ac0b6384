"""The read-only checks (availability, activity), run as a role that can only read.

``pgplane_monitor`` logs in over the socket (trust) and is a member of ``pg_monitor``, so it sees
every backend in ``pg_stat_activity`` and nothing a superuser would add. New timelines are created
with it (:func:`create_monitor`); clusters made before it existed, and ones where a tenant changed
or dropped it, get it back lazily: when a check cannot log in as it, or finds it cannot see every
backend, the role is made whole again as cloud_admin and the check is tried once more. The wake
path never pays for any of this.

What a tenant can do to the role depends on the major. On Postgres 15 and older, CREATEROLE may
alter, drop or revoke any non-superuser role, this one included; from 16 on only roles it holds
ADMIN on (those it created). Either way the harm stays in its own project: a check that cannot
log in is a failed availability check (retried, with its reason) or an activity check that cannot
answer, which keeps the compute up; :func:`ensure_monitor` repairs the role at the next failure.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import errors, sql

from pgplane.compute.driver import ComputeError
from pgplane.compute.local.postgres.sessions import (
    ADMIN_USER,
    MONITOR_USER,
    Conn,
    admin_conninfo,
    connect,
    conninfo,
)

_CHECK_TIMEOUT = 30.0
_PG16 = 160000
_MONITOR = sql.Identifier(MONITOR_USER)
# Everything the role may be, set again on every repair: a tenant (CREATEROLE on 15) may have
# changed any of it. No password: it logs in over the socket only.
_ATTRIBUTES = sql.SQL(
    "LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS INHERIT"
    " CONNECTION LIMIT -1 PASSWORD NULL VALID UNTIL 'infinity'"
)
_ROLE_EXISTS = "SELECT 1 FROM pg_catalog.pg_roles WHERE rolname OPERATOR(pg_catalog.=) %s"
_MEMBERS = (
    "SELECT m.rolname, pg_catalog.pg_get_userbyid(a.grantor) FROM pg_catalog.pg_auth_members a"
    " JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) a.roleid"
    " JOIN pg_catalog.pg_roles m ON m.oid OPERATOR(pg_catalog.=) a.member"
    " WHERE r.rolname OPERATOR(pg_catalog.=) %s"
)


async def create_monitor(admin: Conn) -> None:
    """Create or repair the monitor role in ``admin``'s cluster (a cloud_admin session)."""
    cur = await admin.execute(_ROLE_EXISTS, [MONITOR_USER])
    if await cur.fetchone() is None:
        # Another check may create it at the same moment: the ALTER below holds either way.
        with contextlib.suppress(errors.DuplicateObject, errors.UniqueViolation):
            await admin.execute(sql.SQL("CREATE ROLE {} {}").format(_MONITOR, _ATTRIBUTES))
    await admin.execute(sql.SQL("ALTER ROLE {} {}").format(_MONITOR, _ATTRIBUTES))
    await admin.execute(sql.SQL("ALTER ROLE {} RESET ALL").format(_MONITOR))
    await admin.execute(sql.SQL("GRANT pg_monitor TO {}").format(_MONITOR))
    # Whoever holds the role (a tenant who created it first holds it WITH ADMIN from 16 on)
    # would hold pg_monitor through it, and could change it again.
    cur = await admin.execute(_MEMBERS, [MONITOR_USER])
    for member, grantor in await cur.fetchall():
        revoke = sql.SQL("REVOKE {} FROM {}").format(_MONITOR, sql.Identifier(member))
        if admin.info.server_version >= _PG16:  # one grant per grantor, each revoked by name
            revoke = sql.SQL("{} GRANTED BY {}").format(revoke, sql.Identifier(grantor))
        await admin.execute(sql.SQL("{} CASCADE").format(revoke))


async def ensure_monitor(socket_dir: Path, port: int) -> None:
    """Make the monitor role whole, as cloud_admin."""
    async with await connect(admin_conninfo(socket_dir, port)) as admin:
        await create_monitor(admin)


async def _monitor_session(socket_dir: Path, port: int, dbname: str) -> Conn:
    """A pinned session as the monitor; the role is repaired once if it cannot log in."""
    info = conninfo(
        socket_dir, port, user=MONITOR_USER, dbname=dbname, statement_timeout=_CHECK_TIMEOUT
    )
    try:
        return await connect(info)
    except psycopg.OperationalError as exc:
        if _refused_database(exc):
            raise
    await ensure_monitor(socket_dir, port)
    return await connect(info)


def _refused_database(exc: psycopg.Error) -> bool:
    """Whether a login was refused for the database, not the role (no repair mends that)."""
    return exc.sqlstate == "42501" or "permission denied for database" in str(exc)


async def check_readable(socket_dir: Path, port: int) -> None:
    """Every database answers a query that reads its catalog (the availability check)."""
    try:
        async with asyncio.timeout(_CHECK_TIMEOUT):
            await _check_readable(socket_dir, port)
    except TimeoutError:
        raise ComputeError("availability check timed out") from None
    except psycopg.Error as exc:
        raise ComputeError(f"availability check: {exc}") from exc


async def _check_readable(socket_dir: Path, port: int) -> None:
    async with await _monitor_session(socket_dir, port, "postgres") as conn:
        cur = await conn.execute("SELECT datname FROM pg_catalog.pg_database WHERE datallowconn")
        names = sorted(str(r[0]) for r in await cur.fetchall())
    for name in names:
        try:
            db = await _monitor_session(socket_dir, port, name)
        except psycopg.OperationalError as exc:
            if _refused_database(exc):
                # Its owner took CONNECT from PUBLIC: to refuse us, the backend read that
                # database's catalog, which is all this check asks.
                continue
            raise
        async with db:
            await db.execute("SELECT pg_catalog.count(*) FROM pg_catalog.pg_class")


# A subscriber's walsender counts as busy however quiet its stream (as on Neon, a compute with
# a logical replication subscriber does not scale to zero); the platform's own streams (the
# archive's receiver, replicas) are cloud_admin's, not a client's.
_ACTIVITY = (
    "SELECT pg_catalog.bool_or(state OPERATOR(pg_catalog.<>) 'idle'"
    " OR backend_type OPERATOR(pg_catalog.=) 'walsender'),"
    " EXTRACT(epoch FROM pg_catalog.max(state_change)), EXTRACT(epoch FROM pg_catalog.now()),"
    " pg_catalog.pg_has_role('pg_read_all_stats', 'USAGE')"
    " FROM pg_catalog.pg_stat_activity"
    " WHERE backend_type OPERATOR(pg_catalog.=) ANY ('{client backend,walsender}')"
    " AND pid OPERATOR(pg_catalog.<>) pg_catalog.pg_backend_pid()"
    " AND usename OPERATOR(pg_catalog.<>) %s AND usename OPERATOR(pg_catalog.<>) %s"
)


async def last_client_activity(socket_dir: Path, port: int) -> float | None:
    """When a client backend last did something, as the compute sees it (epoch seconds).

    A query running or a transaction open counts as now; otherwise the latest moment a client
    went idle. None when no client is connected; ComputeError when the compute cannot be asked,
    which is not the same as idle (a compute too busy to answer is the opposite). The platform's
    own sessions are not clients.
    """
    try:
        async with asyncio.timeout(_CHECK_TIMEOUT):
            row = await _activity(socket_dir, port)
            if row is not None and not row[3]:
                # Without pg_monitor's rights other users' backends show no state: they would
                # look idle. Repair the role (a tenant changed it) and ask again.
                await ensure_monitor(socket_dir, port)
                row = await _activity(socket_dir, port)
    except (psycopg.Error, TimeoutError) as exc:
        raise ComputeError(f"could not ask the compute what runs on it: {exc}") from exc
    if row is None or not row[3]:
        # Others' backends would look idle, and a compute in use would be suspended.
        raise ComputeError(f"{MONITOR_USER} cannot see every backend of the compute")
    busy, last, now, _ = row
    if busy is None:
        return None
    return float(now) if busy else float(last)


async def _activity(socket_dir: Path, port: int) -> tuple[Any, ...] | None:
    async with await _monitor_session(socket_dir, port, "postgres") as conn:
        cur = await conn.execute(_ACTIVITY, (ADMIN_USER, MONITOR_USER))
        return await cur.fetchone()


_LOGICAL_SIZE = (
    "SELECT pg_catalog.sum(pg_catalog.pg_database_size(oid))::bigint,"
    " (SELECT pg_catalog.pg_wal_lsn_diff(pg_catalog.pg_current_wal_lsn(), '0/0'))::bigint"
    " FROM pg_catalog.pg_database"
)


_INACTIVE_SLOTS = (
    "SELECT slot_name, pg_catalog.pg_wal_lsn_diff(pg_catalog.pg_current_wal_lsn(), restart_lsn)"
    "::bigint FROM pg_catalog.pg_replication_slots"
    " WHERE NOT active AND NOT temporary AND restart_lsn IS NOT NULL"
    " ORDER BY slot_name LIMIT 20"
)


@dataclass(frozen=True, slots=True)
class Figures:
    """What a running compute says of its branch: its databases' size (pg_monitor reads every
    database's: pg_read_all_stats), where its WAL stands (bytes), and the replication slots no
    one reads with the WAL each keeps (what a subscriber that went away costs the project's
    disk until Postgres invalidates the slot)."""

    logical: int
    wal_lsn: int | None
    idle_slots: list[tuple[str, int]]


async def figures(socket_dir: Path, port: int) -> Figures:
    """The compute's :class:`Figures`, asked in one session."""
    try:
        async with asyncio.timeout(_CHECK_TIMEOUT):
            async with await _monitor_session(socket_dir, port, "postgres") as conn:
                row = await (await conn.execute(_LOGICAL_SIZE)).fetchone()
                slots = await (await conn.execute(_INACTIVE_SLOTS)).fetchall()
    except (psycopg.Error, TimeoutError) as exc:
        raise ComputeError(f"could not ask the compute its size: {exc}") from exc
    logical, lsn = (0, None) if row is None else row
    return Figures(
        logical=int(logical or 0),
        wal_lsn=None if lsn is None else int(lsn),
        idle_slots=[(str(name), int(kept or 0)) for name, kept in slots],
    )

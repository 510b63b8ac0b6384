"""The SCRAM verifiers of a compute's login roles, read for the proxy.

Roles made with SQL exist only on the compute. The platform syncs their verifiers into the store
(when the compute applies config or suspends) and reads one from a running compute when a login
names a role it has not seen, so the proxy authenticates every login itself and a suspended
compute is never woken for a password nobody can prove.

``pg_authid`` is readable by superusers only, so this is one of the few superuser sessions; like
every platform session it is pinned (:mod:`pgplane.compute.local.postgres.sessions`) and names only
pg_catalog objects.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path

import psycopg

from pgplane.compute.driver import ComputeError
from pgplane.compute.local.postgres.sessions import (
    ADMIN_USER,
    MONITOR_USER,
    Conn,
    admin_conninfo,
    connect,
)

SQL_TIMEOUT = 10.0
# Roles of the platform's own, never offered to the proxy whatever they hold.
_PLATFORM_ROLES = (ADMIN_USER, MONITOR_USER)
_MAX_ROLES = 10_000
# A SCRAM-SHA-256 verifier Postgres makes is about 130 bytes. A tenant superuser can write any
# text into pg_authid: past this, the role is not offered (its logins refused as any wrong
# password's), so a verifier of 100 MB never reaches the platform's memory or its store.
MAX_VERIFIER_BYTES = 1024


_QUERY = (
    "SELECT a.rolname, a.rolpassword FROM pg_catalog.pg_authid AS a"
    " WHERE a.rolcanlogin"
    " AND pg_catalog.starts_with(a.rolpassword, 'SCRAM-SHA-256$')"
    " AND pg_catalog.octet_length(a.rolpassword) OPERATOR(pg_catalog.<=) %s"
    " AND NOT (a.rolname OPERATOR(pg_catalog.=) ANY (%s::pg_catalog.name[]))"
    " AND (%s::pg_catalog.name[] IS NULL"
    " OR a.rolname OPERATOR(pg_catalog.=) ANY (%s::pg_catalog.name[]))"
    " AND NOT pg_catalog.starts_with(a.rolname, 'pg_')"
    " AND (a.rolvaliduntil IS NULL OR a.rolvaliduntil OPERATOR(pg_catalog.>) pg_catalog.now())"
    " ORDER BY a.rolname LIMIT %s"
)


async def read_verifiers(
    socket_dir: Path, port: int, names: Sequence[str] | None
) -> Mapping[str, str]:
    """name → ``SCRAM-SHA-256$…`` for login roles with a SCRAM password (of ``names`` if given)."""
    try:
        async with asyncio.timeout(SQL_TIMEOUT):
            async with await connect(admin_conninfo(socket_dir, port)) as conn:
                return await query_verifiers(conn, names)
    except TimeoutError:
        raise ComputeError("reading the compute's roles timed out") from None
    except psycopg.Error as exc:
        raise ComputeError(f"reading the compute's roles: {exc}") from exc


async def query_verifiers(conn: Conn, names: Sequence[str] | None) -> Mapping[str, str]:
    """As :func:`read_verifiers`, on an open superuser session; psycopg's errors raised."""
    wanted = None if names is None else list(names)
    cur = await conn.execute(
        _QUERY, (MAX_VERIFIER_BYTES, list(_PLATFORM_ROLES), wanted, wanted, _MAX_ROLES)
    )
    return {str(name): str(verifier) for name, verifier in await cur.fetchall()}

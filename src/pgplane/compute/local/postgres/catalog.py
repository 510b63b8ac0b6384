"""Roles and databases of a running cluster, converged with SQL as cloud_admin.

Every session is pinned and every name qualified, as :mod:`.sessions` says.

Every step reads the catalog before it acts, so a retry after a crash half-way through skips
what is done and finishes the rest. Identifiers and literals only ever reach SQL through
``psycopg.sql`` (Identifier, Literal), never by interpolation; the server hashes passwords
(SCRAM) and never echoes statements in its errors, so no password reaches a message.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import LiteralString

import psycopg
from psycopg import errors, sql

from pgplane import failpoints
from pgplane.compute.driver import ComputeError, ConfigChange
from pgplane.compute.local.postgres.sessions import (
    ADMIN_USER,
    PLATFORM_ROLES,
    Conn,
    admin_conninfo,
    connect,
    role_attributes,
    role_password,
)

log = logging.getLogger(__name__)

_SQL_TIMEOUT = 120.0
_RENAME_ATTEMPTS = 20
# What pgplane and Postgres need as they are: the superuser pgplane connects as, the database it
# connects to, and the templates.
_RESERVED_DATABASES = frozenset({"postgres", "template0", "template1"})

_ROLE_EXISTS = "SELECT 1 FROM pg_catalog.pg_roles WHERE rolname OPERATOR(pg_catalog.=) %s"


def check_change(change: ConfigChange) -> None:
    """Refuse names that would let a change break pgplane's own access to the cluster."""
    for name in [*(r.name for r in change.roles), *change.dropped_roles]:
        if name in PLATFORM_ROLES or name.startswith("pg_"):
            raise ComputeError(f"role {name!r} is reserved")
    databases = [
        *(d.name for d in change.databases),
        *change.renamed_databases,
        *change.renamed_databases.values(),
        *change.dropped_databases,
    ]
    for name in databases:
        if name in _RESERVED_DATABASES:
            raise ComputeError(f"database {name!r} is reserved")
    for database in change.databases:
        if database.owner_name in PLATFORM_ROLES:
            raise ComputeError(f"role {database.owner_name!r} is reserved")


async def apply_change(socket_dir: Path, port: int, change: ConfigChange) -> None:
    """Converge the cluster behind ``socket_dir``/``port`` with ``change``."""
    try:
        async with asyncio.timeout(_SQL_TIMEOUT):
            await _apply(socket_dir, port, change)
    except TimeoutError:
        raise ComputeError("applying roles and databases timed out") from None
    except psycopg.Error as exc:
        raise ComputeError(f"applying roles and databases: {exc}") from exc


async def _apply(socket_dir: Path, port: int, change: ConfigChange) -> None:
    # CREATE/DROP DATABASE cannot run inside a transaction block: sessions are autocommit.
    # Passwords are stored as SCRAM whatever a user set: password_encryption is pinned.
    async with await connect(admin_conninfo(socket_dir, port)) as conn:
        for old, new in change.renamed_databases.items():
            await _rename_database(conn, old, new)
        for role in change.roles:
            attributes = role_attributes(role)
            if await _exists(conn, _ROLE_EXISTS, role.name):
                query = sql.SQL("ALTER ROLE {} {} PASSWORD {}")
                what = f"updating role {role.name!r}"
            else:
                query = sql.SQL("CREATE ROLE {} {} CREATEDB CREATEROLE PASSWORD {}")
                what = f"creating role {role.name!r}"
            statement = query.format(
                sql.Identifier(role.name), attributes, role_password(role.password)
            )
            await _execute(conn, statement, what)
        for database in change.databases:
            owner = await _database_owner(conn, database.name)
            db_id, owner_id = sql.Identifier(database.name), sql.Identifier(database.owner_name)
            if owner is None:
                statement = sql.SQL("CREATE DATABASE {} OWNER {}").format(db_id, owner_id)
                await _execute(conn, statement, f"creating database {database.name!r}")
            elif owner != database.owner_name:
                statement = sql.SQL("ALTER DATABASE {} OWNER TO {}").format(db_id, owner_id)
                await _execute(conn, statement, f"changing the owner of {database.name!r}")
        for name in change.dropped_databases:
            statement = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(name)
            )
            await _execute(conn, statement, f"dropping database {name!r}")
        for role_name in change.dropped_roles:
            await _drop_role(conn, socket_dir, port, role_name)


async def _rename_database(conn: Conn, old: str, new: str) -> None:
    if await _database_owner(conn, old) is None or await _database_owner(conn, new) is not None:
        return  # renamed already (or nothing to rename)
    statement = sql.SQL("ALTER DATABASE {} RENAME TO {}").format(
        sql.Identifier(old), sql.Identifier(new)
    )
    for attempt in range(_RENAME_ATTEMPTS):
        # Postgres refuses to rename a database anyone is connected to: end those sessions
        # (as DROP DATABASE ... WITH (FORCE) does) and retry if a client was quicker.
        await conn.execute(
            "SELECT pg_catalog.pg_terminate_backend(pid) FROM pg_catalog.pg_stat_activity"
            " WHERE datname OPERATOR(pg_catalog.=) %s"
            " AND pid OPERATOR(pg_catalog.<>) pg_catalog.pg_backend_pid()",
            [old],
        )
        try:
            await conn.execute(statement)
        except errors.ObjectInUse:
            await asyncio.sleep(0.05 * (attempt + 1))
            continue
        except psycopg.Error as exc:
            raise ComputeError(f"renaming database {old!r} to {new!r} failed: {exc}") from exc
        return
    raise ComputeError(f"renaming database {old!r}: it stays in use")


async def _drop_role(conn: Conn, socket_dir: Path, port: int, role: str) -> None:
    if not await _exists(conn, _ROLE_EXISTS, role):
        return
    await conn.execute(
        "SELECT pg_catalog.pg_terminate_backend(pid) FROM pg_catalog.pg_stat_activity"
        " WHERE usename OPERATOR(pg_catalog.=) %s",
        [role],
    )
    for database in await _databases_to_clean(conn, role):
        # Owners can change as we go (REASSIGN OWNED moves shared objects such as databases
        # too), so the owner is read just before each database is visited.
        owner = await _database_owner(conn, database)
        if owner is None:
            continue  # dropped meanwhile
        # A session in the tenant's own database, as superuser: the pins matter most here.
        async with await connect(admin_conninfo(socket_dir, port, database)) as db:
            if owner != role:
                statement = sql.SQL("REASSIGN OWNED BY {} TO {}").format(
                    sql.Identifier(role), sql.Identifier(owner)
                )
                await _execute(db, statement, f"reassigning what {role!r} owns in {database!r}")
            # What is left: its privileges, and objects in a database it still owns.
            statement = sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role))
            await _execute(db, statement, f"dropping what {role!r} owns in {database!r}")
    statement = sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role))
    await _execute(conn, statement, f"dropping role {role!r}")


async def _databases_to_clean(conn: Conn, role: str) -> list[str]:
    """Connectable databases: those of other users first, the role's own last.

    REASSIGN OWNED also gives away the role's databases (shared objects), to the owner of the
    database it runs in: run first where a user owns the database, it hands them to a user
    rather than to cloud_admin. By the time the role's own databases are visited they belong
    to someone else, so their objects are reassigned too, never dropped with DROP OWNED.
    """
    cur = await conn.execute(
        "SELECT datname, pg_catalog.pg_get_userbyid(datdba) FROM pg_catalog.pg_database"
        " WHERE datallowconn"
    )
    rows: Iterable[tuple[str, str]] = await cur.fetchall()

    def rank(row: tuple[str, str]) -> tuple[int, str]:
        name, owner = row
        return (2 if owner == role else 1 if owner == ADMIN_USER else 0, name)

    return [name for name, _owner in sorted(rows, key=rank)]


async def _database_owner(conn: Conn, name: str) -> str | None:
    cur = await conn.execute(
        "SELECT pg_catalog.pg_get_userbyid(datdba) FROM pg_catalog.pg_database"
        " WHERE datname OPERATOR(pg_catalog.=) %s",
        [name],
    )
    row = await cur.fetchone()
    return None if row is None else str(row[0])


async def _exists(conn: Conn, query: LiteralString, name: str) -> bool:
    cur = await conn.execute(query, [name])
    return await cur.fetchone() is not None


async def _execute(conn: Conn, statement: sql.Composed, what: str) -> None:
    try:
        await conn.execute(statement)
    except psycopg.Error as exc:
        # The message is the server's (it never echoes the statement, so no password leaks).
        raise ComputeError(f"{what} failed: {exc}") from exc
    # Between two statements of a change: the crash suite kills here.
    await failpoints.reached("apply_config:executed")

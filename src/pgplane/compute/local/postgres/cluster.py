"""Postgres clusters: the per-version template, and the roles and databases of a new timeline.

initdb costs about half a second, a copy of its output a tenth of that, so initdb runs once per
installation into ``templates/<major>/pgdata`` and every new cluster starts as a copy. Its SQL
runs in platform sessions, pinned and qualified (:mod:`.sessions`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import psycopg
from psycopg import sql

from pgplane.compute.driver import ComputeError, DatabaseSpec, RoleSpec
from pgplane.compute.local.files import fsync_dir, remove_tree, sync_tree, write_atomic
from pgplane.compute.local.postgres.binaries import PgInstall
from pgplane.compute.local.postgres.hba import PG_HBA
from pgplane.compute.local.postgres.monitor import create_monitor
from pgplane.compute.local.postgres.sessions import (
    ADMIN_USER,
    Conn,
    admin_conninfo,
    connect,
    role_attributes,
    role_password,
)
from pgplane.compute.local.tenants.user import RunAs
from pgplane.telemetry import progress

log = logging.getLogger(__name__)

_INITDB_TIMEOUT = 300.0
_SQL_TIMEOUT = 120.0
_STAMP = "template.json"

# The cluster's own pg_hba.conf says what the platform's does (postmasters are started with
# -c hba_file naming that one): a cluster started by hand behaves the same.
_CONF_APPEND = """
# Added by pgplane.
password_encryption = 'scram-sha-256'
"""


def template_pgdata(template_dir: Path) -> Path:
    return template_dir / "pgdata"


async def ensure_template(install: PgInstall, run_as: RunAs, template_dir: Path) -> None:
    """Make ``template_dir`` hold an initdb of ``install``; rebuilt if the binaries changed.

    Built in a temporary sibling and renamed into place, so a crash leaves either no template
    or a whole one; the next call removes a leftover temporary directory.
    """
    stamp = {"bin_dir": str(install.bin_dir), "version": install.version}
    if _read_stamp(template_dir) == stamp:
        return
    with progress.step(log, f"building the Postgres {install.major} template"):
        await _build_template(install, run_as, template_dir, stamp)


async def _build_template(
    install: PgInstall, run_as: RunAs, template_dir: Path, stamp: dict[str, str]
) -> None:
    started = asyncio.get_running_loop().time()
    tmp = template_dir.with_name(f".{template_dir.name}.tmp")
    await asyncio.to_thread(shutil.rmtree, tmp, True)
    tmp.mkdir(mode=0o711)
    pgdata = template_pgdata(tmp)
    pgdata.mkdir(mode=0o700)  # initdb cannot create it itself inside a directory root owns
    run_as.chown(pgdata)
    await run_as.run(
        [
            install.initdb,
            "-D",
            pgdata,
            "-U",
            ADMIN_USER,
            "-E",
            "UTF8",
            "--no-locale",
            "--auth-local=trust",
            "--auth-host=scram-sha-256",
            # One sync_tree below covers initdb's files and our edits alike: the same work
            # initdb's own sync would do, done once.
            "--no-sync",
        ],
        time_limit=_INITDB_TIMEOUT,
    )
    await asyncio.to_thread(_configure, pgdata, run_as)
    (tmp / _STAMP).write_text(json.dumps(stamp))
    # The template must be durable before it is published: a crash right after the rename
    # must not leave a template of empty files that every later cluster would copy.
    await asyncio.to_thread(sync_tree, tmp)
    await remove_tree(template_dir)
    os.replace(tmp, template_dir)
    await asyncio.to_thread(fsync_dir, template_dir.parent)
    elapsed = asyncio.get_running_loop().time() - started
    log.info("built the Postgres %d template in %.0f ms", install.major, elapsed * 1000)


def _configure(pgdata: Path, run_as: RunAs) -> None:
    hba = pgdata / "pg_hba.conf"
    write_atomic(hba, PG_HBA.encode())
    run_as.chown(hba)
    with (pgdata / "postgresql.conf").open("a") as conf:  # root's: unpublished
        conf.write(_CONF_APPEND)


def _read_stamp(template_dir: Path) -> object:
    try:
        return json.loads((template_dir / _STAMP).read_text())  # root's
    except (OSError, ValueError):
        return None


async def create_roles_and_databases(
    socket_dir: Path, port: int, roles: Sequence[RoleSpec], databases: Sequence[DatabaseSpec]
) -> None:
    """Run the CREATE ROLE / CREATE DATABASE statements as cloud_admin over the unix socket,
    and create the platform's monitor role, so new clusters have it from the start."""
    try:
        async with asyncio.timeout(_SQL_TIMEOUT):
            await _create(socket_dir, port, roles, databases)
    except TimeoutError:
        raise ComputeError("creating roles and databases timed out") from None


async def _create(
    socket_dir: Path, port: int, roles: Sequence[RoleSpec], databases: Sequence[DatabaseSpec]
) -> None:
    # CREATE DATABASE cannot run inside a transaction block: sessions are autocommit.
    async with await connect(admin_conninfo(socket_dir, port)) as conn:
        try:
            await create_monitor(conn)
        except psycopg.Error as exc:
            raise ComputeError(f"creating the monitor role failed: {exc}") from exc
        for role in roles:
            # The server hashes the password (password_encryption = scram-sha-256); only the
            # SCRAM verifier is stored. Never interpolated: Identifier and Literal quote.
            query = sql.SQL("CREATE ROLE {} {} CREATEDB CREATEROLE PASSWORD {}").format(
                sql.Identifier(role.name),
                role_attributes(role),
                role_password(role.password),
            )
            await _execute(conn, query, f"creating role {role.name!r}")
        for database in databases:
            query = sql.SQL("CREATE DATABASE {} OWNER {}").format(
                sql.Identifier(database.name), sql.Identifier(database.owner_name)
            )
            await _execute(conn, query, f"creating database {database.name!r}")


async def _execute(conn: Conn, query: sql.Composed, what: str) -> None:
    try:
        await conn.execute(query)
    except psycopg.Error as exc:
        # The message is the server's (it never echoes the statement, so no password leaks).
        raise ComputeError(f"{what} failed: {exc}") from exc

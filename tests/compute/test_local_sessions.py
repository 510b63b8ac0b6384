"""Platform sessions on real postmasters: pinned settings outrank a tenant's defaults, the monitor
role can only read and is repaired when a tenant breaks it, and the platform's pg_hba holds."""

from __future__ import annotations

import contextlib

import psycopg
import pytest
from compute_helpers import DATABASE, ROLE, Computes, connect, free_port, query

from pgplane.compute.driver import ComputeError, ComputeSpec
from pgplane.compute.local import LocalComputeDriver
from pgplane.compute.local.postgres.binaries import discover
from pgplane.compute.local.postgres.monitor import check_readable, last_client_activity
from pgplane.compute.local.postgres.sessions import (
    ADMIN_USER,
    MONITOR_USER,
    admin_conninfo,
    conninfo,
)
from pgplane.compute.local.postgres.sessions import (
    connect as pinned,
)

VERSIONS = list(discover([]))

# What a tenant sets for every session in its database and of its role (ALTER DATABASE/ROLE …
# SET), and for the whole compute (endpoint pg_settings): each would steer or break ours.
TENANT_DEFAULTS = {
    "search_path": "trap, public",
    "role": ROLE.name,
    "statement_timeout": "1",
    "lock_timeout": "1",
    "idle_session_timeout": "1",
    "default_transaction_read_only": "on",
    "default_transaction_isolation": "serializable",
    "client_encoding": "LATIN1",
    "DateStyle": "SQL, DMY",
    "TimeZone": "Pacific/Kiritimati",
    "standard_conforming_strings": "off",
}
PG_SETTINGS = {"search_path": "trap", "statement_timeout": "2", "lock_timeout": "2"}


async def project(driver: LocalComputeDriver, name: str, version: int, **kw: object) -> ComputeSpec:
    await driver.create_timeline(
        project_id=name,
        branch_id="br-main",
        pg_version=version,
        roles=[ROLE],
        databases=[DATABASE],
    )
    return ComputeSpec(
        project_id=name,
        branch_id="br-main",
        endpoint_id=f"ep-{name}",
        pg_version=version,
        port=free_port(),
        **kw,  # type: ignore[arg-type]
    )


async def admin(
    driver: LocalComputeDriver, spec: ComputeSpec, statement: str, dbname: str = "postgres"
) -> list[tuple[object, ...]]:
    """One statement as cloud_admin, in a pinned session."""
    info = admin_conninfo(driver.socket_dir(spec.endpoint_id), spec.port, dbname)
    async with await pinned(info) as conn:
        cur = await conn.execute(statement.encode())
        return await cur.fetchall() if cur.description else []


@pytest.mark.parametrize("version", VERSIONS)
async def test_pinned_settings_outrank_every_tenant_default(
    driver: LocalComputeDriver, computes: Computes, version: int
) -> None:
    spec = await project(driver, f"proj-pin{version}", version, pg_settings=PG_SETTINGS)
    await computes.start(spec)
    async with await connect(spec.port) as tenant:
        # Its own session is not what is tested: 2 ms is too little for DDL on a busy host.
        await tenant.execute("SET statement_timeout = 0")
        await tenant.execute("SET lock_timeout = 0")
        await tenant.execute("CREATE SCHEMA trap")
        for name, value in TENANT_DEFAULTS.items():
            for target in (f"DATABASE {DATABASE.name}", f"ROLE {ROLE.name}"):
                await tenant.execute(f"ALTER {target} SET {name} = '{value}'".encode())
        await tenant.execute(
            f"ALTER ROLE {ROLE.name} IN DATABASE {DATABASE.name} SET search_path = trap".encode()
        )

        # Not a setting Postgres lets anyone store; were it, the session would be the tenant's.
        for target in (f"DATABASE {DATABASE.name}", f"ROLE {ROLE.name}"):
            with contextlib.suppress(psycopg.Error):
                await tenant.execute(
                    f"ALTER {target} SET session_authorization = {ROLE.name}".encode()
                )

    # They are real defaults: for the database, the role, and the role in the database...
    stored = await admin(driver, spec, "SELECT setconfig FROM pg_catalog.pg_db_role_setting")
    assert len(stored) == 3

    # ...and a platform session, as superuser in that database, has none of them.
    shown = "SELECT current_user, pg_catalog.current_setting('search_path')," + ", ".join(
        f"pg_catalog.current_setting('{n}')"
        for n in (
            "statement_timeout",
            "lock_timeout",
            "idle_session_timeout",
            "default_transaction_read_only",
            "transaction_isolation",
            "client_encoding",
            "DateStyle",
            "TimeZone",
            "standard_conforming_strings",
        )
    )
    rows = await admin(driver, spec, shown, DATABASE.name)
    assert rows == [
        (
            ADMIN_USER,
            "pg_catalog, pg_temp",
            "2min",
            "0",
            "0",
            "off",
            "read committed",
            "UTF8",
            "ISO, MDY",
            "UTC",
            "on",
        )
    ]
    if version >= 16:
        rows = await admin(driver, spec, "SHOW scram_iterations", DATABASE.name)
        assert rows == [("4096",)]
    # The monitor's sessions are pinned as well.
    info = conninfo(
        driver.socket_dir(spec.endpoint_id), spec.port, user=MONITOR_USER, dbname=DATABASE.name
    )
    async with await pinned(info) as monitor:
        cur = await monitor.execute(
            "SELECT current_user, pg_catalog.current_setting('search_path')"
        )
        assert await cur.fetchone() == (MONITOR_USER, "pg_catalog, pg_temp")


async def test_new_clusters_have_the_monitor_and_it_can_only_read(
    driver: LocalComputeDriver, computes: Computes
) -> None:
    spec = await project(driver, "proj-mon", VERSIONS[-1])
    await computes.start(spec)
    rows = await admin(
        driver,
        spec,
        "SELECT rolsuper, rolcreaterole, rolcreatedb, rolcanlogin, rolpassword IS NULL,"
        " pg_catalog.pg_has_role(oid, 'pg_monitor', 'USAGE') FROM pg_catalog.pg_authid"
        " WHERE rolname = 'pgplane_monitor'",
    )
    assert rows == [(False, False, False, True, True, True)]
    socket_dir = driver.socket_dir(spec.endpoint_id)
    info = conninfo(socket_dir, spec.port, user=MONITOR_USER, dbname=DATABASE.name)
    async with await pinned(info) as monitor:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            await monitor.execute("CREATE TABLE public.t ()")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            await monitor.execute("ALTER ROLE neondb_owner SUPERUSER")
    # It sees the tenant's backends in full, its own sessions aside.
    async with await connect(spec.port) as tenant:
        await tenant.execute("BEGIN")
        await tenant.execute("SELECT 1")
        before = await last_client_activity(socket_dir, spec.port)
        assert before is not None
    await check_readable(socket_dir, spec.port)


BREAKAGES = [
    f"DROP ROLE {MONITOR_USER}",
    f"ALTER ROLE {MONITOR_USER} NOLOGIN",
    f"ALTER ROLE {MONITOR_USER} CONNECTION LIMIT 0",
    f"REVOKE pg_monitor FROM {MONITOR_USER}",
    f"ALTER ROLE {MONITOR_USER} NOINHERIT",
]


@pytest.mark.parametrize("breakage", BREAKAGES)
async def test_a_broken_monitor_is_repaired_by_the_next_check(
    driver: LocalComputeDriver, computes: Computes, breakage: str
) -> None:
    """What a tenant with CREATEROLE may do to the role on Postgres 15 (done here as superuser,
    on every version): the next check repairs it and answers; it never crashes."""
    name = f"proj-mon{BREAKAGES.index(breakage)}"
    spec = await project(driver, name, VERSIONS[-1])
    await computes.start(spec)
    socket_dir = driver.socket_dir(spec.endpoint_id)
    async with await connect(spec.port) as tenant:
        await tenant.execute("BEGIN")
        await tenant.execute("SELECT 1")  # a transaction open: the compute is busy
        await admin(driver, spec, breakage)
        assert await last_client_activity(socket_dir, spec.port) is not None
        await admin(driver, spec, breakage)
        await check_readable(socket_dir, spec.port)


async def test_a_database_closed_to_public_is_still_checked(
    driver: LocalComputeDriver, computes: Computes
) -> None:
    spec = await project(driver, "proj-closed", VERSIONS[-1])
    await computes.start(spec)
    await query(spec.port, f"REVOKE CONNECT ON DATABASE {DATABASE.name} FROM PUBLIC")
    await check_readable(driver.socket_dir(spec.endpoint_id), spec.port)


async def test_a_check_on_a_stopped_compute_is_a_compute_error(
    driver: LocalComputeDriver, computes: Computes
) -> None:
    spec = await project(driver, "proj-gone", VERSIONS[-1])
    await computes.start(spec)
    socket_dir = driver.socket_dir(spec.endpoint_id)
    await computes.stop_all()
    with pytest.raises(ComputeError):
        await last_client_activity(socket_dir, spec.port)
    with pytest.raises(ComputeError):
        await check_readable(socket_dir, spec.port)


async def test_the_platforms_hba_holds_for_clusters_that_say_otherwise(
    driver: LocalComputeDriver, computes: Computes
) -> None:
    """Over the 0700 socket every role is trusted (the proxy authenticated the client); TCP
    wants the password; and a cluster whose own pg_hba.conf says otherwise (one made before this
    rule, or edited) follows the platform's file, named on the postmaster's command line."""
    spec = await project(driver, "proj-hba", VERSIONS[-1])
    pgdata = driver.pgdata(spec.project_id, spec.branch_id)
    (pgdata / "pg_hba.conf").write_text("local all all reject\nhost all all all reject\n")
    await computes.start(spec)
    socket_dir = driver.socket_dir(spec.endpoint_id)
    async with await psycopg.AsyncConnection.connect(
        host=str(socket_dir), port=spec.port, user=ROLE.name, dbname=DATABASE.name
    ) as conn:
        cur = await conn.execute("SELECT current_user")
        assert await cur.fetchone() == (ROLE.name,)
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        await connect(spec.port, password="not-the-password")
    hba = driver.layout.hba_file
    assert await admin(driver, spec, "SHOW hba_file") == [(str(hba),)]
    assert (hba.stat().st_mode & 0o777, hba.parent.stat().st_mode & 0o777) == (0o644, 0o755)

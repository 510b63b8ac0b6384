"""apply_config on real postmasters: roles, passwords and databases converged with SQL."""

from __future__ import annotations

import psycopg
import pytest
from compute_helpers import DATABASE, ROLE, Computes, connect, free_port, query

from pgplane.compute.driver import (
    ComputeError,
    ComputeSpec,
    ConfigChange,
    DatabaseSpec,
    RoleSpec,
)
from pgplane.compute.local import LocalComputeDriver
from pgplane.compute.local.postgres.pidfile import read_pid_file
from pgplane.compute.local.postgres.sessions import admin_conninfo


def newest(driver: LocalComputeDriver) -> int:
    return driver.pg_versions()[-1]


async def new_project(driver: LocalComputeDriver, project_id: str) -> ComputeSpec:
    """A root branch with the default role and database, and the spec of its compute."""
    await driver.create_timeline(
        project_id=project_id,
        branch_id="br-main",
        pg_version=newest(driver),
        roles=[ROLE],
        databases=[DATABASE],
    )
    return ComputeSpec(
        project_id=project_id,
        branch_id="br-main",
        endpoint_id=f"ep-{project_id}",
        pg_version=newest(driver),
        port=free_port(),
    )


async def apply(
    driver: LocalComputeDriver,
    compute: ComputeSpec | None,
    change: ConfigChange,
    *,
    project_id: str | None = None,
    branch_id: str = "br-main",
) -> None:
    await driver.apply_config(
        project_id=project_id or (compute.project_id if compute else ""),
        branch_id=branch_id,
        pg_version=newest(driver),
        compute=compute,
        change=change,
    )


async def logs_in(port: int, user: str, password: str, dbname: str = DATABASE.name) -> bool:
    try:
        async with await connect(port, user=user, password=password, dbname=dbname) as conn:
            cur = await conn.execute("SELECT current_user")
            return await cur.fetchone() == (user,)
    except psycopg.OperationalError as exc:
        refused = "password authentication failed" in str(exc) or "not permitted" in str(exc)
        if not refused:
            raise
        return False


async def owners(port: int) -> dict[str, str]:
    rows = await query(
        port, "SELECT datname, pg_get_userbyid(datdba) FROM pg_database WHERE NOT datistemplate"
    )
    return {str(name): str(owner) for name, owner in rows}


async def test_roles_are_created_and_passwords_reset(
    driver: LocalComputeDriver, computes: Computes
) -> None:
    compute = await new_project(driver, "proj-roles")
    computes.started.append(compute)
    alice = RoleSpec(name="alice", password="first'pass\"word")
    # The compute is not running: apply_config starts it, as start_compute would.
    await apply(driver, compute, ConfigChange(roles=[ROLE, alice]))
    assert await logs_in(compute.port, "alice", alice.password)

    rotated = RoleSpec(name="alice", password="second-pass")
    await apply(driver, compute, ConfigChange(roles=[ROLE, rotated]))
    assert not await logs_in(compute.port, "alice", alice.password)
    assert await logs_in(compute.port, "alice", rotated.password)
    assert await logs_in(compute.port, ROLE.name, ROLE.password)  # untouched, still works

    rows = await query(
        compute.port,
        "SELECT rolcanlogin, rolcreatedb, rolcreaterole FROM pg_roles WHERE rolname = 'alice'",
    )
    assert rows == [(True, True, True)]
    async with await psycopg.AsyncConnection.connect(
        admin_conninfo(driver.socket_dir(compute.endpoint_id), compute.port)
    ) as admin:
        cur = await admin.execute(
            "SELECT rolpassword LIKE 'SCRAM-SHA-256$%%' FROM pg_authid WHERE rolname = 'alice'"
        )
        assert await cur.fetchone() == (True,)


async def test_nologin_role(driver: LocalComputeDriver, computes: Computes) -> None:
    compute = await new_project(driver, "proj-nologin")
    await computes.start(compute)
    bob = RoleSpec(name="bob", password="bob-pass", login=False)
    await apply(driver, compute, ConfigChange(roles=[bob]))
    assert not await logs_in(compute.port, "bob", "bob-pass")
    assert await query(compute.port, "SELECT rolcanlogin FROM pg_roles WHERE rolname = 'bob'") == [
        (False,)
    ]
    await apply(driver, compute, ConfigChange(roles=[RoleSpec("bob", "bob-pass", login=True)]))
    assert await logs_in(compute.port, "bob", "bob-pass")
    await apply(driver, compute, ConfigChange(roles=[bob]))
    assert not await logs_in(compute.port, "bob", "bob-pass")


async def test_databases_are_created_renamed_given_and_dropped(
    driver: LocalComputeDriver, computes: Computes
) -> None:
    compute = await new_project(driver, "proj-dbs")
    await computes.start(compute)
    carol = RoleSpec(name="carol", password="carol-pass")
    change = ConfigChange(
        roles=[carol],
        databases=[DatabaseSpec("shop", "carol"), DatabaseSpec("Mixed Case", ROLE.name)],
    )
    await apply(driver, compute, change)
    await apply(driver, compute, change)  # converged: a second time changes nothing
    assert (await owners(compute.port)).items() >= {
        "shop": "carol",
        "Mixed Case": ROLE.name,
    }.items()
    assert await logs_in(compute.port, "carol", "carol-pass", dbname="shop")

    async with await connect(compute.port, user="carol", password="carol-pass", dbname="shop"):
        # A session on the database does not stop the rename: it is ended.
        rename = ConfigChange(
            renamed_databases={"shop": "store"}, databases=[DatabaseSpec("store", ROLE.name)]
        )
        await apply(driver, compute, rename)
    await apply(driver, compute, rename)  # renamed already: nothing to do
    found = await owners(compute.port)
    assert "shop" not in found
    assert found["store"] == ROLE.name  # the owner changed too

    async with await connect(compute.port, dbname="store"):
        await apply(driver, compute, ConfigChange(dropped_databases=["store", "Mixed Case"]))
    await apply(driver, compute, ConfigChange(dropped_databases=["store"]))  # gone: no-op
    found = await owners(compute.port)
    assert "store" not in found
    assert "Mixed Case" not in found
    assert found[DATABASE.name] == ROLE.name


async def test_dropping_a_role_that_owns_objects(
    driver: LocalComputeDriver, computes: Computes
) -> None:
    compute = await new_project(driver, "proj-droprole")
    await computes.start(compute)
    dave = RoleSpec(name="dave", password="dave-pass")
    await apply(
        driver, compute, ConfigChange(roles=[dave], databases=[DatabaseSpec("daves", "dave")])
    )
    await query(compute.port, "GRANT CREATE ON SCHEMA public TO dave")
    async with await connect(compute.port, user="dave", password="dave-pass") as conn:
        await conn.execute("CREATE TABLE dave_table AS SELECT 1 AS id")
    async with await connect(compute.port, user="dave", password="dave-pass", dbname="daves") as c:
        await c.execute("CREATE TABLE in_his_own AS SELECT 2 AS id")

    await apply(driver, compute, ConfigChange(dropped_roles=["dave"]))
    await apply(driver, compute, ConfigChange(dropped_roles=["dave"]))  # gone: no-op
    assert await query(compute.port, "SELECT 1 FROM pg_roles WHERE rolname = 'dave'") == []
    # Its objects were given to the database's owner, not dropped; so was its database.
    assert await query(
        compute.port, "SELECT tableowner FROM pg_tables WHERE tablename = 'dave_table'"
    ) == [(ROLE.name,)]
    assert (await owners(compute.port))["daves"] == ROLE.name
    assert await query(compute.port, "SELECT id FROM in_his_own", dbname="daves") == [(2,)]


async def test_a_branch_without_compute_gets_a_temporary_postmaster(
    driver: LocalComputeDriver, computes: Computes
) -> None:
    parent = await new_project(driver, "proj-nocompute")
    await computes.start(parent)
    await query(parent.port, "CREATE TABLE t AS SELECT 1 AS id")
    # A branch copied online and never started: the temporary postmaster also replays its WAL.
    await driver.create_branch(
        project_id="proj-nocompute",
        parent_branch_id="br-main",
        branch_id="br-child",
        pg_version=newest(driver),
    )
    erin = RoleSpec(name="erin", password="erin-pass")
    change = ConfigChange(roles=[erin], databases=[DatabaseSpec("erins", "erin")])
    await apply(driver, None, change, project_id="proj-nocompute", branch_id="br-child")
    pgdata = driver.pgdata("proj-nocompute", "br-child")
    assert read_pid_file(pgdata) is None  # stopped again
    assert not driver.layout.init_socket_dir("proj-nocompute", "br-child").exists()

    child = ComputeSpec(
        project_id="proj-nocompute",
        branch_id="br-child",
        endpoint_id="ep-nocompute-child",
        pg_version=newest(driver),
        port=free_port(),
    )
    await computes.start(child)
    assert await logs_in(child.port, "erin", "erin-pass", dbname="erins")
    assert await query(child.port, "SELECT id FROM t") == [(1,)]
    assert not await logs_in(parent.port, "erin", "erin-pass")  # the parent's roles are its own

    # With no compute named but one running on the branch, the change goes through it.
    await apply(
        driver,
        None,
        ConfigChange(roles=[RoleSpec("erin", "rotated")]),
        project_id="proj-nocompute",
        branch_id="br-child",
    )
    assert await logs_in(child.port, "erin", "rotated")


async def test_reserved_names_are_refused(driver: LocalComputeDriver) -> None:
    compute = await new_project(driver, "proj-reserved")
    for change in (
        ConfigChange(roles=[RoleSpec("cloud_admin", "x")]),
        ConfigChange(roles=[RoleSpec("pg_monitor", "x")]),
        ConfigChange(dropped_roles=["cloud_admin"]),
        ConfigChange(roles=[RoleSpec("pgplane_monitor", "x")]),
        ConfigChange(dropped_roles=["pgplane_monitor"]),
        ConfigChange(databases=[DatabaseSpec("other", "pgplane_monitor")]),
        ConfigChange(dropped_databases=["postgres"]),
        ConfigChange(renamed_databases={"template1": "mine"}),
        ConfigChange(databases=[DatabaseSpec("other", "cloud_admin")]),
    ):
        with pytest.raises(ComputeError, match="reserved"):
            await apply(driver, compute, change)
    assert not await driver.is_compute_running(
        project_id="proj-reserved", branch_id="br-main", endpoint_id=compute.endpoint_id
    )


async def test_a_failing_statement_is_reported(
    driver: LocalComputeDriver, computes: Computes
) -> None:
    compute = await new_project(driver, "proj-fail")
    await computes.start(compute)
    with pytest.raises(ComputeError, match=r"creating database 'x'.*does not exist"):
        await apply(driver, compute, ConfigChange(databases=[DatabaseSpec("x", "nobody")]))

"""The local compute driver end to end, on real postmasters."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import socket
from pathlib import Path

import psycopg
import pytest
from compute_helpers import DATABASE, ROLE, Computes, crashed_build, free_port, lifecycle

from pgplane.compute.driver import ComputeError, ComputeSpec, InvalidSettings, PortInUse
from pgplane.compute.local import LocalComputeDriver, LocalDriverConfig
from pgplane.compute.local.postgres.binaries import discover
from pgplane.compute.local.postgres.pidfile import is_postmaster_of, read_pid_file
from pgplane.compute.local.postgres.sessions import admin_conninfo


def newest(driver: LocalComputeDriver) -> int:
    return driver.pg_versions()[-1]


async def new_timeline(driver: LocalComputeDriver, project_id: str, branch_id: str) -> None:
    await driver.create_timeline(
        project_id=project_id,
        branch_id=branch_id,
        pg_version=newest(driver),
        roles=[ROLE],
        databases=[DATABASE],
    )


def spec(driver: LocalComputeDriver, project: str, endpoint: str, **kw: object) -> ComputeSpec:
    return ComputeSpec(
        project_id=project,
        branch_id="br-main",
        endpoint_id=endpoint,
        pg_version=newest(driver),
        port=free_port(),
        **kw,  # type: ignore[arg-type]
    )


async def connect(port: int, password: str = ROLE.password) -> psycopg.AsyncConnection[object]:
    return await psycopg.AsyncConnection.connect(
        host="127.0.0.1",
        port=port,
        user=ROLE.name,
        password=password,
        dbname=DATABASE.name,
        sslmode="disable",
        autocommit=True,
    )


def test_discovery_finds_a_version(driver: LocalComputeDriver) -> None:
    versions = list(driver.pg_versions())
    assert versions
    assert versions == sorted(versions)
    assert all(v >= 12 for v in versions)


@pytest.mark.parametrize("version", list(discover([])))
async def test_every_version_found_runs_the_whole_cycle(
    driver: LocalComputeDriver, version: int
) -> None:
    await lifecycle(driver, f"proj-v{version}", f"ep-v{version}", version)


async def test_role_logs_in_over_tcp_with_scram(
    driver: LocalComputeDriver, computes: Computes
) -> None:
    await new_timeline(driver, "proj-scram", "br-main")
    compute = spec(driver, "proj-scram", "ep-scram")
    await computes.start(compute)

    async with await connect(compute.port) as conn:
        await conn.execute("CREATE TABLE t (id int PRIMARY KEY, note text)")
        await conn.execute("INSERT INTO t VALUES (1, 'hello')")
        cur = await conn.execute("SELECT note, current_user, current_database() FROM t")
        assert await cur.fetchone() == ("hello", ROLE.name, DATABASE.name)

    socket_dir = driver.socket_dir("ep-scram")
    async with await psycopg.AsyncConnection.connect(
        admin_conninfo(socket_dir, compute.port)
    ) as admin:
        cur = await admin.execute(
            "SELECT rolpassword LIKE 'SCRAM-SHA-256$%%', rolcreatedb, rolcreaterole "
            "FROM pg_authid WHERE rolname = %s",
            [ROLE.name],
        )
        assert await cur.fetchone() == (True, True, True)


async def test_wrong_password_is_rejected(driver: LocalComputeDriver, computes: Computes) -> None:
    await new_timeline(driver, "proj-wrong", "br-main")
    compute = spec(driver, "proj-wrong", "ep-wrong")
    await computes.start(compute)
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        await connect(compute.port, password="not-the-password")


async def test_start_twice_is_a_no_op_and_stop_converges(
    driver: LocalComputeDriver, computes: Computes
) -> None:
    await new_timeline(driver, "proj-twice", "br-main")
    compute = spec(driver, "proj-twice", "ep-twice")
    ids = {"project_id": "proj-twice", "branch_id": "br-main", "endpoint_id": "ep-twice"}
    pgdata = driver.pgdata("proj-twice", "br-main")

    await computes.start(compute)
    first = read_pid_file(pgdata)
    await computes.start(compute)
    second = read_pid_file(pgdata)
    assert first is not None
    assert second is not None
    assert first.pid == second.pid
    assert await driver.is_compute_running(**ids)

    await driver.stop_compute(**ids)
    assert not await driver.is_compute_running(**ids)
    assert not is_postmaster_of(first.pid, pgdata)
    await driver.stop_compute(**ids)  # stopping a stopped compute is fine
    assert not await driver.is_compute_running(**ids)


async def test_changed_settings_restart_the_postmaster(
    driver: LocalComputeDriver, computes: Computes
) -> None:
    await new_timeline(driver, "proj-settings", "br-main")
    before = spec(driver, "proj-settings", "ep-settings", pg_settings={"work_mem": "8MB"})
    await computes.start(before)
    first = read_pid_file(driver.pgdata("proj-settings", "br-main"))

    after = dataclasses.replace(before, pg_settings={"work_mem": "16MB"})
    await computes.start(after)
    second = read_pid_file(driver.pgdata("proj-settings", "br-main"))
    assert first is not None
    assert second is not None
    assert first.pid != second.pid
    async with await connect(after.port) as conn:
        cur = await conn.execute("SHOW work_mem")
        assert await cur.fetchone() == ("16MB",)


async def test_managed_settings_are_refused(driver: LocalComputeDriver) -> None:
    await new_timeline(driver, "proj-managed", "br-main")
    for settings in ({"port": "1"}, {"hba_file": "/etc/passwd"}, {"bad name": "1"}):
        with pytest.raises(ComputeError):
            await driver.start_compute(
                spec(driver, "proj-managed", "ep-managed", pg_settings=settings)
            )


async def test_settings_are_judged_by_postgres_itself(driver: LocalComputeDriver) -> None:
    version = newest(driver)
    await driver.check_settings(
        pg_version=version,
        settings={"work_mem": "64MB", "statement_timeout": "5min", "search_path": 'a, "b c"'},
    )
    for settings, reason in (
        ({"work_mem": "lots"}, 'invalid value for parameter "work_mem": "lots"'),
        ({"statement_timeout": "-1"}, "outside the valid range"),
        ({"jit": "sometimes"}, 'parameter "jit" requires a Boolean value'),
        ({"port": "1"}, "managed by pgplane"),
    ):
        with pytest.raises(InvalidSettings, match=reason):
            await driver.check_settings(pg_version=version, settings=settings)


async def test_create_timeline_twice_is_a_no_op(driver: LocalComputeDriver) -> None:
    await new_timeline(driver, "proj-again", "br-main")
    pgdata = driver.pgdata("proj-again", "br-main")
    marker_inode = os.stat(pgdata).st_ino
    await new_timeline(driver, "proj-again", "br-main")
    assert os.stat(pgdata).st_ino == marker_inode


async def test_create_timeline_recovers_from_a_crash(
    driver: LocalComputeDriver, data_dir: Path
) -> None:
    # A crash mid-build leaves pgdata.tmp behind, here with its temporary postmaster running.
    await new_timeline(driver, "proj-crash", "br-donor")
    tmp = driver.pgdata("proj-crash", "br-main").with_name("pgdata.tmp")
    leftover = await crashed_build(
        driver, driver.pgdata("proj-crash", "br-donor"), tmp, "crashed", data_dir / "c.log"
    )

    await new_timeline(driver, "proj-crash", "br-main")
    assert not tmp.exists()
    assert not is_postmaster_of(leftover.pid, tmp)
    assert (driver.pgdata("proj-crash", "br-main") / "PG_VERSION").is_file()
    shutil.rmtree(driver.layout.run_root / "crashed")


async def test_unknown_version_lists_the_available_ones(driver: LocalComputeDriver) -> None:
    with pytest.raises(ComputeError, match=r"Postgres 9 is not available \(available: \d+"):
        await driver.create_timeline(
            project_id="proj-v9", branch_id="br-main", pg_version=9, roles=[], databases=[]
        )


async def test_stale_pid_file_does_not_block_a_start(
    driver: LocalComputeDriver, computes: Computes
) -> None:
    # The realistic stale pid: after a crash, the pid now belongs to another live process of the
    # compute user, such as another compute's postmaster. Postgres alone would refuse to start.
    await new_timeline(driver, "proj-other", "br-main")
    await computes.start(spec(driver, "proj-other", "ep-other"))
    other = read_pid_file(driver.pgdata("proj-other", "br-main"))
    assert other is not None
    await new_timeline(driver, "proj-stale", "br-main")
    pgdata = driver.pgdata("proj-stale", "br-main")
    pid_file = pgdata / "postmaster.pid"
    pid_file.write_text(f"{other.pid}\n{pgdata}\n0\n5432\n/tmp\n\n\nready\n")
    (await driver.project_user("proj-stale")).chown(pid_file)

    ids = {"project_id": "proj-stale", "branch_id": "br-main", "endpoint_id": "ep-stale"}
    assert not await driver.is_compute_running(**ids)
    compute = spec(driver, "proj-stale", "ep-stale")
    await computes.start(compute)
    assert await driver.is_compute_running(**ids)
    current = read_pid_file(pgdata)
    assert current is not None
    assert current.pid != other.pid
    assert is_postmaster_of(other.pid, driver.pgdata("proj-other", "br-main"))


async def test_a_restarted_platform_adopts_running_computes(
    driver: LocalComputeDriver, computes: Computes, data_dir: Path
) -> None:
    await new_timeline(driver, "proj-adopt", "br-main")
    compute = spec(driver, "proj-adopt", "ep-adopt")
    await computes.start(compute)
    pid_file = read_pid_file(driver.pgdata("proj-adopt", "br-main"))
    assert pid_file is not None

    restarted = LocalComputeDriver(LocalDriverConfig(data_dir=data_dir, walls=False))
    ids = {"project_id": "proj-adopt", "branch_id": "br-main", "endpoint_id": "ep-adopt"}
    assert await restarted.is_compute_running(**ids)
    await restarted.start_compute(compute)  # converges on the running one
    assert read_pid_file(driver.pgdata("proj-adopt", "br-main")) == pid_file
    await restarted.stop_compute(**ids)
    assert not is_postmaster_of(pid_file.pid, driver.pgdata("proj-adopt", "br-main"))
    assert not await driver.is_compute_running(**ids)


async def test_storage_config_is_written_atomically(driver: LocalComputeDriver) -> None:
    await driver.apply_storage_config(project_id="proj-storage", history_retention_seconds=3600)
    path = driver.layout.storage_config("proj-storage")
    assert json.loads(path.read_text()) == {"history_retention_seconds": 3600}
    await driver.apply_storage_config(project_id="proj-storage", history_retention_seconds=0)
    assert json.loads(path.read_text()) == {"history_retention_seconds": 0}
    assert [p.name for p in path.parent.iterdir() if p.is_file()] == ["storage.json"]


async def test_delete_tenant_stops_and_removes_everything(
    driver: LocalComputeDriver, computes: Computes
) -> None:
    await new_timeline(driver, "proj-delete", "br-main")
    compute = spec(driver, "proj-delete", "ep-delete")
    await computes.start(compute)
    await driver.apply_storage_config(project_id="proj-delete", history_retention_seconds=60)
    pid_file = read_pid_file(driver.pgdata("proj-delete", "br-main"))
    assert pid_file is not None

    await driver.delete_tenant(project_id="proj-delete")
    assert not is_postmaster_of(pid_file.pid, driver.pgdata("proj-delete", "br-main"))
    assert not driver.layout.project_dir("proj-delete").exists()
    assert not driver.socket_dir("ep-delete").exists()
    log = driver.log_path(project_id="proj-delete", branch_id="br-main", endpoint_id="ep-delete")
    assert not log.exists()
    assert not any(p.name.startswith(".trash-") for p in driver.layout.projects.iterdir())
    await driver.delete_tenant(project_id="proj-delete")  # already gone: no-op


@pytest.mark.parametrize("hostile", ["../../etc", "", "A", "a/b", "a" * 61, "ok\n", ".", ".."])
async def test_hostile_ids_never_become_paths(driver: LocalComputeDriver, hostile: str) -> None:
    version = newest(driver)
    ids = {"project_id": hostile, "branch_id": "br-main", "endpoint_id": "ep-x"}
    with pytest.raises(ComputeError, match="invalid"):
        await driver.create_timeline(
            project_id=hostile, branch_id="br-main", pg_version=version, roles=[], databases=[]
        )
    with pytest.raises(ComputeError, match="invalid"):
        await driver.create_timeline(
            project_id="proj-ok", branch_id=hostile, pg_version=version, roles=[], databases=[]
        )
    with pytest.raises(ComputeError, match="invalid"):
        await driver.start_compute(
            ComputeSpec(
                project_id="proj-ok",
                branch_id="br-main",
                endpoint_id=hostile,
                pg_version=version,
                port=free_port(),
            )
        )
    for method in (driver.stop_compute, driver.is_compute_running):
        with pytest.raises(ComputeError, match="invalid"):
            await method(**ids)
    with pytest.raises(ComputeError, match="invalid"):
        await driver.apply_storage_config(project_id=hostile, history_retention_seconds=1)
    with pytest.raises(ComputeError, match="invalid"):
        await driver.delete_tenant(project_id=hostile)


async def test_a_port_another_program_holds_is_reported_before_starting(
    driver: LocalComputeDriver, computes: Computes
) -> None:
    await new_timeline(driver, "proj-busy", "br-main")
    compute = spec(driver, "proj-busy", "ep-busy")
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", compute.port))
        squatter.listen()
        # Named, so the platform can move the compute (engine/handlers.start_compute).
        with pytest.raises(PortInUse, match=str(compute.port)) as raised:
            await computes.start(compute)
        assert raised.value.port == compute.port
    ids = {"project_id": "proj-busy", "branch_id": "br-main", "endpoint_id": "ep-busy"}
    assert not await driver.is_compute_running(**ids)
    await computes.start(compute)  # the port is free again
    assert await driver.is_compute_running(**ids)


async def test_concurrent_create_timeline_calls_converge(driver: LocalComputeDriver) -> None:
    calls = [new_timeline(driver, "proj-many", f"br-{i % 3}") for i in range(6)]
    await asyncio.gather(*calls)
    for i in range(3):
        pgdata = driver.pgdata("proj-many", f"br-{i}")
        assert (pgdata / "PG_VERSION").is_file()
        assert not pgdata.with_name("pgdata.tmp").exists()


def _working_in(pgdata: Path) -> list[int]:
    """Live processes whose working directory is ``pgdata`` (a postmaster and its children)."""
    found = []
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if proc.name.isdigit() and os.readlink(proc / "cwd") == str(pgdata.resolve()):
                state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":
                    found.append(int(proc.name))
    return found


async def test_a_killed_postmasters_busy_backend_does_not_block_its_restart(
    driver: LocalComputeDriver, computes: Computes
) -> None:
    """A backend busy in a query does not notice its postmaster died (it looks only when it
    waits), and keeps the old shared memory attached, which makes a new postmaster refuse to
    start; the start ends it first."""
    await new_timeline(driver, "proj-orphan", "br-main")
    compute = spec(driver, "proj-orphan", "ep-orphan")
    await computes.start(compute)
    pgdata = driver.pgdata("proj-orphan", "br-main")
    old = read_pid_file(pgdata)
    assert old is not None
    conn = await connect(compute.port)
    busy = asyncio.ensure_future(
        conn.execute(
            "DO $$ BEGIN WHILE clock_timestamp() < now() + interval '60 s' LOOP END LOOP; END $$"
        )
    )
    orphans: list[int] = []
    try:
        async with await connect(compute.port) as watcher:
            for _ in range(600):  # until the loop runs (a minute at most)
                running = await watcher.execute(
                    "SELECT 1 FROM pg_stat_activity WHERE state = 'active' AND query LIKE 'DO %'"
                )
                if await running.fetchone() is not None:
                    break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError("the busy query never ran")
        os.kill(old.pid, signal.SIGKILL)
        for _ in range(600):  # until the postmaster is gone (dead or a zombie)
            if old.pid not in _working_in(pgdata):
                break
            await asyncio.sleep(0.1)
        orphans = _working_in(pgdata)
        assert orphans != []  # the busy backend outlived its postmaster
        await computes.start(compute)
        new = read_pid_file(pgdata)
        assert new is not None and new.pid != old.pid
        assert set(orphans) & set(_working_in(pgdata)) == set()
        async with await connect(compute.port) as again:
            assert await (await again.execute("SELECT 1")).fetchone() == (1,)
    finally:
        for orphan in orphans:  # never leave a spinning orphan behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(orphan, signal.SIGKILL)
        with contextlib.suppress(psycopg.Error):
            await busy
        await conn.close()

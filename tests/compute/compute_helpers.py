"""Helpers shared by the compute tests (fixtures live in conftest.py)."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import time
from pathlib import Path

import psycopg

from pgplane.compute.driver import ComputeSpec, DatabaseSpec, RoleSpec
from pgplane.compute.local import LocalComputeDriver
from pgplane.compute.local.layout import Layout
from pgplane.compute.local.postgres.command import postmaster_argv
from pgplane.compute.local.postgres.pidfile import PidFile, is_postmaster_of, read_pid_file
from pgplane.compute.local.postgres.postmaster import Postmasters
from pgplane.compute.local.postgres.sessions import admin_conninfo
from pgplane.compute.local.tenants.users import remove_project_users

ROLE = RoleSpec(name="neondb_owner", password="npg_s3cret'\"pass")
DATABASE = DatabaseSpec(name="neondb", owner_name="neondb_owner")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def stop_leftover_postmasters(data_dir: Path) -> list[int]:
    """SIGQUIT every live postmaster on a data directory under ``data_dir``; their pids."""
    stopped = []
    for pid_file in data_dir.glob("projects/*/branches/*/*/postmaster.pid"):
        info = read_pid_file(pid_file.parent)
        if info is not None and is_postmaster_of(info.pid, pid_file.parent):
            os.kill(info.pid, signal.SIGQUIT)
            stopped.append(info.pid)
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in stopped) and time.monotonic() < deadline:
        time.sleep(0.01)
    return stopped


def clean_up(data_dir: Path) -> None:
    """A test's data directory done with: its postmasters stopped, and its socket directories'
    parent removed where that is outside it (a long path's sockets go under /tmp)."""
    stop_leftover_postmasters(data_dir)
    remove_project_users(data_dir)
    run_root = Layout(data_dir).run_root
    if not run_root.is_relative_to(data_dir):
        shutil.rmtree(run_root, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"


async def connect(
    port: int,
    *,
    user: str = ROLE.name,
    password: str = ROLE.password,
    dbname: str = DATABASE.name,
) -> psycopg.AsyncConnection[tuple[object, ...]]:
    """A client over TCP with a password (SCRAM), as any user of the platform connects."""
    return await psycopg.AsyncConnection.connect(
        host="127.0.0.1",
        port=port,
        user=user,
        password=password,
        dbname=dbname,
        sslmode="disable",
        autocommit=True,
    )


async def query(
    port: int, statement: str, *, dbname: str = DATABASE.name
) -> list[tuple[object, ...]]:
    """Run one statement as the default role; its rows ([] when it returns none)."""
    async with await connect(port, dbname=dbname) as conn:
        cur = await conn.execute(statement)
        return await cur.fetchall() if cur.description else []


async def admin_query(
    driver: LocalComputeDriver, spec: ComputeSpec, statement: str
) -> list[tuple[object, ...]]:
    """Run one statement as cloud_admin over the compute's unix socket."""
    conninfo = admin_conninfo(driver.socket_dir(spec.endpoint_id), spec.port)
    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
        cur = await conn.execute(statement)
        return await cur.fetchall() if cur.description else []


class Computes:
    """Starts computes through the driver and remembers them, so teardown stops them all."""

    def __init__(self, driver: LocalComputeDriver) -> None:
        self.driver = driver
        self.started: list[ComputeSpec] = []

    async def start(self, spec: ComputeSpec) -> None:
        self.started.append(spec)
        await self.driver.start_compute(spec)

    async def stop_all(self) -> None:
        for spec in self.started:
            await self.driver.stop_compute(
                project_id=spec.project_id, branch_id=spec.branch_id, endpoint_id=spec.endpoint_id
            )


async def lifecycle(
    driver: LocalComputeDriver, project_id: str, endpoint_id: str, version: int | None = None
) -> int:
    """create_timeline, start, SCRAM login over TCP with a table round trip, stop; the pid."""
    version = version or driver.pg_versions()[-1]
    await driver.create_timeline(
        project_id=project_id,
        branch_id="br-main",
        pg_version=version,
        roles=[ROLE],
        databases=[DATABASE],
    )
    spec = ComputeSpec(
        project_id=project_id,
        branch_id="br-main",
        endpoint_id=endpoint_id,
        pg_version=version,
        port=free_port(),
    )
    ids = {"project_id": project_id, "branch_id": "br-main", "endpoint_id": endpoint_id}
    await driver.start_compute(spec)
    try:
        async with await psycopg.AsyncConnection.connect(
            host="127.0.0.1",
            port=spec.port,
            user=ROLE.name,
            password=ROLE.password,
            dbname=DATABASE.name,
            autocommit=True,
        ) as conn:
            await conn.execute("CREATE TABLE t AS SELECT 42 AS answer")
            cur = await conn.execute("SELECT answer, current_setting('server_version_num') FROM t")
            answer, version_num = await cur.fetchone() or (None, "0")
        assert answer == 42
        assert int(version_num) // 10000 == version
        pid_file = read_pid_file(driver.pgdata(project_id, "br-main"))
        assert pid_file is not None
        assert await driver.is_compute_running(**ids)
    finally:
        await driver.stop_compute(**ids)
    assert not await driver.is_compute_running(**ids)
    return pid_file.pid


async def crashed_build(
    driver: LocalComputeDriver, donor: Path, tmp: Path, socket_name: str, log_path: Path
) -> PidFile:
    """What a pgplane process that crashed mid-build leaves: ``tmp`` (a copy of ``donor``) with
    a postmaster running on it that no living process knows of."""
    run_as = await driver.project_user(tmp.parents[2].name)

    def copy() -> None:
        tmp.parent.mkdir(parents=True)
        shutil.copytree(donor, tmp, symlinks=True)
        for path in [tmp, *tmp.rglob("*")]:
            run_as.chown(path)

    await asyncio.to_thread(copy)
    crashed = Postmasters(driver.layout.postmaster_records)  # the pgplane process that crashed
    socket_dir = driver.layout.run_root / socket_name
    socket_dir.mkdir(mode=0o700)
    run_as.chown(socket_dir)
    install = await driver.runnable_installation(driver.pg_versions()[-1])
    argv = postmaster_argv(
        install,
        tmp,
        port=5432,
        socket_dir=socket_dir,
        listen="",
        settings={},
        hba_file=driver.layout.hba_file,
    )
    await crashed.start(
        argv, pgdata=tmp, port=5432, socket_dir=socket_dir, run_as=run_as, log_path=log_path
    )
    leftover = read_pid_file(tmp)
    assert leftover is not None
    crashed.forget()
    return leftover

"""create_branch on real postmasters: running parents copied online, stopped ones as files."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shutil
import signal
from pathlib import Path

import pytest
from compute_helpers import (
    DATABASE,
    ROLE,
    Computes,
    admin_query,
    connect,
    crashed_build,
    free_port,
    query,
)

from pgplane.compute.driver import ComputeError, ComputeSpec
from pgplane.compute.local import LocalComputeDriver
from pgplane.compute.local.postgres.binaries import discover
from pgplane.compute.local.postgres.pidfile import is_postmaster_of, read_pid_file


def newest(driver: LocalComputeDriver) -> int:
    return driver.pg_versions()[-1]


async def new_timeline(driver: LocalComputeDriver, project_id: str) -> None:
    await driver.create_timeline(
        project_id=project_id,
        branch_id="br-main",
        pg_version=newest(driver),
        roles=[ROLE],
        databases=[DATABASE],
    )


async def branch(driver: LocalComputeDriver, project_id: str, parent: str, branch_id: str) -> None:
    await driver.create_branch(
        project_id=project_id,
        parent_branch_id=parent,
        branch_id=branch_id,
        pg_version=newest(driver),
    )


async def start(
    driver: LocalComputeDriver, computes: Computes, project_id: str, branch_id: str
) -> ComputeSpec:
    spec = ComputeSpec(
        project_id=project_id,
        branch_id=branch_id,
        endpoint_id=f"ep-{project_id}-{branch_id}"[:60],
        pg_version=newest(driver),
        port=free_port(),
    )
    await computes.start(spec)
    return spec


async def stop(driver: LocalComputeDriver, spec: ComputeSpec) -> None:
    await driver.stop_compute(
        project_id=spec.project_id, branch_id=spec.branch_id, endpoint_id=spec.endpoint_id
    )


async def ids(port: int, table: str = "t") -> list[int]:
    rows = await query(port, f"SELECT id FROM {table} ORDER BY id")  # noqa: S608 - tests' tables
    return [int(str(row[0])) for row in rows]


class Writer:
    """Inserts into the parent as fast as it can, counting its commits, until stopped."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.commits = 0
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Writer:
        await query(self.port, "CREATE TABLE w (id bigint PRIMARY KEY, pad text)")
        self._task = asyncio.create_task(self._run())
        return self

    async def _run(self) -> None:
        async with await connect(self.port) as conn:
            while not self._stop.is_set():
                await conn.execute(
                    "INSERT INTO w VALUES (%s, repeat('w', 300))", [self.commits + 1]
                )
                self.commits += 1

    async def until(self, commits: int) -> None:
        while self.commits < commits:
            assert self._task is not None
            if self._task.done():
                self._task.result()  # raises what stopped the writer
            await asyncio.sleep(0.005)

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._task is not None
        await self._task  # re-raises anything that failed a commit


async def test_online_branch_of_a_running_parent_under_writes(
    driver: LocalComputeDriver, computes: Computes
) -> None:
    await new_timeline(driver, "proj-online")
    parent = await start(driver, computes, "proj-online", "br-main")
    await query(parent.port, "CREATE TABLE t (id int PRIMARY KEY)")
    await query(parent.port, "INSERT INTO t SELECT generate_series(1, 1000)")
    await query(parent.port, "CREATE UNLOGGED TABLE scratch AS SELECT 1 AS id")

    async with Writer(parent.port) as writer:
        await writer.until(20)
        before = writer.commits
        await branch(driver, "proj-online", "br-main", "br-child")
        during = writer.commits - before
        await writer.until(writer.commits + 20)  # and it goes on after the copy
    assert during > 0, "the parent's writer made no progress while the branch was copied"
    parent_rows = await ids(parent.port, "w")

    pgdata = driver.pgdata("proj-online", "br-child")
    assert (pgdata / "backup_label").is_file()  # replayed at the first start
    assert not (pgdata / "postmaster.pid").exists()
    assert list((pgdata / "pg_replslot").iterdir()) == []  # not the copy's temporary slot
    # The copy's temporary slot ended with its session.
    assert await admin_query(driver, parent, "SELECT count(*) FROM pg_replication_slots") == [(0,)]

    child = await start(driver, computes, "proj-online", "br-child")
    assert await ids(child.port) == list(range(1, 1001))
    child_rows = await ids(child.port, "w")
    # A consistent prefix of the writer's commits: all those made before the branch began,
    # none that the parent does not have, no gap.
    assert len(child_rows) >= before
    assert child_rows == parent_rows[: len(child_rows)]
    assert await query(child.port, "SELECT count(*) FROM scratch") == [(0,)]  # unlogged: reset

    await query(child.port, "INSERT INTO t VALUES (-1)")
    await query(parent.port, "INSERT INTO t VALUES (-2)")
    assert (await ids(child.port))[:1] == [-1]
    assert (await ids(parent.port))[:1] == [-2]
    assert -2 not in await ids(child.port)
    assert -1 not in await ids(parent.port)


async def test_offline_branch_of_a_stopped_parent(
    driver: LocalComputeDriver, computes: Computes
) -> None:
    await new_timeline(driver, "proj-offline")
    parent = await start(driver, computes, "proj-offline", "br-main")
    await query(parent.port, "CREATE TABLE t (id int PRIMARY KEY)")
    await query(parent.port, "INSERT INTO t SELECT generate_series(1, 100)")
    await query(parent.port, "CREATE UNLOGGED TABLE scratch AS SELECT 1 AS id")
    # Fill pg_wal with segments that a copy of the stopped parent does not need.
    for _ in range(3):
        await admin_query(driver, parent, "SELECT pg_switch_wal()")
        await query(parent.port, "INSERT INTO t VALUES (1000) ON CONFLICT DO NOTHING")
    await admin_query(driver, parent, "CHECKPOINT")
    await stop(driver, parent)

    await branch(driver, "proj-offline", "br-main", "br-child")
    pgdata = driver.pgdata("proj-offline", "br-child")
    assert not (pgdata / "backup_label").exists()
    segments = [p for p in (pgdata / "pg_wal").iterdir() if p.is_file()]
    assert len(segments) == 1  # only the one with the shutdown checkpoint
    assert (pgdata / "pg_wal" / "archive_status").is_dir()

    child = await start(driver, computes, "proj-offline", "br-child")
    assert await ids(child.port) == [*range(1, 101), 1000]
    # A clean copy keeps unlogged data, as a restart of the parent would.
    assert await query(child.port, "SELECT count(*) FROM scratch") == [(1,)]
    await query(child.port, "INSERT INTO t VALUES (-1)")
    parent = await start(driver, computes, "proj-offline", "br-main")
    assert -1 not in await ids(parent.port)


async def test_branch_of_a_branch(driver: LocalComputeDriver, computes: Computes) -> None:
    await new_timeline(driver, "proj-chain")
    root = await start(driver, computes, "proj-chain", "br-main")
    await query(root.port, "CREATE TABLE t (id int PRIMARY KEY)")
    await query(root.port, "INSERT INTO t VALUES (1)")
    await branch(driver, "proj-chain", "br-main", "br-one")
    await query(root.port, "INSERT INTO t VALUES (2)")

    # br-one was never started: its copy carries br-one's backup label and WAL along.
    await branch(driver, "proj-chain", "br-one", "br-two")
    assert (driver.pgdata("proj-chain", "br-two") / "backup_label").is_file()

    one = await start(driver, computes, "proj-chain", "br-one")
    await query(one.port, "INSERT INTO t VALUES (10)")
    await branch(driver, "proj-chain", "br-one", "br-three")  # online, from a branch
    await query(one.port, "INSERT INTO t VALUES (11)")

    two = await start(driver, computes, "proj-chain", "br-two")
    three = await start(driver, computes, "proj-chain", "br-three")
    assert await ids(root.port) == [1, 2]
    assert await ids(one.port) == [1, 10, 11]
    assert await ids(two.port) == [1]
    assert await ids(three.port) == [1, 10]


async def test_create_branch_converges_after_a_crash(
    driver: LocalComputeDriver, computes: Computes, data_dir: Path
) -> None:
    await new_timeline(driver, "proj-retry")
    parent = await start(driver, computes, "proj-retry", "br-main")
    await query(parent.port, "CREATE TABLE t AS SELECT 7 AS id")
    await stop(driver, parent)
    # A crash mid-copy leaves pgdata.tmp behind, here with a postmaster running on it.
    pgdata = driver.pgdata("proj-retry", "br-child")
    tmp = pgdata.with_name("pgdata.tmp")
    leftover = await crashed_build(
        driver,
        driver.pgdata("proj-retry", "br-main"),
        tmp,
        "crashed-branch",
        data_dir / "crashed-branch.log",
    )

    await branch(driver, "proj-retry", "br-main", "br-child")
    assert not tmp.exists()
    assert not is_postmaster_of(leftover.pid, tmp)
    shutil.rmtree(driver.layout.run_root / "crashed-branch")
    inode = pgdata.stat().st_ino
    await branch(driver, "proj-retry", "br-main", "br-child")  # done: a no-op
    assert pgdata.stat().st_ino == inode
    child = await start(driver, computes, "proj-retry", "br-child")
    assert await ids(child.port) == [7]


async def test_create_branch_refuses_what_it_cannot_copy(driver: LocalComputeDriver) -> None:
    with pytest.raises(ComputeError, match="has no data"):
        await branch(driver, "proj-nothing", "br-main", "br-child")
    await new_timeline(driver, "proj-refuse")
    with pytest.raises(ComputeError, match="its own parent"):
        await branch(driver, "proj-refuse", "br-main", "br-main")
    with pytest.raises(ComputeError, match="invalid"):
        await branch(driver, "proj-refuse", "br-main", "../escape")
    other = 15 if newest(driver) != 15 else 16
    if other in driver.pg_versions():
        with pytest.raises(ComputeError, match="holds Postgres"):
            await driver.create_branch(
                project_id="proj-refuse",
                parent_branch_id="br-main",
                branch_id="br-child",
                pg_version=other,
            )
    assert not driver.pgdata("proj-refuse", "br-child").exists()


async def test_concurrent_branches_of_one_parent(
    driver: LocalComputeDriver, computes: Computes
) -> None:
    await new_timeline(driver, "proj-fanout")
    parent = await start(driver, computes, "proj-fanout", "br-main")
    await query(parent.port, "CREATE TABLE t AS SELECT 1 AS id")
    await asyncio.gather(*(branch(driver, "proj-fanout", "br-main", f"br-{i}") for i in range(3)))
    for i in range(3):
        child = await start(driver, computes, "proj-fanout", f"br-{i}")
        assert await ids(child.port) == [1]


async def test_delete_timeline_stops_and_removes_the_branch(
    driver: LocalComputeDriver, computes: Computes
) -> None:
    await new_timeline(driver, "proj-deltl")
    await branch(driver, "proj-deltl", "br-main", "br-gone")
    child = await start(driver, computes, "proj-deltl", "br-gone")
    pid_file = read_pid_file(driver.pgdata("proj-deltl", "br-gone"))
    assert pid_file is not None

    await driver.delete_timeline(project_id="proj-deltl", branch_id="br-gone")
    assert not is_postmaster_of(pid_file.pid, driver.pgdata("proj-deltl", "br-gone"))
    assert not driver.layout.branch_dir("proj-deltl", "br-gone").exists()
    assert not driver.socket_dir(child.endpoint_id).exists()
    assert (driver.pgdata("proj-deltl", "br-main") / "PG_VERSION").is_file()
    await driver.delete_timeline(project_id="proj-deltl", branch_id="br-gone")  # gone: no-op


async def test_offline_branch_of_a_parent_whose_postmaster_died(
    driver: LocalComputeDriver, computes: Computes
) -> None:
    await new_timeline(driver, "proj-died")
    parent = await start(driver, computes, "proj-died", "br-main")
    await query(parent.port, "CREATE TABLE t (id int PRIMARY KEY)")
    await admin_query(driver, parent, "CHECKPOINT")
    await query(parent.port, "INSERT INTO t SELECT generate_series(1, 500)")  # only in the WAL
    pgdata = driver.pgdata("proj-died", "br-main")
    pid_file = read_pid_file(pgdata)
    assert pid_file is not None
    os.killpg(pid_file.pid, signal.SIGKILL)  # the postmaster and its children, no checkpoint
    # Gone as the driver sees it: a dying process has left its directory (its cwd unreadable)
    # a moment before it stops running.
    while any(c.project_id == "proj-died" for c in await driver.running_computes()):
        await asyncio.sleep(0.01)

    # Not shut down cleanly: the copy takes the WAL from the last checkpoint on, and the
    # branch's first start replays it, as the parent's own next start would.
    await branch(driver, "proj-died", "br-main", "br-child")
    child = await start(driver, computes, "proj-died", "br-child")
    assert await ids(child.port) == list(range(1, 501))
    parent = await start(driver, computes, "proj-died", "br-main")
    assert await ids(parent.port) == list(range(1, 501))


async def test_a_cancelled_branch_leaves_nothing_behind(
    driver: LocalComputeDriver, computes: Computes
) -> None:
    await new_timeline(driver, "proj-cancel")
    parent = await start(driver, computes, "proj-cancel", "br-main")
    await query(parent.port, "CREATE TABLE t AS SELECT 3 AS id")
    pgdata = driver.pgdata("proj-cancel", "br-child")
    attempt = asyncio.create_task(branch(driver, "proj-cancel", "br-main", "br-child"))
    while not pgdata.with_name("pgdata.tmp").exists() and not attempt.done():
        await asyncio.sleep(0.001)
    attempt.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await attempt
    # Cancelled mid-copy (or done just before): never a partial directory either way.
    assert not pgdata.with_name("pgdata.tmp").exists()
    assert not pgdata.exists() or (pgdata / "pgplane.timeline-complete").is_file()
    # The copy's slot is temporary: it goes when its session's backend exits, which happens
    # just after the cancelled copy closed the connection, not before close() returns.
    slots = "SELECT count(*) FROM pg_replication_slots"
    for _ in range(1000):
        if await admin_query(driver, parent, slots) == [(0,)]:
            break
        await asyncio.sleep(0.01)
    assert await admin_query(driver, parent, slots) == [(0,)]
    await branch(driver, "proj-cancel", "br-main", "br-child")
    child = await start(driver, computes, "proj-cancel", "br-child")
    assert await ids(child.port) == [3]


@pytest.mark.parametrize("version", list(discover([])))
async def test_every_version_branches_online_and_offline(
    driver: LocalComputeDriver, computes: Computes, version: int
) -> None:
    project = f"proj-ver{version}"
    await driver.create_timeline(
        project_id=project,
        branch_id="br-main",
        pg_version=version,
        roles=[ROLE],
        databases=[DATABASE],
    )
    parent = ComputeSpec(
        project_id=project,
        branch_id="br-main",
        endpoint_id=f"ep-ver{version}",
        pg_version=version,
        port=free_port(),
    )
    await computes.start(parent)
    await query(parent.port, "CREATE TABLE t AS SELECT 5 AS id")
    for child, online in (("br-online", True), ("br-offline", False)):
        if not online:
            await stop(driver, parent)
        await driver.create_branch(
            project_id=project, parent_branch_id="br-main", branch_id=child, pg_version=version
        )
        spec = dataclasses.replace(parent, branch_id=child, endpoint_id=f"ep-ver{version}-{child}")
        spec = dataclasses.replace(spec, port=free_port())
        await computes.start(spec)
        assert await ids(spec.port) == [5]


async def test_branches_are_built_from_spares_made_ahead(
    driver: LocalComputeDriver, computes: Computes
) -> None:
    await new_timeline(driver, "proj-spares")
    parent = await start(driver, computes, "proj-spares", "br-main")
    await query(parent.port, "CREATE TABLE t (id int PRIMARY KEY)")
    await query(parent.port, "INSERT INTO t VALUES (1)")
    await branch(driver, "proj-spares", "br-main", "br-one")
    for _ in range(600):  # the refill runs in the background
        if not driver.spares.needs_filling():
            break
        await asyncio.sleep(0.05)
    files, dirs = driver.spares.counts()
    one = driver.pgdata("proj-spares", "br-one")
    assert files >= 2 * sum(1 for p in one.rglob("*") if p.is_file()) - 10
    assert dirs > 0
    spare_inodes = {p.stat().st_ino for p in driver.spares.directory.iterdir()}

    await query(parent.port, "INSERT INTO t VALUES (2)")
    await branch(driver, "proj-spares", "br-main", "br-two")
    two = driver.pgdata("proj-spares", "br-two")
    copied = list(two.rglob("*"))
    from_spares = [p for p in copied if p.stat().st_ino in spare_inodes]
    assert len(from_spares) > 0.9 * len(copied)
    # Each file and directory of the copy has its parent's mode and owner, as a create gives.
    parent_dir = driver.pgdata("proj-spares", "br-main")
    for path in two.rglob("*"):
        source = parent_dir / path.relative_to(two)
        if source.exists() and not path.is_symlink():
            got, want = path.stat(), source.stat()
            assert (got.st_mode, got.st_uid, got.st_gid) == (
                want.st_mode,
                want.st_uid,
                want.st_gid,
            ), path
    # Spares are root's until the copy is handed over whole: all the project user's now.
    user = await driver.project_user("proj-spares")
    assert {p.lstat().st_uid for p in [two, *copied]} == {user.uid}
    child = await start(driver, computes, "proj-spares", "br-two")
    assert await ids(child.port) == [1, 2]
    await query(child.port, "INSERT INTO t VALUES (3)")
    assert await ids(parent.port) == [1, 2]

"""Reads of a branch's schema: at its head through whatever serves the branch, or as it was at
a point of its history (an LSN or a time).

The point is rebuilt as a branch at a point is (``Histories.build_at``), but into a directory
of the platform's own inside the branch's directory, ``point-<hex>/``: on the project's
filesystem, so it counts against the project's disk share, and never where an endpoint, a
restore or a child branch looks. A temporary socket-only postmaster, sandboxed as the project's
user like every postmaster on tenant data, serves the read; then it is stopped and the directory
removed. The source branch's compute is asked to archive its latest WAL when it runs, and is
never started when it does not (the rebuild reads the archive and base states alone).

A crash can leave such a directory behind, a postmaster running on it too (postmasters outlive
the platform process). While a read uses its directory it holds an exclusive ``flock`` on a
file in it; the keeper's round (``sweep``) stops the postmasters of every directory whose lock
nobody holds, and removes it. Locks die with their process, so a crashed read's directory is
free at the next round, and another process's read in progress is never swept.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import secrets
import shutil
from collections import defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path

from pgplane import failpoints
from pgplane.compute.driver import Point
from pgplane.compute.local.copies.timeline import INIT_PORT, fresh_socket_dir, temporary_pgdata
from pgplane.compute.local.history.histories import Histories, InstallFor
from pgplane.compute.local.postgres.command import postmaster_argv
from pgplane.compute.local.postgres.computes import Computes
from pgplane.compute.local.postgres.postmaster import Postmasters
from pgplane.compute.local.postgres.schema_dump import SchemaDump
from pgplane.compute.local.tenants.cgroups import PLATFORM_WORK
from pgplane.compute.local.tenants.projects import ids
from pgplane.core.turns import Turns

log = logging.getLogger(__name__)

PREFIX = "point-"
AT_ONCE = 4  # point reads rebuilding at once, every project's together
_LOCK = "in-use"
Action = Callable[[Path, int], Awaitable[None]]


class PointReads:
    """Reads of a branch's schema, at its head or at a point of its history."""

    def __init__(
        self,
        histories: Histories,
        computes: Computes,
        postmasters: Postmasters,
        locks: defaultdict[tuple[object, ...], asyncio.Lock],
        install: InstallFor,
    ) -> None:
        self.layout = histories.layout
        self._histories = histories
        self._computes = computes
        self._postmasters = postmasters
        self._locks = locks
        self._install = install
        # Each a rebuild (a base copied, WAL replayed) outside the engine's slots, asked for by
        # an API request: at most one of a project's at once, and so many in all, the rest
        # waiting their turn, so that one account's reads never take the platform's threads.
        self._per_project = Turns(1)
        self._at_once = asyncio.Semaphore(AT_ONCE)

    async def dump_schema(
        self,
        project_id: str,
        branch_id: str,
        pg_version: int,
        db_name: str,
        *,
        max_bytes: int,
        point: Point | None,
    ) -> str:
        """The driver's ``dump_schema``: at the head through whatever serves the branch
        (``Computes.on_branch``, never waking a suspended compute), else at ``point``."""
        install, run_as = await self._install(project_id, pg_version)
        dump = SchemaDump(install, run_as, db_name, max_bytes, self._postmasters.walls)
        if point is None:
            await self._computes.on_branch(
                project_id, branch_id, pg_version, None, dump, start=False
            )
        else:
            await self.run(project_id, branch_id, pg_version, point, dump)
        return dump.sql

    async def run(
        self, project_id: str, branch_id: str, pg_version: int, point: Point, action: Action
    ) -> None:
        """Run ``action`` against a postmaster on the branch's data at ``point``."""
        async with self._per_project.turn(project_id), self._at_once:
            await self._run(project_id, branch_id, pg_version, point, action)

    async def _run(
        self, project_id: str, branch_id: str, pg_version: int, point: Point, action: Action
    ) -> None:
        install, run_as = await self._install(project_id, pg_version)
        branch_dir = self.layout.branch_dir(project_id, branch_id)
        work = branch_dir / f"{PREFIX}{secrets.token_hex(6)}"
        await asyncio.to_thread(work.mkdir, 0o711)
        lock = await asyncio.to_thread(_hold, work)
        pgdata = work / "pgdata"
        try:
            async with self._locks["timeline", pgdata]:
                await self._histories.build_at(
                    project_id=project_id,
                    source_id=branch_id,
                    pgdata=pgdata,
                    pg_version=pg_version,
                    point=point,
                    limits=PLATFORM_WORK,  # the tenant's WAL, replayed for its request
                )
            socket_dir = self.layout.init_socket_dir(project_id, work.name)
            await asyncio.to_thread(fresh_socket_dir, socket_dir, run_as)
            argv = postmaster_argv(
                install,
                pgdata,
                port=INIT_PORT,
                socket_dir=socket_dir,
                listen="",  # platform work: nobody but us reaches it
                # Thrown away afterwards: nothing it writes is history, nor needs to be durable.
                settings={"archive_mode": "off", "fsync": "off"},
                hba_file=self.layout.hba_file,
            )
            try:
                await self._postmasters.start(
                    argv,
                    pgdata=pgdata,
                    port=INIT_PORT,
                    socket_dir=socket_dir,
                    run_as=run_as,
                    log_path=work / "read.log",
                    limits=PLATFORM_WORK,
                )
                await failpoints.reached("point_read:serving")
                await action(socket_dir, INIT_PORT)
            finally:
                await asyncio.shield(self._postmasters.stop(pgdata))
                await asyncio.to_thread(shutil.rmtree, socket_dir, True)
        finally:
            await asyncio.shield(self._remove(work))
            os.close(lock)

    async def _remove(self, work: Path) -> None:
        for data_dir in (work / "pgdata", temporary_pgdata(work / "pgdata")):
            await self._postmasters.stop(data_dir)
        await asyncio.to_thread(shutil.rmtree, work, True)

    async def sweep(self) -> None:
        """Remove what crashed reads left (see the module docstring)."""
        for project_id in ids(self.layout.projects):
            if self._locks["tenant", project_id].locked():
                continue  # being detached or reattached: its tree is moving
            for branch_id in ids(self.layout.project_dir(project_id) / "branches"):
                branch_dir = self.layout.branch_dir(project_id, branch_id)
                for work, lock in await asyncio.to_thread(_leftovers, branch_dir):
                    try:
                        await self._remove(work)
                    finally:
                        os.close(lock)
                    log.info("removed %s, left by an interrupted read at a point", work)


def _hold(work: Path) -> int:
    """An exclusive lock on the read's directory, held until closed (or its process dies)."""
    # root's: the directory is root's, the tenant's data is below it
    fd = os.open(work / _LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise
    return fd


def _leftovers(branch_dir: Path) -> list[tuple[Path, int]]:
    """The branch's read directories nobody uses, each with the lock we now hold on it."""
    found: list[tuple[Path, int]] = []
    with contextlib.suppress(FileNotFoundError):
        for entry in branch_dir.iterdir():
            if not entry.name.startswith(PREFIX) or entry.is_symlink() or not entry.is_dir():
                continue
            try:
                found.append((entry, _hold(entry)))
            except BlockingIOError:
                continue  # a read in progress (this process's or another's)
            except OSError:
                continue  # removed meanwhile
    return found

"""Copies of a branch's data: a new branch's (from its parent's head, or a point of its
history), and a restore's, built beside the branch's data and then swapped in.

The caller holds the timeline lock of the data directory being built. A head copy holds the
source's postmaster lock for its whole length (a stopped source cannot start under it, nor a
running one stop: its session holds the backup); a point is rebuilt from the source's history
alone (:mod:`..history.histories`), never touching the source's data.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path

from pgplane import failpoints
from pgplane.compute.driver import ComputeError, Point
from pgplane.compute.local.copies.branch import build_branch
from pgplane.compute.local.copies.spares import SparePool
from pgplane.compute.local.copies.timeline import check_data_version, completed
from pgplane.compute.local.history.histories import Histories
from pgplane.compute.local.layout import TIMELINE_MARKER, Layout, ensure_dir
from pgplane.compute.local.postgres.binaries import PgInstall
from pgplane.compute.local.postgres.postmaster import Postmasters
from pgplane.compute.local.tenants.cgroups import REPLAY_WORK
from pgplane.compute.local.tenants.projects import Tenants
from pgplane.compute.local.tenants.user import RunAs

InstallFor = Callable[..., Awaitable[tuple[PgInstall, RunAs]]]


class Copies:
    def __init__(
        self,
        *,
        layout: Layout,
        postmasters: Postmasters,
        locks: defaultdict[tuple[object, ...], asyncio.Lock],
        tenants: Tenants,
        histories: Histories,
        spares: SparePool,
        install: InstallFor,
        disk_reserve_bytes: int | None,
    ) -> None:
        self.layout = layout
        self._postmasters = postmasters
        self._locks = locks
        self._tenants = tenants
        self._histories = histories
        self._spares = spares
        self._install = install
        self._reserve = disk_reserve_bytes
        self._refilling: asyncio.Task[None] | None = None

    async def build(
        self,
        project_id: str,
        source_id: str,
        pgdata: Path,
        pg_version: int,
        point: Point | None,
    ) -> int | None:
        """Build ``pgdata`` as the source's data at its head or ``point``; the LSN it starts
        from, when known."""
        parent = self.layout.pgdata(project_id, source_id)
        if not (parent / TIMELINE_MARKER).is_file():
            raise ComputeError(f"branch {source_id} of project {project_id} has no data")
        check_data_version(parent, pg_version)
        install, run_as = await self._install(project_id, pg_version, make_dir=True)
        await asyncio.to_thread(ensure_dir, pgdata.parent)
        if point is not None:
            lsn = await self._histories.build_at(
                project_id=project_id,
                source_id=source_id,
                pgdata=pgdata,
                pg_version=pg_version,
                point=point,
                limits=REPLAY_WORK,  # the tenant's WAL, replayed at its request
            )
            self.refill_spares()
            return lsn
        async with self._locks["postmaster", parent]:
            if self._postmasters.running(parent) is None:
                await self._tenants.claim(parent, run_as)  # pg_controldata reads it as run_as
            stats = await build_branch(
                install=install,
                run_as=run_as,
                postmasters=self._postmasters,
                parent=parent,
                pgdata=pgdata,
                label=f"pgplane branch {project_id}/{pgdata.parent.name}",
                spares=self._spares,
                disk_reserve_bytes=self._reserve,
            )
        # Spares for the next two branches of this parent (branches often come in a burst: a
        # preview per pull request), made while nobody waits for them.
        self._spares.want(2 * stats.files, 2 * stats.dirs)
        self.refill_spares()
        return stats.end_lsn or None

    async def restore(
        self,
        *,
        project_id: str,
        branch_id: str,
        source_branch_id: str,
        pg_version: int,
        point: Point | None,
        preserve_branch_id: str | None,
        restore_id: str,
    ) -> int | None:
        pgdata = self.layout.pgdata(project_id, branch_id)
        staged = pgdata.with_name("pgdata.restored")
        async with self._locks["timeline", pgdata]:
            done, lsn = self._histories.restored(project_id, branch_id, restore_id)
            if done:  # swapped, maybe but for the last rename
                dirs = self._histories.dirs(project_id, branch_id)
                await asyncio.to_thread(self._histories.finish_swap, dirs, staged)
                return lsn
            if not completed(staged, pg_version):
                # Built beside the branch's data, which serves on until the swap.
                lsn = await self.build(project_id, source_branch_id, staged, pg_version, point)
            await failpoints.reached("restore_branch:built")
            await self._histories.swap_in(
                project_id=project_id,
                branch_id=branch_id,
                staged=staged,
                preserve_branch_id=preserve_branch_id,
                restore_id=restore_id,
                lsn=lsn,
            )
        self._histories.soon(project_id, branch_id)
        return lsn

    def refill_spares(self) -> None:
        """Refill the spare pool in the background, unless a fill runs."""
        if self._refilling is not None and not self._refilling.done():
            return  # the running fill keeps going while the pool is short
        if self._spares.needs_filling():
            self._refilling = asyncio.create_task(self._spares.fill_logged())

    async def close(self) -> None:
        if self._refilling is not None:
            await self._refilling

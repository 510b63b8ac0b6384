"""The history half of the local driver: branches at a point, restores, bounds, and the keeper.

Locks (the driver's, by key), taken in this order: ``("tenant", project_id)`` while the keeper
works on a project (a detach or reattach, which holds it, moves the whole tree);
``("timeline", pgdata)`` while a branch's data is built or replaced; ``("base", branch_dir)``
while a base state of the branch is copied (the keeper) or its history moved (a restore);
``("history", branch_dir)`` while a branch's base states or archive are read or changed (a
rebuild from them, the keeper's choices and pruning, a restore moving them), never for the
length of a base state's copy; ``("postmaster", pgdata)`` while a postmaster is started or
stopped on it, or an online backup runs on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from functools import partial
from pathlib import Path

import psycopg

from pgplane import failpoints
from pgplane.compute.driver import ComputeError, HistoryBounds, Point, PointNotInHistory
from pgplane.compute.local.copies.branch import check_space, copy_online
from pgplane.compute.local.copies.spares import SparePool
from pgplane.compute.local.copies.timeline import temporary_pgdata
from pgplane.compute.local.files import fsync_dir, to_trash, write_atomic
from pgplane.compute.local.history.archiving import (
    Base,
    HistoryDirs,
    archived_bytes_since,
    catalog_wal,
    list_bases,
    prepare_archive,
    prune,
    read_retention,
)
from pgplane.compute.local.history.bases import (
    copy_unarchived,
    new_base_dir,
    publish_base,
    shut_down_at,
    sweep_unfinished_bases,
    take_offline_base,
)
from pgplane.compute.local.history.first_bases import TemplateSums, staged_first_base
from pgplane.compute.local.history.pitr import choose_base, describe, flush_archive, rebuild
from pgplane.compute.local.history.wal import parse_lsn, read_control_data
from pgplane.compute.local.layout import TIMELINE_MARKER, Layout
from pgplane.compute.local.postgres.binaries import PgInstall
from pgplane.compute.local.postgres.computes import Computes
from pgplane.compute.local.postgres.postmaster import Postmasters
from pgplane.compute.local.postgres.sessions import MONITOR_USER, connect, conninfo
from pgplane.compute.local.tenants import untrusted
from pgplane.compute.local.tenants.cgroups import Limits
from pgplane.compute.local.tenants.projects import ids
from pgplane.compute.local.tenants.user import RunAs
from pgplane.core import clock

log = logging.getLogger(__name__)

# Base states are taken often, for a short replay to the end, and kept four times as sparsely
# (the old spacing of 1 GiB by default), for what they cost on disk and in the object store.
_KEEP_SPACING = 4

InstallFor = Callable[..., Awaitable[tuple[PgInstall, RunAs]]]
RESTORED_MARKER = "restored"
_BOUNDS_TIMEOUT = 10.0


class Histories:
    def __init__(
        self,
        *,
        layout: Layout,
        postmasters: Postmasters,
        locks: defaultdict[tuple[object, ...], asyncio.Lock],
        computes: Computes,
        install: InstallFor,
        spares: SparePool,
        base_bytes: int,
        disk_reserve_bytes: int | None,
    ) -> None:
        self.layout = layout
        self._postmasters = postmasters
        self._locks = locks
        self._computes = computes
        self._install = install
        self._spares = spares
        self._base_bytes = base_bytes
        self._reserve = disk_reserve_bytes
        self._soon: set[asyncio.Task[object]] = set()
        self._swept: set[Path] = set()  # branches whose unfinished base states were removed
        self._template_sums = TemplateSums()

    def dirs(self, project_id: str, branch_id: str) -> HistoryDirs:
        return HistoryDirs(self.layout.branch_dir(project_id, branch_id))

    async def build_at(
        self,
        *,
        project_id: str,
        source_id: str,
        pgdata: Path,
        pg_version: int,
        point: Point,
        limits: Limits | None = None,
    ) -> int:
        """Build ``pgdata`` (published complete) as the source's data at ``point``; the caller
        holds its timeline lock. The LSN its new timeline starts at. ``limits``: the replay's
        cgroup (see ``rebuild``)."""
        install, run_as = await self._install(project_id, pg_version, make_dir=True)
        source = self.dirs(project_id, source_id)
        tmp = temporary_pgdata(pgdata)
        await self._postmasters.stop(tmp)
        await asyncio.to_thread(shutil.rmtree, tmp, True)
        tail = pgdata.with_name(f"{pgdata.name}.tail")
        await asyncio.to_thread(shutil.rmtree, tail, True)
        async with self._locks["history", source.branch_dir]:
            stopped_at = await self._flush(source, tail)
            # A time after a stopped source shut down holds all of its history: replayed to its
            # end (a target time after the last commit is never "reached", costing a replay).
            after_all = (
                stopped_at is not None and point.time_us is not None and point.time_us >= stopped_at
            )
            base = choose_base(await asyncio.to_thread(list_bases, source), point)
            if base is None:
                raise PointNotInHistory(
                    f"branch {source_id} has no history at {describe(point)}: its history starts"
                    " later, or was freed"
                )
            if self._reserve is None or self._reserve >= 0:
                await asyncio.to_thread(check_space, base.pgdata, pgdata.parent, self._reserve)
            socket_dir = self.layout.init_socket_dir(project_id, pgdata.parent.name)
            try:
                lsn = await rebuild(
                    install=install,
                    run_as=run_as,
                    postmasters=self._postmasters,
                    source=source,
                    base=base,
                    tmp=tmp,
                    socket_dir=socket_dir,
                    hba_file=self.layout.hba_file,
                    point=None if after_all else point,
                    tail=tail,
                    spares=self._spares,
                    limits=limits,
                )
            except BaseException:
                await asyncio.shield(self._discard(tmp))
                raise
            finally:
                await asyncio.to_thread(shutil.rmtree, tail, True)
        marker = tmp / TIMELINE_MARKER
        await asyncio.to_thread(write_atomic, marker, b"")
        run_as.chown(marker)
        os.replace(tmp, pgdata)
        await asyncio.to_thread(fsync_dir, pgdata.parent)
        return lsn

    async def _discard(self, tmp: Path) -> None:
        await self._postmasters.stop(tmp)
        await asyncio.to_thread(shutil.rmtree, tmp, True)

    async def _flush(self, dirs: HistoryDirs, tail: Path) -> int | None:
        """Everything the branch wrote up to now where a replay finds it: in its archive (a
        running compute is asked to complete its segment), or, for what a stopped one left
        unarchived (its last segment, or more if stopped by an earlier version or killed),
        copied into ``tail`` under its postmaster lock, so that it cannot change while copied.
        When it was shut down cleanly (epoch us), for a stopped one."""
        running = self._postmasters.running(dirs.pgdata)
        if running is None:
            async with self._locks["postmaster", dirs.pgdata]:
                running = self._postmasters.running(dirs.pgdata)
                if running is None:
                    await asyncio.to_thread(copy_unarchived, dirs, tail)
                    return await asyncio.to_thread(shut_down_at, dirs.pgdata)
        await flush_archive(running, dirs)
        return None

    async def swap_in(
        self,
        *,
        project_id: str,
        branch_id: str,
        staged: Path,
        preserve_branch_id: str | None,
        restore_id: str,
        lsn: int | None,
    ) -> None:
        """Put the complete ``staged`` data in the branch's place; the old data, archive and base
        states become the preserved branch's, or are removed. Each step is a rename done only
        when its source is still there, and the swap is recorded before its last rename, so a
        retry after a crash finishes it (see ``restored``)."""
        dirs = self.dirs(project_id, branch_id)
        async with self._locks["base", dirs.branch_dir], self._locks["history", dirs.branch_dir]:
            for data_dir in (dirs.pgdata, temporary_pgdata(dirs.pgdata)):
                async with self._locks["postmaster", data_dir]:
                    await self._computes.stop_archived(data_dir)
            old = (dirs.pgdata, dirs.wal, dirs.bases)
            if preserve_branch_id is not None:
                keep = self.dirs(project_id, preserve_branch_id)
                await asyncio.to_thread(keep.branch_dir.mkdir, mode=0o711, exist_ok=True)
                for src, dst in zip(old, (keep.pgdata, keep.wal, keep.bases), strict=True):
                    if src.exists() and not dst.exists():
                        os.replace(src, dst)
                await asyncio.to_thread(fsync_dir, keep.branch_dir)
            else:
                # Out of the way at once, removed once the branch serves again: a reset's
                # duration is not that of deleting the old data (gigabytes, with its history).
                for src in old:
                    if (trash := await asyncio.to_thread(to_trash, src)) is not None:
                        self._in_background(asyncio.to_thread(shutil.rmtree, trash, True))
            await failpoints.reached("restore_branch:moved")
            # Recorded before the last rename: a retry that finds the record only finishes it.
            record = f"{restore_id} {'' if lsn is None else lsn}".encode()
            await asyncio.to_thread(write_atomic, dirs.branch_dir / RESTORED_MARKER, record)
            await asyncio.to_thread(self.finish_swap, dirs, staged)

    @staticmethod
    def finish_swap(dirs: HistoryDirs, staged: Path) -> None:
        if staged.exists():
            os.replace(staged, dirs.pgdata)
            fsync_dir(dirs.branch_dir)

    def restored(self, project_id: str, branch_id: str, restore_id: str) -> tuple[bool, int | None]:
        """Whether restore ``restore_id`` swapped its data in already, and its LSN."""
        path = self.layout.branch_dir(project_id, branch_id) / RESTORED_MARKER
        try:
            done_id, _, lsn = path.read_text().partition(" ")  # root's: branch dir
        except FileNotFoundError:
            return False, None
        if done_id != restore_id:
            return False, None
        return True, int(lsn) if lsn.strip() else None

    async def bounds(self, project_id: str, branch_id: str, pg_version: int) -> HistoryBounds:
        dirs = self.dirs(project_id, branch_id)
        if not (dirs.pgdata / TIMELINE_MARKER).is_file():
            return HistoryBounds()  # detached, or not built yet: nothing known
        bases = await asyncio.to_thread(list_bases, dirs)
        first = bases[0] if bases else None
        return HistoryBounds(
            start_lsn=first.end_lsn if first else None,
            start_time_us=first.end_time if first else None,
            head_lsn=await self._head(project_id, dirs, pg_version),
        )

    async def _head(self, project_id: str, dirs: HistoryDirs, pg_version: int) -> int | None:
        running = self._postmasters.running(dirs.pgdata)
        if running is not None:
            info = conninfo(running.socket_dir, running.port, user=MONITOR_USER)
            try:
                async with asyncio.timeout(_BOUNDS_TIMEOUT):
                    conn = await connect(info)
                    async with conn:
                        cur = await conn.execute("SELECT pg_catalog.pg_current_wal_insert_lsn()")
                        row = await cur.fetchone()
            except (psycopg.Error, TimeoutError, OSError):
                return None
            return parse_lsn(str(row[0])) if row else None
        if (dirs.pgdata / "backup_label").is_file():
            return None  # a copy never started: its end is only known once replayed
        install, run_as = await self._install(project_id, pg_version)
        try:
            control = await read_control_data(install, run_as, dirs.pgdata)
        except ComputeError:
            return None
        return control.checkpoint

    def soon(self, project_id: str, branch_id: str) -> None:
        """Take the branch's first base state now, in the background (a new or restored branch
        has none, and its history starts with it)."""
        self._in_background(self._keep_logged(project_id, branch_id))

    def _in_background(self, work: Coroutine[object, object, object]) -> None:
        task = asyncio.create_task(work)
        self._soon.add(task)
        task.add_done_callback(self._soon.discard)

    async def close(self) -> None:
        for task in list(self._soon):
            task.cancel()
        for task in list(self._soon):
            with contextlib.suppress(BaseException):
                await task

    async def keep(self) -> None:
        for project_id in ids(self.layout.projects):
            if self._locks["tenant", project_id].locked():
                continue  # being detached or reattached: its tree is moving
            for branch_id in ids(self.layout.project_dir(project_id) / "branches"):
                await self._keep_logged(project_id, branch_id)

    async def _keep_logged(self, project_id: str, branch_id: str) -> None:
        try:
            # Under the project's tenant lock: a detach must not pack what is being written.
            async with self._locks["tenant", project_id]:
                await self._keep(project_id, branch_id)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # one branch's trouble must not stop the others'
            log.warning("history of %s/%s: %s", project_id, branch_id, exc)

    async def _keep(self, project_id: str, branch_id: str) -> None:
        dirs = self.dirs(project_id, branch_id)
        if not (dirs.pgdata / TIMELINE_MARKER).is_file():
            return
        retention = await asyncio.to_thread(read_retention, self.layout.storage_config(project_id))
        # A base state is copied under the branch's base lock only (one at a time; a restore's
        # swap waits for it), not its history lock: a rebuild from the history, which holds
        # that, never waits for a copy of the whole branch.
        async with self._locks["base", dirs.branch_dir]:
            if dirs.branch_dir not in self._swept:  # base states a crash left half copied
                await asyncio.to_thread(sweep_unfinished_bases, dirs)
                self._swept.add(dirs.branch_dir)
            async with self._locks["history", dirs.branch_dir]:
                if not (dirs.pgdata / TIMELINE_MARKER).is_file():
                    return  # removed or swapped while we waited
                due = None
                if retention > 0:
                    major = await _data_major(dirs)
                    if major is None:
                        return
                    install, run_as = await self._install(project_id, major)
                    await asyncio.to_thread(prepare_archive, dirs, run_as)
                    await asyncio.to_thread(catalog_wal, dirs)
                    bases = await asyncio.to_thread(list_bases, dirs)
                    if not bases or await asyncio.to_thread(
                        archived_bytes_since, dirs, bases[-1]
                    ) >= self._due_after(bases[-1]):
                        due = install, run_as
            if due is not None:
                await self._take_base(*due, dirs)
        await self.prune(dirs, retention)

    @contextlib.asynccontextmanager
    async def first_base(
        self,
        project_id: str,
        branch_id: str,
        install: PgInstall,
        template: Path,
        template_owner: RunAs,
        *,
        archiving: bool,
    ) -> AsyncIterator[Path | None]:
        """A new cluster's first base state, the template it is built from (first_bases.py):
        yields the directory to copy the cluster from; published when the body returns. A
        cluster built without archiving keeps no history: None, the template copied as it is."""
        if not archiving:
            yield None
            return
        dirs = self.dirs(project_id, branch_id)
        async with (
            self._locks["base", dirs.branch_dir],
            staged_first_base(
                dirs, install, template, template_owner, self._template_sums
            ) as source,
        ):
            yield source

    def _due_after(self, base: Base) -> int:
        """The WAL after ``base`` at which the next base state is taken: a rebuild to the end
        of the history (a recovery, a branch at its head) replays at most about this much, so
        a quarter of the data's size: fetching and replaying a byte of WAL took twice what
        fetching and unpacking a byte of base state did (``bench.object_store``), so the
        replay takes at most about half as long as the base state."""
        return max(self._base_bytes, base.bytes // 4)

    def _kept_apart(self, base: Base) -> int:
        """The WAL after a kept base state before the next one kept: those taken closer are
        freed once a newer one is taken. The window then holds as many base states as if one
        were taken only every ``_KEEP_SPACING`` times as much WAL (or the data's size), and
        the newest: a rebuild at a past point replays up to that much."""
        return max(_KEEP_SPACING * self._base_bytes, base.bytes)

    async def prune(self, dirs: HistoryDirs, retention: int) -> None:
        """Free what the window of ``retention`` seconds no longer needs."""
        async with self._locks["history", dirs.branch_dir]:
            freed = await asyncio.to_thread(
                prune, dirs, retention, clock.now_us(), self._kept_apart
            )
        if freed:
            log.info("history of %s: %d bytes freed", dirs.branch_dir.name, freed)

    async def _take_base(self, install: PgInstall, run_as: RunAs, dirs: HistoryDirs) -> None:
        # Never at the cost of the branch's own computes: a base state that would leave less
        # than the reserve free is not taken (the keeper says so, and tries again next round).
        if self._reserve is None or self._reserve >= 0:
            await asyncio.to_thread(
                partial(check_space, purpose="take a base state"),
                dirs.pgdata,
                dirs.branch_dir,
                self._reserve,
            )
        if self._postmasters.running(dirs.pgdata) is None:
            await take_offline_base(install, run_as, dirs)
            return
        # Online, under the postmaster lock: the compute must not stop during its backup.
        async with self._locks["postmaster", dirs.pgdata]:
            running = self._postmasters.running(dirs.pgdata)
            if running is None:
                return  # stopped meanwhile: the next round copies it as files
            tmp = await asyncio.to_thread(new_base_dir, dirs)
            try:
                label = f"pgplane base {dirs.branch_dir.parent.parent.name}/{dirs.branch_dir.name}"
                stats = await copy_online(running, dirs.pgdata, tmp / "pgdata", label, None)
                await asyncio.to_thread(
                    publish_base,
                    dirs,
                    tmp,
                    start_lsn=stats.start_lsn,
                    end_lsn=stats.end_lsn,
                    end_time=clock.now_us(),
                    segment_size=stats.segment_size,
                )
            except BaseException:
                await asyncio.shield(asyncio.to_thread(shutil.rmtree, tmp, True))
                raise


async def _data_major(dirs: HistoryDirs) -> int | None:
    """The major version the branch's data says it is (the tenant's file: read safely)."""
    try:
        text = await untrusted.aread_text(untrusted.under(dirs.pgdata, "PG_VERSION"), 16)
        return int(text.strip())
    except (OSError, ValueError) as exc:
        log.warning("history of %s: no readable PG_VERSION (%s)", dirs.branch_dir, exc)
        return None

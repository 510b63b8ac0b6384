"""Snapshots on this machine: a branch's data at a point, kept as a copy of its own.

::

    projects/<project_id>/snapshots/                 root's, 0711
    projects/<project_id>/snapshots/<snapshot_id>/   root's: 0711 while it is built, then 0700
        pgdata/                                      the data, built as a new branch's is
        sealed                                       root's record of its LSN, once built

Why a copy rather than pinning the base states and WAL the point needs: a snapshot must outlive
the history window it was taken in, and also the branch's restores (which move its history to
another branch or drop it) and its deletion. A copy of its own owes nothing to any branch's
history; restoring it is a file copy of stopped data, with no replay (a point was replayed once,
when the snapshot was taken). Its cost is its data's size on disk, which it is charged for.

The data is built exactly as a branch's (:class:`..copies.copies.Copies`: an online or offline
copy of the head, or a point rebuilt from the history by a postmaster of the project's user), so
its files are the tenant's. Once built, its directory is closed to everyone but root (0700,
root's): from then on the tenant cannot reach it, so no compute, even one run by a tenant that
took its OS user, can change a snapshot. Root still never trusts what it holds: it reads it only
through the copier that opens every entry without following a link or waiting
(:mod:`..copies.datacopy`), counts it with the walker that does the same (:mod:`..storage`), and
removes it by renaming it to trash first (:func:`..files.remove_tree`). What the snapshot is (its
LSN, its point, its roles) is the store's, never read from these files.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shutil
import stat
import threading
from collections import defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path

from pgplane import failpoints
from pgplane.compute.driver import ComputeError, Point
from pgplane.compute.local.cold.manifest import MANIFEST_NAME
from pgplane.compute.local.copies.copies import Copies
from pgplane.compute.local.copies.datacopy import CopyStats, copy_data_dir, copy_files, open_dir
from pgplane.compute.local.copies.timeline import completed, temporary_pgdata
from pgplane.compute.local.files import fsync_dir, remove_tree, sync_tree, write_atomic
from pgplane.compute.local.history.histories import Histories
from pgplane.compute.local.layout import TIMELINE_MARKER, Layout, check_id, ensure_dir
from pgplane.compute.local.postgres.binaries import PgInstall
from pgplane.compute.local.postgres.postmaster import Postmasters
from pgplane.compute.local.shared.objects import ObjectStore, off_loop
from pgplane.compute.local.snapshots import offsite
from pgplane.compute.local.storage import allocated_bytes
from pgplane.compute.local.tenants.ownership import hand_over
from pgplane.compute.local.tenants.user import RunAs

log = logging.getLogger(__name__)

InstallFor = Callable[..., Awaitable[tuple[PgInstall, RunAs]]]
SEALED = "sealed"
_SEALED_MODE = 0o700
_BUILDING_MODE = 0o711
_MAX_RECORD = 64
_WAL_FILE = re.compile(r"[0-9A-F]{24}|[0-9A-F]{8}\.history")  # segments, timeline histories


def snapshots_dir(layout: Layout, project_id: str) -> Path:
    return layout.project_dir(project_id) / "snapshots"


def snapshot_dir(layout: Layout, project_id: str, snapshot_id: str) -> Path:
    return snapshots_dir(layout, project_id) / check_id("snapshot id", snapshot_id)


class Snapshots:
    def __init__(
        self,
        *,
        layout: Layout,
        postmasters: Postmasters,
        locks: defaultdict[tuple[object, ...], asyncio.Lock],
        copies: Copies,
        histories: Histories,
        install: InstallFor,
        shared: ObjectStore | None = None,
    ) -> None:
        self.layout = layout
        # Shared or object storage: each snapshot kept there too, once sealed (offsite.py).
        self._shared = shared
        self._staging = layout.data_dir / "shipping"
        self._postmasters = postmasters
        self._locks = locks
        self._copies = copies
        self._histories = histories
        self._install = install

    async def create(
        self,
        *,
        project_id: str,
        branch_id: str,
        snapshot_id: str,
        pg_version: int,
        point: Point | None,
    ) -> tuple[int | None, int | None]:
        """Build the snapshot (the branch's data at its head or ``point``) and seal it; its LSN
        (when known) and the bytes it takes. Done once: a retry after the seal only reads."""
        top = snapshot_dir(self.layout, project_id, snapshot_id)
        pgdata = top / "pgdata"
        async with self._locks["timeline", pgdata]:
            record = await asyncio.to_thread(_record, top)
            if record is None or not await asyncio.to_thread(_is_sealed, top):
                await self._install(project_id, pg_version, make_dir=True)
                await asyncio.to_thread(_open_for_build, top)
                if record is None or not completed(pgdata, pg_version):
                    lsn = await self._copies.build(project_id, branch_id, pgdata, pg_version, point)
                    record = (lsn,)
                    await asyncio.to_thread(_write_record, top, lsn)
                await failpoints.reached("create_snapshot:built")
                await asyncio.to_thread(_seal, top)
            if self._shared is not None:
                prefix = offsite.prefix_of(project_id, snapshot_id)
                await off_loop(offsite.ship, self._shared, top, prefix, self._staging)
        size = await asyncio.to_thread(allocated_bytes, top)
        return record[0], size

    async def fetch(self, *, project_id: str, snapshot_id: str) -> bool:
        """The snapshot brought back from shared or object storage into a project rebuilt
        here; False when it is not there. Converges: one here already is kept."""
        top = snapshot_dir(self.layout, project_id, snapshot_id)
        async with self._locks["timeline", top / "pgdata"]:
            if await asyncio.to_thread(_record, top) is not None:
                return True
            prefix = offsite.prefix_of(project_id, snapshot_id)
            if self._shared is None or not await off_loop(
                self._shared.exists, f"{prefix}/{MANIFEST_NAME}"
            ):
                return False
            await remove_tree(top)  # what a fetch stopped by a crash left
            await asyncio.to_thread(ensure_dir, top.parent, _BUILDING_MODE)
            await off_loop(offsite.fetch, self._shared, prefix, top, self._staging)
            await asyncio.to_thread(_seal, top)
        return True

    async def remove(self, *, project_id: str, snapshot_id: str) -> None:
        """The snapshot's files gone (whatever a crash left of them); no-op when gone."""
        top = snapshot_dir(self.layout, project_id, snapshot_id)
        pgdata = top / "pgdata"
        async with self._locks["timeline", pgdata]:
            for data_dir in (pgdata, temporary_pgdata(pgdata)):
                async with self._locks["postmaster", data_dir]:
                    await self._postmasters.stop(data_dir)  # a rebuild a crash left running
            await remove_tree(top)
            if self._shared is not None:
                prefix = offsite.prefix_of(project_id, snapshot_id)
                await off_loop(self._shared.delete, prefix)

    async def to_branch(
        self, *, project_id: str, snapshot_id: str, branch_id: str, pg_version: int
    ) -> None:
        """A new branch's data: a copy of the sealed snapshot."""
        pgdata = self.layout.pgdata(project_id, branch_id)
        async with self._locks["timeline", pgdata]:
            if completed(pgdata, pg_version):
                return
            await self.copy_into(project_id, snapshot_id, pgdata, pg_version)
        self._histories.soon(project_id, branch_id)

    async def onto_branch(
        self,
        *,
        project_id: str,
        snapshot_id: str,
        branch_id: str,
        pg_version: int,
        restore_id: str,
        preserve_branch_id: str | None,
    ) -> None:
        """The branch's data replaced by the snapshot's (as a restore: built beside it, then
        swapped in; the old data becomes ``preserve_branch_id``'s, or is dropped)."""
        pgdata = self.layout.pgdata(project_id, branch_id)
        staged = pgdata.with_name("pgdata.restored")
        async with self._locks["timeline", pgdata]:
            done, _ = self._histories.restored(project_id, branch_id, restore_id)
            if done:
                dirs = self._histories.dirs(project_id, branch_id)
                await asyncio.to_thread(self._histories.finish_swap, dirs, staged)
                return
            if not completed(staged, pg_version):
                await self.copy_into(project_id, snapshot_id, staged, pg_version)
            await failpoints.reached("restore_snapshot:built")
            await self._histories.swap_in(
                project_id=project_id,
                branch_id=branch_id,
                staged=staged,
                preserve_branch_id=preserve_branch_id,
                restore_id=restore_id,
                lsn=None,
            )
        self._histories.soon(project_id, branch_id)

    async def copy_into(
        self, project_id: str, snapshot_id: str, pgdata: Path, pg_version: int
    ) -> None:
        """Build ``pgdata`` (published complete, the project user's) from the snapshot; the
        caller holds its timeline lock."""
        top = snapshot_dir(self.layout, project_id, snapshot_id)
        if await asyncio.to_thread(_record, top) is None:
            raise ComputeError(f"snapshot {snapshot_id} of project {project_id} has no data")
        _, run_as = await self._install(project_id, pg_version, make_dir=True)
        await asyncio.to_thread(ensure_dir, pgdata.parent)
        tmp = temporary_pgdata(pgdata)
        await self._postmasters.stop(tmp)
        await asyncio.to_thread(shutil.rmtree, tmp, True)
        try:
            try:
                stats = await _in_thread(top / "pgdata", tmp)
                await asyncio.to_thread(write_atomic, tmp / TIMELINE_MARKER, b"")
                await asyncio.to_thread(hand_over, tmp, {os.geteuid()}, run_as)
                await asyncio.to_thread(sync_tree, tmp)
            except OSError as exc:
                raise ComputeError(f"copying snapshot {snapshot_id}: {exc}") from exc
        except BaseException:
            await asyncio.shield(asyncio.to_thread(shutil.rmtree, tmp, True))
            raise
        await failpoints.reached("restore_snapshot:copied")
        os.replace(tmp, pgdata)
        await asyncio.to_thread(fsync_dir, pgdata.parent)
        log.info("restored snapshot %s to %s: %d files", snapshot_id, pgdata, stats.files)


def _open_for_build(top: Path) -> None:
    """``snapshots/<id>/`` root's, passable while the data is built (a rebuild's postmaster
    runs as the project's user inside it)."""
    ensure_dir(top.parent, _BUILDING_MODE)
    ensure_dir(top, _BUILDING_MODE)


def _write_record(top: Path, lsn: int | None) -> None:
    """The snapshot's LSN, root's, beside its data: written once its data is complete."""
    write_atomic(top / SEALED, b"" if lsn is None else str(lsn).encode())


def _seal(top: Path) -> None:
    """Closed to all but root: no compute of the project can reach the data any more."""
    top.chmod(_SEALED_MODE)
    fsync_dir(top)


def _is_sealed(top: Path) -> bool:
    return stat.S_IMODE(os.lstat(top).st_mode) == _SEALED_MODE


def _record(top: Path) -> tuple[int | None] | None:
    """(its LSN,) once its data is complete; None before. ``top`` and the record are root's
    alone, checked so (never through a link), before the record is believed."""
    try:
        st = os.lstat(top)
    except FileNotFoundError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise ComputeError(f"{top} is not the platform's")
    try:
        fd = os.open(top / SEALED, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)  # root's dir
    except FileNotFoundError:
        return None
    try:
        text = os.read(fd, _MAX_RECORD).decode().strip()
    finally:
        os.close(fd)
    return (int(text) if text else None,)


async def _in_thread(src: Path, dst: Path) -> CopyStats:
    """Copy the snapshot's data in a thread; cancelled, the copy stops before its next file."""
    cancel = threading.Event()
    running = asyncio.ensure_future(asyncio.to_thread(_copy, src, dst, cancel))
    try:
        return await asyncio.shield(running)
    except asyncio.CancelledError:
        cancel.set()
        with contextlib.suppress(Exception):
            await running
        raise


def _copy(src: Path, dst: Path, cancel: threading.Event) -> CopyStats:
    """All of the stopped data, with its WAL: a copy never started keeps its backup label."""
    stats = copy_data_dir(src, dst, online=False, keep_backup_label=True, cancel=cancel)
    wal_fd = open_dir(src / "pg_wal")  # never through a link
    try:
        names = sorted(n for n in os.listdir(wal_fd) if _WAL_FILE.fullmatch(n))
    finally:
        os.close(wal_fd)
    wal = copy_files(src / "pg_wal", dst / "pg_wal", names, cancel=cancel)
    stats.files += wal.files
    stats.bytes += wal.bytes
    return stats

"""Building a branch's data directory: a consistent copy of its parent's data at its head.

A running parent is copied online, as pg_basebackup does but without streaming anything: in one
session on the parent, a temporary replication slot keeps the WAL the copy needs (a checkpoint
during the copy would otherwise recycle it), ``pg_backup_start`` marks where recovery must
start, the files are copied while the parent keeps serving, ``pg_backup_stop`` returns the
backup label and ends the WAL the copy needs (it switches segments, so the last one needed is
complete). The branch's first start replays that WAL from the label to a consistent state.

A stopped parent is copied as files; the caller holds the parent's postmaster lock, so nothing
can start on it meanwhile.

As for a new timeline, everything is built in ``pgdata.tmp``, made durable, marked complete and
renamed into place, so a crash at any point leaves only a temporary directory that the next
attempt removes; the parent's backup ends with the session that made it. That session is a
platform session on a tenant's compute: pinned and qualified (:mod:`..postgres.sessions`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any, LiteralString

import psycopg

from pgplane import failpoints
from pgplane.compute.driver import ComputeError
from pgplane.compute.local.copies.datacopy import (
    BACKUP_FILES,
    CopyStats,
    can_clone,
    copy_data_dir,
    copy_files,
)
from pgplane.compute.local.copies.spares import SparePool
from pgplane.compute.local.copies.timeline import temporary_pgdata
from pgplane.compute.local.files import fsync_dir, sync_tree, write_atomic
from pgplane.compute.local.history.wal import (
    needed_segments,
    parse_lsn,
    read_control_data,
    segment_range,
    wal_files,
)
from pgplane.compute.local.layout import TIMELINE_MARKER
from pgplane.compute.local.postgres.binaries import PgInstall
from pgplane.compute.local.postgres.postmaster import Postmasters
from pgplane.compute.local.postgres.records import Running
from pgplane.compute.local.postgres.sessions import ADMIN_USER, connect, conninfo
from pgplane.compute.local.tenants.ownership import hand_over
from pgplane.compute.local.tenants.user import RunAs

log = logging.getLogger(__name__)

_SQL_TIMEOUT = 300.0  # pg_backup_start waits for a checkpoint
_WAL_SEGMENT = 16 << 20  # the default size; an estimate only
_MAX_RESERVE = 1 << 30
_PG15 = 150000


async def build_branch(
    *,
    install: PgInstall,
    run_as: RunAs,
    postmasters: Postmasters,
    parent: Path,
    pgdata: Path,
    label: str,
    spares: SparePool | None = None,
    disk_reserve_bytes: int | None = None,
    extra_files: Mapping[str, bytes] | None = None,
) -> CopyStats:
    """Create ``pgdata`` as a copy of ``parent``; the caller holds the parent's postmaster lock.

    ``spares``: empty files and directories made ahead, renamed into place rather than created.
    ``disk_reserve_bytes``: free space the copy must leave (None: 5% of the disk, at most 1 GiB;
    negative: no check before copying, so a full disk is met as ENOSPC in the middle of it).
    ``extra_files``: written into the copy (by name) before it is handed over, such as the
    ``standby.signal`` of a read-only compute's copy.
    """
    tmp = temporary_pgdata(pgdata)
    await postmasters.stop(tmp)
    await asyncio.to_thread(shutil.rmtree, tmp, True)
    if disk_reserve_bytes is None or disk_reserve_bytes >= 0:
        await asyncio.to_thread(check_space, parent, pgdata.parent, disk_reserve_bytes)
    started = time.perf_counter()
    running = postmasters.running(parent)
    try:
        try:
            if running is not None:
                stats = await copy_online(running, parent, tmp, label, spares)
            else:
                stats = await _copy_offline(install, run_as, parent, tmp, spares)
            copied = time.perf_counter()
            # Marked while the copy is root's (the tenant's user may run meanwhile: nothing of
            # its may stand where root writes), published only by the rename below.
            await asyncio.to_thread(write_atomic, tmp / TIMELINE_MARKER, b"")
            for name, content in (extra_files or {}).items():
                await asyncio.to_thread(write_atomic, tmp / name, content)
            # The project's user gets the copy whole, bottom-up (see ownership.py).
            await asyncio.to_thread(hand_over, tmp, {os.geteuid()}, run_as)
            # Everything was written through the page cache only; one syncfs flushes it all.
            await asyncio.to_thread(sync_tree, tmp)
        except OSError as exc:  # a full disk, say: the operation says what, and retries
            raise ComputeError(f"copying {parent} to {tmp}: {exc}") from exc
    except BaseException:
        # Do not leave a partial copy of a large parent lying around until the next attempt.
        await asyncio.shield(asyncio.to_thread(shutil.rmtree, tmp, True))
        raise
    await failpoints.reached("create_branch:copied")
    os.replace(tmp, pgdata)
    await asyncio.to_thread(fsync_dir, pgdata.parent)
    done = time.perf_counter()
    log.info(
        "branched %s from %s (%s): %d files, %.0f MB, copy %.0f ms, sync %.0f ms",
        pgdata,
        parent,
        "online" if running is not None else "offline",
        stats.files,
        stats.bytes / 1e6,
        (copied - started) * 1000,
        (done - copied) * 1000,
    )
    return stats


def default_reserve(disk_bytes: int) -> int:
    """What a copy leaves free unless configured: 5% of the disk, at most 1 GiB."""
    return min(disk_bytes // 20, _MAX_RESERVE)


def check_space(
    parent: Path, target_dir: Path, reserve: int | None, *, purpose: str = "branch"
) -> None:
    """Refuse a copy that would fill the disk, before writing anything.

    The parent's computes share the disk: filled by a copy, a running parent could not write its
    WAL and would stop (Postgres PANICs on a full WAL disk). So the copy must fit and leave the
    reserve. The estimate is the parent without its recycled WAL, plus two WAL segments; where
    files are cloned (a project's own XFS, tenants/volumes.py) the copy shares the parent's
    blocks, and only the two segments count.
    """
    needed = 2 * _WAL_SEGMENT
    for dirpath, dirnames, filenames in [] if can_clone(target_dir) else os.walk(parent):
        if dirpath == str(parent):
            dirnames[:] = [d for d in dirnames if d != "pg_wal"]
        for name in filenames:
            with contextlib.suppress(FileNotFoundError):  # a running parent's files come and go
                needed += os.lstat(os.path.join(dirpath, name)).st_size
    fs = os.statvfs(target_dir)
    free = fs.f_bavail * fs.f_frsize
    if reserve is None:
        reserve = default_reserve(fs.f_blocks * fs.f_frsize)
    if needed + reserve > free:
        raise ComputeError(
            f"not enough free disk space to {purpose}: the copy needs about {needed / 1e6:.0f} MB"
            f" and {reserve / 1e6:.0f} MB must stay free, {free / 1e6:.0f} MB are free"
            f" (No space left on device)"
        )


async def copy_online(
    running: Running, parent: Path, tmp: Path, label: str, spares: SparePool | None
) -> CopyStats:
    # Superuser (pg_backup_start and replication slots need it), pinned, names qualified.
    info = conninfo(
        running.socket_dir, running.port, user=ADMIN_USER, statement_timeout=_SQL_TIMEOUT
    )
    try:
        async with asyncio.timeout(_SQL_TIMEOUT):
            conn = await connect(info)
    except (psycopg.Error, TimeoutError) as exc:
        raise ComputeError(f"connecting to the postmaster of {parent}: {exc}") from exc
    async with conn:
        # Everything below runs in this one session: the backup and the slot end with it, so a
        # crash of ours (the connection closes) leaves nothing behind on the parent.
        version = conn.info.server_version
        (in_recovery,) = await _one(conn, "SELECT pg_catalog.pg_is_in_recovery()", ())
        if in_recovery:
            raise ComputeError(f"the postmaster of {parent} is still recovering; try again")
        await _one(
            conn,
            "SELECT pg_catalog.pg_create_physical_replication_slot(%s, true, true)",
            (_slot_name(label),),
        )
        start_sql = (
            "SELECT pg_catalog.pg_backup_start(%s, true)"
            if version >= _PG15
            else "SELECT pg_catalog.pg_start_backup(%s, true, false)"
        )
        (start_lsn,) = await _one(conn, start_sql, (label,))
        await failpoints.reached("create_branch:backup_started")
        stats = await _in_thread(
            partial(copy_data_dir, parent, tmp, online=True, keep_backup_label=False, spares=spares)
        )
        stop_sql = (
            "SELECT lsn, labelfile, spcmapfile FROM pg_catalog.pg_backup_stop(false)"
            if version >= _PG15
            else "SELECT lsn, labelfile, spcmapfile FROM pg_catalog.pg_stop_backup(false, false)"
        )
        stop_lsn, labelfile, spcmapfile = await _one(conn, stop_sql, ())
        first, last, segment_size = await _one(
            conn,
            "SELECT pg_catalog.pg_walfile_name(%s::pg_catalog.pg_lsn),"
            " pg_catalog.pg_walfile_name(%s::pg_catalog.pg_lsn),"
            " pg_catalog.pg_size_bytes(pg_catalog.current_setting('wal_segment_size'))",
            (start_lsn, stop_lsn),
        )
        # From the segment of the backup's REDO point through the one of its end record; the
        # slot kept them all, and the segment switch of pg_backup_stop completed the last one.
        segments = segment_range(first, last, int(segment_size))
        _, histories = await asyncio.to_thread(wal_files, parent / "pg_wal")
        wal = await _in_thread(
            partial(copy_files, parent / "pg_wal", tmp / "pg_wal", segments, spares=spares)
        )
    await asyncio.to_thread(_write_label, tmp, labelfile, spcmapfile)
    await _in_thread(partial(copy_files, parent / "pg_wal", tmp / "pg_wal", histories))
    log.debug(
        "online copy of %s: WAL %s..%s, %d segments", parent, start_lsn, stop_lsn, len(segments)
    )
    stats.files += wal.files
    stats.bytes += wal.bytes
    stats.start_lsn, stats.end_lsn = parse_lsn(start_lsn), parse_lsn(stop_lsn)
    stats.segment_size = int(segment_size)
    return stats


async def _copy_offline(
    install: PgInstall, run_as: RunAs, parent: Path, tmp: Path, spares: SparePool | None
) -> CopyStats:
    # A parent that is itself a copy never started holds a backup label: its recovery, now the
    # branch's, needs that label and all the WAL the copy put in its pg_wal (nothing else).
    unstarted_copy = (parent / "backup_label").is_file()
    segments, histories = await asyncio.to_thread(wal_files, parent / "pg_wal")
    end_lsn = 0
    if not unstarted_copy:
        control = await read_control_data(install, run_as, parent)
        segments = needed_segments(control, segments)
        end_lsn = control.checkpoint
    stats = await _in_thread(
        partial(
            copy_data_dir,
            parent,
            tmp,
            online=False,
            keep_backup_label=unstarted_copy,
            spares=spares,
        )
    )
    wal = await _in_thread(
        partial(
            copy_files, parent / "pg_wal", tmp / "pg_wal", [*segments, *histories], spares=spares
        )
    )
    stats.files += wal.files
    stats.bytes += wal.bytes
    stats.end_lsn = end_lsn
    return stats


async def _in_thread(copy: Callable[..., CopyStats]) -> CopyStats:
    """Run a copy in a thread; if we are cancelled, stop it and wait until it has stopped.

    A thread cannot be killed: without this, a cancelled create_branch would leave its copy
    writing into ``pgdata.tmp`` while the cleanup (or the next attempt) removes it.
    """
    cancel = threading.Event()
    running = asyncio.ensure_future(asyncio.to_thread(copy, cancel=cancel))
    try:
        return await asyncio.shield(running)
    except asyncio.CancelledError:
        cancel.set()
        with contextlib.suppress(Exception):
            await running  # at most the file being copied: it raises CopyCancelled
        raise


def _write_label(tmp: Path, labelfile: str, spcmapfile: str) -> None:
    for name, content in zip(BACKUP_FILES, (labelfile, spcmapfile), strict=True):
        if not content:
            continue  # no tablespaces: pg_basebackup writes no tablespace_map either
        path = tmp / name
        # safe: O_EXCL makes a new file, never opens one that stood there
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, content.encode())
        finally:
            os.close(fd)


def _slot_name(label: str) -> str:
    # Slot names are [a-z0-9_], at most 63 bytes; one per branch being created.
    return "pgplane_branch_" + hashlib.sha256(label.encode()).hexdigest()[:24]


async def _one(
    conn: psycopg.AsyncConnection[tuple[Any, ...]],
    query: LiteralString,
    params: tuple[object, ...],
) -> tuple[Any, ...]:
    try:
        async with asyncio.timeout(_SQL_TIMEOUT):
            cur = await conn.execute(query, params)
            row = await cur.fetchone()
    except (psycopg.Error, TimeoutError) as exc:
        raise ComputeError(f"online copy failed: {exc}") from exc
    if row is None:
        raise ComputeError(f"online copy failed: no result for {query}")
    return row

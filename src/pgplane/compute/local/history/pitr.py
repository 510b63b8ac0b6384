"""Rebuilding a branch's data at a point of its history: a base state plus its archived WAL.

The newest base state ending at or before the point is copied (its checksums verified, and those
of the archived segments the replay reads), then a temporary postmaster replays the archive on
it in archive recovery, stops at the point and promotes: the copy gets a timeline of its own and
never writes into the source's archive (archiving is off while it replays). Only then is it
stopped cleanly, flushed and handed to the caller, which publishes it. The point:

- an LSN: the state just before the record at that LSN (``recovery_target_inclusive=off``),
  which holds every transaction whose commit record ends at or before it;
- a time: every transaction committed at or before it (``recovery_target_time``, inclusive).

A time after the last commit in the archive is never "reached" (no later commit record to stop
at). The platform avoids it: every switch of a compute's segment (a flush for a request, a stop)
first writes an abort record stamped then, and a time after a stopped source's clean shutdown is
replayed to the end at once. Where it still happens (a source that died), the archive holds the
whole history up to the caller's flush, so the state at that time is all of it: the replay is
restarted in place without a target, and checked to have read the archive to its end.

Platform sessions here follow :mod:`..postgres.sessions` (pinned, qualified, superuser only to
switch segments, which needs it). The temporary postmaster is :mod:`.replay`'s.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

import psycopg

from pgplane.compute.driver import ComputeError, Point, PointNotInHistory
from pgplane.compute.local.copies.datacopy import CopyStats, copy_data_dir, copy_files
from pgplane.compute.local.copies.spares import SparePool
from pgplane.compute.local.files import sync_tree
from pgplane.compute.local.history.archiving import (
    Base,
    HistoryDirs,
    archived_segments,
    verify_base,
    verify_wal,
)
from pgplane.compute.local.history.replay import POLL, TargetNotReached, format_lsn, pg_time, replay
from pgplane.compute.local.history.wal import parse_segment, wal_files
from pgplane.compute.local.postgres.binaries import PgInstall
from pgplane.compute.local.postgres.postmaster import Postmasters
from pgplane.compute.local.postgres.records import Running
from pgplane.compute.local.postgres.sessions import ADMIN_USER, connect, conninfo
from pgplane.compute.local.tenants.cgroups import Limits
from pgplane.compute.local.tenants.ownership import hand_over
from pgplane.compute.local.tenants.user import RunAs

log = logging.getLogger(__name__)

_T = TypeVar("_T")
_ARCHIVE_TIMEOUT = 60.0
_SWITCH_TIMEOUT = 10.0


def describe(point: Point) -> str:
    if point.lsn is not None:
        return f"LSN {format_lsn(point.lsn)}"
    return f"time {pg_time(point.time_us or 0)}"


def choose_base(bases: list[Base], point: Point) -> Base | None:
    """The newest base state ending at or before ``point``."""
    usable = [
        b
        for b in bases
        if (b.end_lsn <= point.lsn if point.lsn is not None else b.end_time <= (point.time_us or 0))
    ]
    return usable[-1] if usable else None


async def switch_wal(running: Running) -> str | None:
    """Complete the compute's current segment (so it is archived); the segment's name, or None
    when nothing was written since the last switch. Best effort: None when it cannot be asked."""
    info = conninfo(running.socket_dir, running.port, user=ADMIN_USER)
    try:
        async with asyncio.timeout(_SWITCH_TIMEOUT):
            conn = await connect(info)
            async with conn:
                cur = await conn.execute(
                    "SELECT pg_catalog.pg_is_in_recovery(),"
                    " pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn())"
                )
                row = await cur.fetchone()
                if row is None or row[0]:
                    return None
                # A transaction's abort record, stamped now, at the end of the history: a replay
                # to any earlier time stops at it (no later commit, it would never be "reached").
                async with conn.transaction(force_rollback=True):
                    await conn.execute("SELECT pg_catalog.pg_current_xact_id()")
                # The segment holding the position just before the one returned: a switch with
                # nothing new to complete returns the start of the current segment.
                cur = await conn.execute(
                    "SELECT pg_catalog.pg_walfile_name("
                    "pg_catalog.pg_switch_wal() OPERATOR(pg_catalog.-) 1::pg_catalog.numeric)"
                )
                switched = await cur.fetchone()
    except (psycopg.Error, TimeoutError, OSError) as exc:
        log.info("could not switch the WAL segment of %s: %s", running.socket_dir, exc)
        return None
    return str(switched[0]) if switched else None


async def flush_archive(running: Running, dirs: HistoryDirs) -> None:
    """Have everything the running compute wrote so far in the archive (a request needs it)."""
    segment = await switch_wal(running)
    if segment is None:
        raise ComputeError("the running compute could not be asked to archive its latest WAL")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _ARCHIVE_TIMEOUT
    while not (dirs.wal / segment).is_file():
        if loop.time() >= deadline:
            raise ComputeError(
                f"WAL segment {segment} was not archived within {_ARCHIVE_TIMEOUT:.0f} s;"
                " the compute's log says why"
            )
        await asyncio.sleep(POLL)


def _no_check(base: Base) -> None:
    pass


async def rebuild(
    *,
    install: PgInstall,
    run_as: RunAs,
    postmasters: Postmasters,
    source: HistoryDirs,
    base: Base,
    tmp: Path,
    socket_dir: Path,
    hba_file: Path,
    point: Point | None,
    tail: Path | None = None,
    spares: SparePool | None = None,
    base_checked: bool = False,
    limits: Limits | None = None,
) -> int:
    """Build ``tmp`` as the source's data at ``point`` (None: all of its history); the LSN its
    new timeline starts at.

    ``tail``: WAL files of a stopped source that its archive lacks, put in the copy's pg_wal,
    where a replay looks for a segment its restore_command does not find. ``spares``: files
    made ahead (creating ~1,300 of them is most of the copy of a small cluster).
    ``base_checked``: the base state's files were checked against its checksums just now (a
    base state fetched from shared storage): not read again. ``limits``: the replay's cgroup
    (None: none, for the platform's own operations, paced by the engine's slots).
    """
    segments = [
        name
        for _, segno, name in archived_segments(source, base.segment_size)
        if segno >= base.start_lsn // base.segment_size
    ]
    likely = _likely_read(source, segments, base.segment_size, point)
    t0 = time.perf_counter()
    # The checksums are checked beside the copy and the replay (the other core), not before
    # them: in sequence they added half again to a rebuild of 1 GB. Nothing is published
    # before they pass, and a replay is stopped as soon as one fails. Of the archive, the
    # segments up to the point are checked meanwhile, any other the replay read after it.
    checks: asyncio.Future[tuple[None, None]] = asyncio.ensure_future(
        asyncio.gather(
            asyncio.to_thread(_no_check if base_checked else verify_base, base),
            asyncio.to_thread(verify_wal, source, likely),
        )
    )
    restored: set[str] = set()
    try:
        stats = await asyncio.to_thread(_copy_base, base, tmp, tail, spares)
        if spares is not None:  # as many for the next two (the caller refills the pool)
            spares.want(2 * stats.files, 2 * stats.dirs)
        await asyncio.to_thread(hand_over, tmp, {os.geteuid()}, run_as)
        t1 = time.perf_counter()
        replay = _replay_to(
            install, run_as, postmasters, source, tmp, socket_dir, hba_file, point, restored, limits
        )
        switch, to_end = await _unless_failed(checks, replay)
        await checks
    finally:
        await asyncio.gather(checks, return_exceptions=True)
    await asyncio.to_thread(verify_wal, source, sorted(restored - set(likely)))
    last = segments[-1] if segments else None
    if to_end and last is not None:
        _, last_segno = parse_segment(last, base.segment_size)
        if switch // base.segment_size < last_segno:
            raise ComputeError(
                f"the replay stopped at {format_lsn(switch)}, before the end of the archive"
                f" ({last}): a segment is unreadable"
            )
    t2 = time.perf_counter()
    await asyncio.to_thread(sync_tree, tmp)
    log.info(
        "%s rebuilt from base state %s: copied in %.0f ms, replayed in %.0f ms, synced in %.0f ms",
        "the end of the history" if point is None else describe(point),
        base.path.name,
        (t1 - t0) * 1000,
        (t2 - t1) * 1000,
        (time.perf_counter() - t2) * 1000,
    )
    return switch


def _likely_read(
    source: HistoryDirs, segments: list[str], segment_size: int, point: Point | None
) -> list[str]:
    """The archived segments a replay to ``point`` reads, as far as can be told beforehand: up
    to the point's LSN, or to the first segment last written at or after the point's time."""
    if point is None:
        return segments
    if point.lsn is not None:
        last = point.lsn // segment_size
        return [n for n in segments if parse_segment(n, segment_size)[1] <= last]
    likely = []
    for name in segments:
        likely.append(name)
        try:
            written = (source.wal / name).stat().st_mtime_ns // 1000
        except FileNotFoundError:
            continue  # freed meanwhile: the replay will say so
        if written >= (point.time_us or 0):
            break
    return likely


async def _unless_failed(checks: asyncio.Future[Any], work: Awaitable[_T]) -> _T:
    """``work``'s result, unless ``checks`` fail first (then ``work`` is cancelled)."""
    task = asyncio.ensure_future(work)
    both: set[asyncio.Future[Any]] = {task, checks}
    try:
        await asyncio.wait(both, return_when=asyncio.FIRST_EXCEPTION)
        if checks.done() and not checks.cancelled() and checks.exception() is not None:
            await checks  # raises it
        return await task
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def _replay_to(
    install: PgInstall,
    run_as: RunAs,
    postmasters: Postmasters,
    source: HistoryDirs,
    tmp: Path,
    socket_dir: Path,
    hba_file: Path,
    point: Point | None,
    restored: set[str],
    limits: Limits | None,
) -> tuple[int, bool]:
    """Replay to ``point`` (None: to the end of the history); where the new timeline starts,
    and whether the replay went to the end of the history. ``restored`` gets the name of each
    file the replay fetched from the archive."""

    async def replay_to(target: Point | None) -> int:
        return await replay(
            install, run_as, postmasters, source, tmp, socket_dir, hba_file, target, restored,
            limits=limits,
        )  # fmt: skip

    try:
        switch = await replay_to(point)
    except TargetNotReached:
        if point is None:
            raise ComputeError("the replay ended before the end of the history") from None
        if point.lsn is not None:  # the caller flushed the whole history into the archive
            raise PointNotInHistory(
                f"{describe(point)} is past the end of the branch's history"
            ) from None
        log.info("%s is after the last commit archived: replaying all of it", describe(point))
    else:
        return switch, point is None
    # The copy stopped in archive recovery at the end of the history: started again without a
    # target, it goes on from its last restartpoint (a standby restarted), to the end.
    await postmasters.stop(tmp)
    switch = await replay_to(None)
    return switch, True


def _copy_base(base: Base, tmp: Path, tail: Path | None, spares: SparePool | None) -> CopyStats:
    never = threading.Event()
    stats = copy_data_dir(
        base.pgdata, tmp, online=False, keep_backup_label=True, cancel=never, spares=spares
    )
    segments, histories = wal_files(base.pgdata / "pg_wal")
    if tail is not None and tail.is_dir():
        newer = set(os.listdir(tail))  # a later version of a segment the base holds part of
        segments = [n for n in segments if n not in newer]
        histories = [n for n in histories if n not in newer]
        copy_files(tail, tmp / "pg_wal", sorted(newer), cancel=never)
    copy_files(base.pgdata / "pg_wal", tmp / "pg_wal", [*segments, *histories], cancel=never)
    # Not made durable: the copy is published only once synced whole, and a crash discards it.
    # An fsync here would force the whole copy to disk first (ext4 commits the data written
    # with the transaction that holds the new file), before a replay that could overlap it.
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    os.close(os.open(tmp / "recovery.signal", flags, 0o600))  # safe: O_EXCL
    return stats

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
at): Postgres stops with "recovery ended before configured recovery target was reached". The
archive then holds the whole history up to the caller's flush, so the state at that time is
all of it: replayed again without a target, and checked to have read the archive to its end.

Platform sessions here follow :mod:`.sessions` (pinned, qualified, superuser only to switch
segments, which needs it).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

import psycopg

from pgplane.compute.driver import ComputeError, Point
from pgplane.compute.local.binaries import PgInstall
from pgplane.compute.local.datacopy import CopyStats, copy_data_dir, copy_files
from pgplane.compute.local.files import sync_tree, write_atomic
from pgplane.compute.local.history import (
    Base,
    HistoryDirs,
    archived_segments,
    restore_command,
    verify_base,
    verify_wal,
)
from pgplane.compute.local.ownership import hand_over
from pgplane.compute.local.pidfile import PidFile
from pgplane.compute.local.postmaster import Postmasters, postmaster_argv
from pgplane.compute.local.sessions import ADMIN_USER, connect, conninfo
from pgplane.compute.local.spares import SparePool
from pgplane.compute.local.timeline import INIT_PORT, fresh_socket_dir
from pgplane.compute.local.user import RunAs
from pgplane.compute.local.wal import parse_lsn, parse_segment, wal_files

log = logging.getLogger(__name__)

_T = TypeVar("_T")
_NOT_REACHED = "recovery ended before configured recovery target was reached"
_RESTORED = re.compile(r'restored log file "([0-9A-F]{8}(?:[0-9A-F]{16}|\.history))" from archive')
_REPLAY_TIMEOUT = 3600.0
_ARCHIVE_TIMEOUT = 60.0
_SWITCH_TIMEOUT = 10.0
_POLL = 0.05


def describe(point: Point) -> str:
    if point.lsn is not None:
        return f"LSN {format_lsn(point.lsn)}"
    return f"time {_timestamp(point.time_us or 0)}"


def format_lsn(lsn: int) -> str:
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def _timestamp(time_us: int) -> str:
    moment = datetime.datetime.fromtimestamp(time_us / 1_000_000, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S.%f+00")


def choose_base(bases: list[Base], point: Point) -> Base | None:
    """The newest base state ending at or before ``point``."""
    usable = [
        b
        for b in bases
        if (b.end_lsn <= point.lsn if point.lsn is not None else b.end_time <= (point.time_us or 0))
    ]
    return usable[-1] if usable else None


async def switch_wal(running: PidFile) -> str | None:
    """Complete the compute's current segment (so it is archived); the segment's name, or None
    when nothing was written since the last switch. Best effort: None when it cannot be asked."""
    if running.socket_dir is None or running.port is None:
        return None
    info = conninfo(Path(running.socket_dir), running.port, user=ADMIN_USER)
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


async def flush_archive(running: PidFile, dirs: HistoryDirs) -> None:
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
        await asyncio.sleep(_POLL)


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
) -> int:
    """Build ``tmp`` as the source's data at ``point`` (None: all of its history); the LSN its
    new timeline starts at.

    ``tail``: WAL files of a stopped source that its archive lacks, put in the copy's pg_wal,
    where a replay looks for a segment its restore_command does not find. ``spares``: files
    made ahead (creating ~1,300 of them is most of the copy of a small cluster).
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
            asyncio.to_thread(verify_base, base),
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
            install, run_as, postmasters, source, tmp, socket_dir, hba_file, point, restored
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
) -> tuple[int, bool]:
    """Replay to ``point`` (None: to the end of the history); where the new timeline starts,
    and whether the replay went to the end of the history. ``restored`` gets the name of each
    file the replay fetched from the archive."""
    try:
        switch = await _replay(
            install, run_as, postmasters, source, tmp, socket_dir, hba_file, point, restored
        )
    except _TargetNotReached:
        if point is None:
            raise ComputeError("the replay ended before the end of the history") from None
        log.info("%s is after the last commit archived: replaying all of it", describe(point))
    else:
        return switch, point is None
    # The copy stopped in archive recovery at the end of the history: started again without a
    # target, it goes on from its last restartpoint (a standby restarted), to the end.
    await postmasters.stop(tmp)
    switch = await _replay(
        install, run_as, postmasters, source, tmp, socket_dir, hba_file, None, restored
    )
    return switch, True


class _TargetNotReached(Exception):
    pass


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
    write_atomic(tmp / "recovery.signal", b"")
    return stats


async def _replay(
    install: PgInstall,
    run_as: RunAs,
    postmasters: Postmasters,
    source: HistoryDirs,
    tmp: Path,
    socket_dir: Path,
    hba_file: Path,
    point: Point | None,
    restored: set[str],
) -> int:
    settings = {
        "restore_command": restore_command(source.wal),
        # Its log names each file fetched from the archive (at LOG), whatever the copy's own
        # configuration says: those are checked against their checksums before publishing.
        "log_min_messages": "warning",
        "recovery_target_timeline": "latest",
        "recovery_target_action": "promote",
        "archive_mode": "off",
        # No read-only sessions while it replays (it answers once promoted): hot standby would
        # also pause the replay when this postmaster's limits are below the source compute's.
        "hot_standby": "off",
        # Safe: the caller flushes every file before publishing, and a crash discards the copy.
        "fsync": "off",
    }
    if point is not None and point.lsn is not None:
        settings["recovery_target_lsn"] = format_lsn(point.lsn)
        settings["recovery_target_inclusive"] = "off"
    elif point is not None and point.time_us is not None:
        settings["recovery_target_time"] = _timestamp(point.time_us)
    run_as.chown(tmp / "recovery.signal")
    await asyncio.to_thread(fresh_socket_dir, socket_dir, run_as)
    argv = postmaster_argv(
        install,
        tmp,
        port=INIT_PORT,
        socket_dir=socket_dir,
        listen="",  # nobody but us reaches a copy being rebuilt
        settings=settings,
        hba_file=hba_file,
    )
    log_path = tmp.parent / "rebuild.log"
    log_path.unlink(missing_ok=True)
    try:
        try:
            await postmasters.start(
                argv,
                pgdata=tmp,
                port=INIT_PORT,
                socket_dir=socket_dir,
                run_as=run_as,
                log_path=log_path,
                spawned="rebuild:replaying",
                ready_timeout=_REPLAY_TIMEOUT,  # it answers once promoted
            )
            await _wait_promoted(socket_dir, postmasters, tmp)
        except ComputeError as exc:
            if _NOT_REACHED in str(exc) or _NOT_REACHED in _log_text(log_path):
                raise _TargetNotReached from exc
            raise
    finally:
        await postmasters.stop(tmp)
        await asyncio.to_thread(shutil.rmtree, socket_dir, True)
        restored.update(_RESTORED.findall(_log_text(log_path)))
    return _switch_point(tmp)


async def _wait_promoted(socket_dir: Path, postmasters: Postmasters, tmp: Path) -> None:
    info = conninfo(socket_dir, INIT_PORT, user=ADMIN_USER)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _REPLAY_TIMEOUT
    while True:
        if postmasters.running(tmp) is None:
            raise ComputeError("the rebuilding postmaster exited during the replay")
        try:
            async with asyncio.timeout(10.0):
                conn = await connect(info)
                async with conn:
                    cur = await conn.execute("SELECT pg_catalog.pg_is_in_recovery()")
                    row = await cur.fetchone()
        except (psycopg.Error, TimeoutError) as exc:
            row = None
            log.debug("rebuild: %s", exc)
        if row is not None and not row[0]:
            return
        if loop.time() >= deadline:
            raise ComputeError(f"the replay did not end within {_REPLAY_TIMEOUT:.0f} s")
        await asyncio.sleep(_POLL)


def _log_text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _switch_point(pgdata: Path) -> int:
    """Where the promoted copy's timeline branched off: the last line of its history file."""
    _, histories = wal_files(pgdata / "pg_wal")
    if not histories:
        raise ComputeError("the rebuilt copy has no timeline history: it was not promoted")
    newest = max(histories, key=lambda n: int(n[:8], 16))
    lines = [
        line.split()
        for line in (pgdata / "pg_wal" / newest).read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    if not lines or len(lines[-1]) < 2:
        raise ComputeError(f"timeline history {newest} of the rebuilt copy is empty")
    return parse_lsn(lines[-1][1])

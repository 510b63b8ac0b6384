"""Taking a branch's base states: a checksummed copy of its data, published whole.

A base state is copied into a temporary directory under ``base/`` (its files checksummed, then
``base.json`` written last and the directory renamed into place), so that a reader only ever
sees complete ones; what a crash leaves half copied is swept before the next is taken. Online
copies are the branch copy's (:mod:`..copies.branch`); here are those of stopped data, taken
without a lock, so that a wake never waits for one: the control file is read before and after,
and a copy during which a postmaster ran on the data is thrown away and taken again later. Also
here: what a rebuild takes of a stopped branch beside its base states (when it shut down, and
the WAL its archive lacks).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from pgplane.compute.local.copies.datacopy import copy_data_dir, copy_files
from pgplane.compute.local.files import fsync_dir, sync_tree, write_atomic
from pgplane.compute.local.history.archiving import BASE_STATE, Base, HistoryDirs, file_sha256
from pgplane.compute.local.history.wal import (
    needed_segments,
    read_control_data,
    wal_files,
)
from pgplane.compute.local.layout import ensure_dir
from pgplane.compute.local.postgres.binaries import PgInstall
from pgplane.compute.local.postgres.pidfile import read_pid_file
from pgplane.compute.local.tenants.user import RunAs

log = logging.getLogger(__name__)

_FORMAT = 1


async def take_offline_base(
    install: PgInstall,
    run_as: RunAs,
    dirs: HistoryDirs,
    *,
    source: Path | None = None,
) -> Base | None:
    """A base state copied from the stopped data at ``source`` (the branch's own by default).

    None when the data is not cleanly shut down (a copy never started, or a postmaster that
    died: replayed at its next start, after which a base is taken online) or when a postmaster
    ran on it during the copy.
    """
    pgdata = source or dirs.pgdata
    before = await read_control_data(install, run_as, pgdata)
    if not before.shut_down or read_pid_file(pgdata) is not None:
        return None
    shut_down_at = await asyncio.to_thread(stopped_by, pgdata)
    tmp = fresh_tmp(dirs)
    try:
        segments, histories = await asyncio.to_thread(wal_files, pgdata / "pg_wal")
        wanted = [*needed_segments(before, segments), *histories]
        await asyncio.to_thread(_copy_stopped, pgdata, tmp / "pgdata", wanted)
        after = await read_control_data(install, run_as, pgdata)
        if after != before or read_pid_file(pgdata) is not None:
            log.info("a postmaster ran on %s while its base state was copied: taken later", pgdata)
            await asyncio.to_thread(shutil.rmtree, tmp, True)
            return None
        return await asyncio.to_thread(
            publish_base,
            dirs,
            tmp,
            start_lsn=before.redo,
            end_lsn=before.checkpoint,
            end_time=shut_down_at,
            segment_size=before.segment_size,
        )
    except BaseException:
        await asyncio.shield(asyncio.to_thread(shutil.rmtree, tmp, True))
        raise


def stopped_by(pgdata: Path) -> int:
    """A time (epoch us) no earlier than the stopped data's last write: its control file's mtime,
    rounded up, and a microsecond more for what the cold archive's float mtimes may lose."""
    return -(-(pgdata / "global" / "pg_control").stat().st_mtime_ns // 1000) + 1


def _copy_stopped(pgdata: Path, dst: Path, wal: list[str]) -> None:
    # online=True: files a tenant's stray process removes meanwhile are skipped, not fatal
    # (the before/after check throws such a copy away anyway).
    never = threading.Event()
    copy_data_dir(pgdata, dst, online=True, keep_backup_label=False, cancel=never)
    copy_files(pgdata / "pg_wal", dst / "pg_wal", wal, cancel=never)


def new_base_dir(dirs: HistoryDirs) -> Path:
    """An empty temporary directory for a base state being taken (its data goes in pgdata/)."""
    return fresh_tmp(dirs)


def fresh_tmp(dirs: HistoryDirs) -> Path:
    ensure_dir(dirs.bases, 0o700)
    tmp = dirs.bases / f".tmp-{os.urandom(4).hex()}"
    tmp.mkdir(mode=0o700)
    return tmp


def publish_base(
    dirs: HistoryDirs,
    tmp: Path,
    *,
    start_lsn: int,
    end_lsn: int,
    end_time: int,
    segment_size: int,
    files: Mapping[str, str] | None = None,
) -> Base:
    """Checksum the copy in ``tmp`` (unless its checksums are known: ``files``), make it
    durable and rename it into place."""
    files = dict(checksums(tmp / "pgdata") if files is None else files)
    size = sum(os.lstat(tmp / "pgdata" / rel).st_size for rel in files)
    data = {
        "format": _FORMAT,
        "start_lsn": start_lsn,
        "end_lsn": end_lsn,
        "end_time": end_time,
        "segment_size": segment_size,
        "taken_at": int(time.time() * 1_000_000),
        "bytes": size,
        "files": files,
    }
    write_atomic(tmp / BASE_STATE, json.dumps(data).encode())
    sync_tree(tmp)
    final = dirs.bases / f"{end_lsn:016X}"
    if final.exists():  # the same state taken twice (a retry): keep the first
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        os.replace(tmp, final)
        fsync_dir(dirs.bases)
    log.info("base state of %s at %X taken (%d files)", dirs.branch_dir.name, end_lsn, len(files))
    return Base(final, start_lsn, end_lsn, end_time, segment_size, files, size)


def checksums(root: Path) -> Iterator[tuple[str, str]]:
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = os.path.join(dirpath, name)
            yield os.path.relpath(path, root), file_sha256(path)


def sweep_unfinished_bases(dirs: HistoryDirs) -> None:
    """Remove base states a crash left half copied (none may be being taken meanwhile)."""
    if dirs.bases.is_dir():
        for entry in dirs.bases.iterdir():
            if entry.name.startswith(".tmp-"):
                shutil.rmtree(entry, ignore_errors=True)


def shut_down_at(pgdata: Path) -> int | None:
    """A time no earlier than the stopped data's clean shutdown (see ``stopped_by``), else None:
    a postmaster that died leaves its pid file, a copy never started its backup label."""
    if read_pid_file(pgdata) is not None or (pgdata / "backup_label").exists():
        return None
    try:
        return stopped_by(pgdata)
    except FileNotFoundError:
        return None


def copy_unarchived(dirs: HistoryDirs, tail: Path) -> None:
    """The stopped branch's WAL files its archive lacks (its last, partial segment at least)."""
    segments, histories = wal_files(dirs.pgdata / "pg_wal")
    archived = set(os.listdir(dirs.wal)) if dirs.wal.is_dir() else set()
    missing = [n for n in [*segments, *histories] if n not in archived]
    tail.mkdir(mode=0o700)
    if missing:
        copy_files(dirs.pgdata / "pg_wal", tail, missing, cancel=threading.Event())

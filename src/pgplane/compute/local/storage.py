"""What a branch takes on disk: its data and its history, counted as ``du`` counts them.

The figures are allocated blocks (``st_blocks``, what the filesystem gave, holes not counted),
each inode once however many links it has within what is counted, directories included. The
trees are the tenant's, so they are walked by directory descriptors, each opened as a
directory only, without following a link and without waiting (``os.fwalk`` opens with
O_RDONLY alone: a FIFO swapped in for a directory after its stat would hold the thread for
ever): a link a tenant planted is counted as the link it is, never followed elsewhere; nothing
is opened or read but directories. A tree of more entries than a walk gets through in
``WALK_SECONDS`` (a tenant's million empty files) gives no figure rather than hold a thread.
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
import time
from pathlib import Path

from pgplane.compute.driver import BranchStorage, ComputeError
from pgplane.compute.local.history.archiving import HistoryDirs
from pgplane.compute.local.postgres.logical import SLOT_IDLE_TIMEOUT, SLOT_WAL_KEEP_MB
from pgplane.compute.local.postgres.monitor import figures
from pgplane.compute.local.postgres.records import Running

log = logging.getLogger(__name__)

WALK_SECONDS = 30.0
# An inactive replication slot keeping this much WAL is reported (logged) at each sample.
_SLOT_REPORT_BYTES = 256 << 20
_BLOCK = 512  # st_blocks' unit, whatever the filesystem's block size


# A directory of the tenant's is opened only as a directory, never through a link, and never
# waiting: a FIFO (or anything not a directory) swapped in after its stat fails to open at once.
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
# Deeper than this (a tenant's chain of empty directories) the tree gets no figure: each level
# holds a descriptor while its children are counted.
MAX_DEPTH = 256


class _TooLong(Exception):
    """The walk ran past its time or depth."""


def allocated_bytes(*tops: Path, time_limit: float = WALK_SECONDS) -> int | None:
    """Bytes allocated to ``tops`` and all beneath them (0 for one that does not exist); None
    when the walk ran past ``time_limit`` or :data:`MAX_DEPTH` (blocking: run it in a thread)."""
    deadline = time.monotonic() + time_limit
    seen: set[tuple[int, int]] = set()

    def count(st: os.stat_result) -> int:
        if st.st_nlink > 1:
            key = (st.st_dev, st.st_ino)
            if key in seen:
                return 0
            seen.add(key)
        return st.st_blocks * _BLOCK

    def below(fd: int, depth: int) -> int:
        if depth > MAX_DEPTH or time.monotonic() > deadline:
            raise _TooLong
        total = 0
        with os.scandir(fd) as entries:
            for entry in entries:
                try:
                    st = entry.stat(follow_symlinks=False)  # safe: fstatat, no link followed
                except FileNotFoundError:  # removed meanwhile
                    continue
                total += count(st)
                if stat.S_ISDIR(st.st_mode):
                    try:
                        child = os.open(entry.name, _DIR_FLAGS, dir_fd=fd)  # safe: see flags
                    except OSError:  # gone, or no longer a directory
                        continue
                    try:
                        total += below(child, depth + 1)
                    finally:
                        os.close(child)
        return total

    total = 0
    try:
        for top in tops:
            try:
                st = os.lstat(top)
            except FileNotFoundError:
                continue
            total += count(st)
            if not stat.S_ISDIR(st.st_mode):
                continue
            try:
                fd = os.open(top, _DIR_FLAGS)  # safe: see flags
            except OSError:
                continue
            try:
                total += below(fd, 1)
            finally:
                os.close(fd)
    except _TooLong:
        return None
    return total


async def branch_storage(
    dirs: HistoryDirs, running: Running | None, *, walk: bool = True
) -> BranchStorage:
    """The branch's figures: its logical size and WAL position asked of its endpoint's compute
    when one runs, its trees walked unless ``walk`` is False."""
    logical = lsn = None
    if running is not None and running.endpoint_id is not None:
        try:
            found = await figures(running.socket_dir, running.port)
        except ComputeError as exc:  # starting, stopping, or too busy: its sizes come next time
            log.info("branch %s: logical size not read: %s", dirs.branch_dir.name, exc)
        else:
            logical, lsn = found.logical, found.wal_lsn
            _report_slots(dirs, found.idle_slots)
    if not walk:
        return BranchStorage(logical=logical, data=None, history=None, wal_lsn=lsn)
    data = await asyncio.to_thread(allocated_bytes, dirs.pgdata)
    history = await asyncio.to_thread(allocated_bytes, dirs.wal, dirs.bases)
    if data is None or history is None:
        log.warning(
            "branch %s: its files took over %.0f s to count; its sizes stay as last counted",
            dirs.branch_dir.name,
            WALK_SECONDS,
        )
    return BranchStorage(logical=logical, data=data, history=history, wal_lsn=lsn)


def _report_slots(dirs: HistoryDirs, slots: list[tuple[str, int]]) -> None:
    """Say which replication slots keep WAL with no one reading them (the tenant's subscriber
    went away): each costs the project's disk until Postgres invalidates it (postgres/logical.py
    has the bounds)."""
    for name, kept in slots:
        if kept >= _SLOT_REPORT_BYTES:
            log.warning(
                "branch %s: replication slot %r is not read by any subscriber and keeps %d MiB"
                " of WAL (it is invalidated past %d MiB, or idle %s on Postgres 18)",
                dirs.branch_dir.name,
                name,
                kept >> 20,
                SLOT_WAL_KEEP_MB,
                SLOT_IDLE_TIMEOUT,
            )

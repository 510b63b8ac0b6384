"""What a branch takes on disk: its data and its history, counted as ``du`` counts them.

The figures are allocated blocks (``st_blocks``, what the filesystem gave, holes not counted),
each inode once however many links it has within what is counted, directories included. The
trees are the tenant's, so they are walked by directory descriptors without following links
(``os.fwalk``): a link a tenant planted is counted as the link it is, never followed elsewhere;
nothing is opened or read but directories. A tree of more entries than a walk gets through in
``WALK_SECONDS`` (a tenant's million empty files) gives no figure rather than hold a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from pathlib import Path

from pgplane.compute.driver import BranchStorage, ComputeError
from pgplane.compute.local.history.archiving import HistoryDirs
from pgplane.compute.local.postgres.monitor import logical_size
from pgplane.compute.local.postgres.records import Running

log = logging.getLogger(__name__)

WALK_SECONDS = 30.0
_BLOCK = 512  # st_blocks' unit, whatever the filesystem's block size


def allocated_bytes(*tops: Path, time_limit: float = WALK_SECONDS) -> int | None:
    """Bytes allocated to ``tops`` and all beneath them (0 for one that does not exist); None
    when the walk ran past ``time_limit`` (blocking: run it in a thread)."""
    deadline = time.monotonic() + time_limit
    seen: set[tuple[int, int]] = set()
    total = 0

    def count(st: os.stat_result) -> int:
        if st.st_nlink > 1:
            key = (st.st_dev, st.st_ino)
            if key in seen:
                return 0
            seen.add(key)
        return st.st_blocks * _BLOCK

    for top in tops:
        try:
            total += count(os.lstat(top))
        except FileNotFoundError:
            continue
        if not os.path.isdir(top) or os.path.islink(top):
            continue
        for _, dirs, files, fd in os.fwalk(top, follow_symlinks=False):
            for name in (*dirs, *files):
                with contextlib.suppress(FileNotFoundError):  # removed meanwhile
                    total += count(os.stat(name, dir_fd=fd, follow_symlinks=False))
            if time.monotonic() > deadline:
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
            logical, lsn = await logical_size(running.socket_dir, running.port)
        except ComputeError as exc:  # starting, stopping, or too busy: its sizes come next time
            log.info("branch %s: logical size not read: %s", dirs.branch_dir.name, exc)
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

"""A branch's history: its WAL, archived as its computes write it, and base states to replay from.

::

    branches/<branch_id>/wal/                 every WAL segment (and timeline history file) the
                                              branch's postmasters completed, hard links to the
                                              segments themselves (``archive_settings``), the
                                              project's user's, 0700
    branches/<branch_id>/base/<end lsn>/      one base state: ``pgdata/`` (a copy of the data
                                              directory, consistent at ``end lsn`` once its own
                                              WAL is replayed) and ``base.json`` (its LSNs, when
                                              it was taken, the sha256 of every file), written
                                              last: a base without it is incomplete. root's
    branches/<branch_id>/base/wal.json        the sha256 of each archived segment, taken as the
                                              keeper first sees it

A base state is what a point-in-time rebuild starts from: the newest one whose end is at or
before the point, then the archived WAL replayed to the point (``pitr``). The branch's first one
is taken as soon as the branch exists, the next ones when the WAL archived since the newest
outgrows the data (so replay never takes much longer than a copy), and the window of the
project's ``history_retention_seconds`` decides what is freed: every base older than the newest
one at or before the window's start, and the WAL before it. Base states are root's, out of the
tenant's reach (the archive is the compute user's: its postmasters write it).

A base is taken online from a running compute (the branch copy's online backup,
:mod:`..copies.branch`) or, when none runs, as files (:mod:`.bases`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pgplane.compute.driver import ComputeError
from pgplane.compute.local.files import write_atomic
from pgplane.compute.local.history.wal import (
    parse_segment,
    wal_files,
)
from pgplane.compute.local.layout import ensure_dir
from pgplane.compute.local.tenants import untrusted
from pgplane.compute.local.tenants.user import RunAs

log = logging.getLogger(__name__)

DEFAULT_RETENTION = 86400  # Neon's default: a project without storage settings keeps a day
BASE_STATE = "base.json"
WAL_SUMS = "wal.json"
_HASH_CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class HistoryDirs:
    """Where one branch keeps its history."""

    branch_dir: Path

    @property
    def wal(self) -> Path:
        return self.branch_dir / "wal"

    @property
    def bases(self) -> Path:
        return self.branch_dir / "base"

    @property
    def pgdata(self) -> Path:
        return self.branch_dir / "pgdata"


@dataclass(frozen=True, slots=True)
class Base:
    """A base state: its data is consistent at ``end_lsn`` (reached at ``end_time``, epoch us)."""

    path: Path
    start_lsn: int
    end_lsn: int
    end_time: int
    segment_size: int
    files: dict[str, str]
    bytes: int = 0

    @property
    def pgdata(self) -> Path:
        return self.path / "pgdata"


def archive_settings(wal_dir: Path) -> dict[str, str]:
    """A postmaster's settings to archive every completed segment into ``wal_dir``.

    By hard link, not by copy: a completed segment is never written again, so the archive can
    share its blocks, and archiving costs no I/O at all (copying every segment, as Postgres'
    basic_archive does, cost 13-16% of a write-heavy pgbench's tps here). That holds only if
    Postgres never reuses a segment file: ``wal_recycle=off`` makes it unlink old segments
    rather than rename them for reuse, and ``wal_init_zero=off`` spares it zero-filling each new
    one (what recycling saved). The data was flushed by Postgres before the segment completed;
    the link is journaled metadata, ordered before the unlink of the original at a later
    checkpoint. A segment archived already (a retry after a crash) is left as it is.
    """
    target = _percent_escaped(str(wal_dir))
    return {
        "archive_mode": "on",
        "archive_command": f"test -f '{target}/%f' || ln '%p' '{target}/%f'",
        "wal_recycle": "off",
        "wal_init_zero": "off",
    }


def restore_command(wal_dir: Path) -> str:
    """What a recovering postmaster runs to fetch a segment (a missing one ends the replay)."""
    return f"cp '{_percent_escaped(str(wal_dir))}/%f' '%p'"


def _percent_escaped(path: str) -> str:
    if "'" in path:
        raise ComputeError(f"the data directory path {path!r} cannot hold a quote")
    return path.replace("%", "%%")


def read_retention(storage_config: Path) -> int:
    """The project's history window (seconds), as ``apply_storage_config`` recorded it."""
    try:
        data = json.loads(storage_config.read_bytes())  # root's: projects/<id>/
        return int(data["history_retention_seconds"])
    except FileNotFoundError:
        return DEFAULT_RETENTION
    except (ValueError, KeyError, TypeError) as exc:
        raise ComputeError(f"{storage_config} is unreadable: {exc}") from None


def prepare_archive(dirs: HistoryDirs, run_as: RunAs) -> None:
    """The archive directory, the compute user's (its postmasters write it)."""
    if not dirs.wal.is_dir():
        with contextlib.suppress(FileExistsError):  # made meanwhile by the keeper, say
            dirs.wal.mkdir(mode=0o700)
        run_as.chown(dirs.wal)
    ensure_dir(dirs.bases, 0o700)


def list_bases(dirs: HistoryDirs) -> list[Base]:
    """The complete base states, oldest first."""
    if not dirs.bases.is_dir():
        return []
    found = []
    for entry in dirs.bases.iterdir():
        state = entry / BASE_STATE
        if not entry.is_dir() or not state.is_file():
            continue
        data = json.loads(state.read_bytes())  # root's: base/
        found.append(
            Base(
                path=entry,
                start_lsn=data["start_lsn"],
                end_lsn=data["end_lsn"],
                end_time=data["end_time"],
                segment_size=data["segment_size"],
                files=data["files"],
                bytes=data.get("bytes", 0),
            )
        )
    return sorted(found, key=lambda b: b.end_lsn)


def archived_segments(dirs: HistoryDirs, segment_size: int) -> list[tuple[int, int, str]]:
    """(timeline, segment number, name) of every archived segment, in order."""
    if not dirs.wal.is_dir():
        return []
    segments, _ = wal_files(dirs.wal)
    return sorted((*parse_segment(n, segment_size), n) for n in segments)


def archived_bytes_since(dirs: HistoryDirs, base: Base) -> int:
    """The WAL archived after ``base``: what a rebuild from it would replay at most. Counted
    as the disk holds it: a segment completed early has its zero tail freed once shipped
    (``shared/holes.py``), and its few pages are what a replay reads of it."""
    first = base.end_lsn // base.segment_size
    total = 0
    for _, segno, name in archived_segments(dirs, base.segment_size):
        if segno > first:
            try:
                total += os.lstat(dirs.wal / name).st_blocks * 512  # never through a link
            except FileNotFoundError:
                continue
    return total


def history_bytes(dirs: HistoryDirs) -> int:
    """Bytes the branch's history takes on disk."""
    total = 0
    for top in (dirs.wal, dirs.bases):
        for root, _, names in os.walk(top):
            for name in names:
                with contextlib.suppress(FileNotFoundError):
                    total += os.lstat(os.path.join(root, name)).st_blocks * 512
    return total


def file_sha256(path: str | Path) -> str:
    """The sha256 of a file of a base state (root's, out of the tenant's reach)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:  # root's: base states
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def verify_base(base: Base) -> None:
    """Every file of the base state as it was taken, else ComputeError naming the first not."""
    for rel, expected in base.files.items():
        path = base.pgdata / rel
        try:
            actual = file_sha256(path)
        except OSError as exc:
            raise ComputeError(f"base state {base.path.name}: {rel} unreadable: {exc}") from exc
        if actual != expected:
            raise ComputeError(f"base state {base.path.name}: {rel} does not match its checksum")


def catalog_wal(dirs: HistoryDirs) -> dict[str, str]:
    """The sha256 of every archived segment: recorded when first seen, kept in ``wal.json``."""
    path = dirs.bases / WAL_SUMS
    try:
        sums: dict[str, str] = json.loads(path.read_bytes())  # root's: base/
    except FileNotFoundError:
        sums = {}
    present = set(os.listdir(dirs.wal)) if dirs.wal.is_dir() else set()
    fresh = {n for n in present - sums.keys() if not n.startswith(".")}
    for name in sorted(fresh):
        try:
            sums[name] = untrusted.sha256(untrusted.under(dirs.wal, name))
        except FileNotFoundError:
            continue
        except OSError as exc:  # a link, a FIFO: never catalogued, so never replayed
            log.warning("archived WAL %s of %s is not a plain file: %s", name, dirs.wal, exc)
    gone = sums.keys() - present
    for name in gone:
        del sums[name]
    if fresh or gone:
        ensure_dir(dirs.bases, 0o700)
        write_atomic(path, json.dumps(sums, sort_keys=True).encode())
    return sums


def _prune_wal(dirs: HistoryDirs, keep: list[Base]) -> None:
    """The archived WAL before the oldest base state kept (all of it when none is)."""
    if not dirs.wal.is_dir():
        return
    if not keep:
        for entry in dirs.wal.iterdir():
            entry.unlink(missing_ok=True)
        return
    size = keep[0].segment_size
    oldest = keep[0].start_lsn // size
    for _, segno, name in archived_segments(dirs, size):
        if segno < oldest:
            (dirs.wal / name).unlink(missing_ok=True)


def _thinned(bases: list[Base], spacing: Callable[[Base], int] | None) -> list[Base]:
    if spacing is None or len(bases) < 3:
        return bases
    kept = [bases[0]]
    for base in bases[1:-1]:
        if base.end_lsn - kept[-1].end_lsn >= spacing(kept[-1]):
            kept.append(base)
    return [*kept, bases[-1]]


def verify_wal(dirs: HistoryDirs, names: list[str]) -> None:
    """The archived segments ``names`` as they were first seen (the catalog taken first)."""
    sums = catalog_wal(dirs)
    for name in names:
        expected = sums.get(name)
        if expected is None:
            raise ComputeError(f"archived WAL segment {name} is missing")
        try:
            actual = untrusted.sha256(untrusted.under(dirs.wal, name))
        except OSError as exc:
            raise ComputeError(f"archived WAL segment {name} is unreadable: {exc}") from None
        if actual != expected:
            raise ComputeError(f"archived WAL segment {name} does not match its checksum")


def prune(
    dirs: HistoryDirs,
    retention_seconds: int,
    now_us: int,
    spacing: Callable[[Base], int] | None = None,
) -> int:
    """Free what the window no longer needs; the bytes freed.

    Kept: the base states that ended inside the window, the newest one that ended before it
    (points early in the window replay from it), and the WAL from the oldest kept base on.
    ``spacing``: the WAL (as LSNs) a kept base state is to be followed by before the next one
    kept; one closer is freed once a newer one is taken (the newest is always kept: a
    recovery's replay starts there). A window of 0 keeps nothing.
    """
    before = history_bytes(dirs)
    bases = list_bases(dirs)
    window_start = now_us - retention_seconds * 1_000_000
    if retention_seconds <= 0:
        keep: list[Base] = []
    else:
        inside = [b for b in bases if b.end_time > window_start]
        anchor = [b for b in bases if b.end_time <= window_start][-1:]
        keep = _thinned(anchor + inside, spacing)
    kept = {b.path for b in keep}
    for b in bases:
        if b.path not in kept:
            shutil.rmtree(b.path, ignore_errors=True)
    _prune_wal(dirs, keep)
    return max(0, before - history_bytes(dirs))

"""Copying a Postgres data directory for a new branch: only what a new cluster may inherit.

What is left out follows pg_basebackup (``basebackup.c``): the pid and options files of the
parent's postmaster, runtime state that Postgres rebuilds at start-up (``pg_dynshmem``,
``pg_notify``, ``pg_serial``, ``pg_snapshots``, ``pg_stat_tmp``, ``pg_subtrans``), replication
slots (a branch does not inherit its parent's subscribers), temporary files (``pgsql_tmp*``),
relation cache files (``pg_internal.init``), recovery signal files, and pgplane's marker. The
directories themselves are kept, empty, since Postgres expects them. ``pg_wal`` is copied
empty: the caller adds the segments that the copy needs, and only those (a cluster keeps up to
``max_wal_size`` of recycled segments that a copy would only carry along).

Each file is cloned (FICLONE: copy-on-write on btrfs and XFS, no data written at all), else
copied inside the kernel (copy_file_range), else read and written; the disk writes of a large
file start as soon as it is copied. Modes are kept, as ``cp -a`` keeps them (owners: below).
``cp -a`` is no faster: measured on 1 GB of data (ext4), both take the same time, and for a
fresh cluster both are dominated by creating ~1,300 inodes. Copying here rather than in a
``cp`` process lets an online copy tolerate files that vanish under it (a dropped table), leave
out unlogged relations and whatever a new cluster must not inherit, and copy ``pg_control``
last and whole.

The parent belongs to a tenant, who may be superuser on its compute and so own its files as
its OS user while root copies them. Every directory is therefore opened relative to its
parent's descriptor with ``O_NOFOLLOW`` and every file read through that descriptor: a
directory swapped for a link during the copy fails the copy rather than leading it out of the
tree, and anything but a directory or regular file is refused (a FIFO would block the read).
The copy itself stays root's, out of the tenant's reach, until the caller hands it over whole
(ownership.py); only the modes are copied here.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import secrets
import stat
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from pgplane.compute.driver import ComputeError
from pgplane.compute.local.copies.spares import SparePool
from pgplane.compute.local.files import start_writeback
from pgplane.compute.local.layout import TIMELINE_MARKER

# linux/fs.h: _IOW(0x94, 9, int)
_FICLONE = 0x40049409
# The filesystem (or the kernel) cannot clone or copy_file_range between these two files.
_UNSUPPORTED = frozenset({errno.EOPNOTSUPP, errno.ENOTTY, errno.EXDEV, errno.EINVAL, errno.ENOSYS})
_CHUNK = 1 << 30
# Smaller files are left to the final sync: one call each would cost more than it saves.
_WRITEBACK_FROM = 1 << 20

# Runtime state Postgres rebuilds at start-up, slots, and WAL: the directory without its content.
EMPTIED_DIRS = frozenset(
    {
        "pg_dynshmem",
        "pg_notify",
        "pg_replslot",
        "pg_serial",
        "pg_snapshots",
        "pg_stat_tmp",
        "pg_subtrans",
        "pg_wal",
    }
)
SKIPPED_FILES = frozenset(
    {
        "postmaster.pid",
        "postmaster.opts",
        "standby.signal",
        "recovery.signal",
        "postgresql.auto.conf.tmp",
        "current_logfiles.tmp",
        TIMELINE_MARKER,
        f".{TIMELINE_MARKER}.tmp",
    }
)
BACKUP_FILES = ("backup_label", "tablespace_map")
_SKIPPED_PREFIXES = ("pgsql_tmp", "pg_internal.init")
# A relation's files: <relfilenode>[_<fork>][.<segment>].
_RELATION_FILE = re.compile(r"(\d+)(?:_(fsm|vm|init))?(?:\.\d+)?")


class CopyCancelled(Exception):
    """The copy was asked to stop (its caller was cancelled)."""


@dataclass(slots=True)
class CopyStats:
    files: int = 0
    dirs: int = 0
    bytes: int = 0
    vanished: list[str] = field(default_factory=list)
    # Where the copy is consistent (an online copy: its backup's start and end), when known.
    start_lsn: int = 0
    end_lsn: int = 0
    segment_size: int = 0


def can_clone(directory: Path) -> bool:
    """Whether files made in ``directory`` (root's) can be clones: one block tried on a pair of
    throw-away files there."""
    if sys.platform != "linux":
        return False
    src = directory / f".clone-probe-{secrets.token_hex(4)}"
    dst = src.with_name(f"{src.name}-copy")
    try:
        fin = os.open(src, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fin, bytes(4096))
            fout = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            try:
                fcntl.ioctl(fout, _FICLONE, fin)
            finally:
                os.close(fout)
        finally:
            os.close(fin)
    except OSError:
        return False
    finally:
        src.unlink(missing_ok=True)
        dst.unlink(missing_ok=True)
    return True


def copy_data_dir(
    src: Path,
    dst: Path,
    *,
    online: bool,
    keep_backup_label: bool,
    cancel: threading.Event,
    spares: SparePool | None = None,
) -> CopyStats:
    """Copy the data directory ``src`` to the new directory ``dst``, without WAL segments.

    ``online``: a postmaster runs on ``src`` (inside pg_backup_start/stop), so files may vanish
    or change during the copy; WAL replay from the backup's start repairs what changed, and the
    unlogged relations, reset by that replay anyway, are left out but for their init fork.
    ``keep_backup_label``: ``src`` is itself a copy that was never started, whose backup_label
    (and tablespace_map) its recovery still needs. ``cancel`` set: stop before the next file.
    ``spares``: files and directories made ahead, used before creating any.
    """
    copier = _Copier(online=online, cancel=cancel, spares=spares)
    skipped = SKIPPED_FILES if keep_backup_label else SKIPPED_FILES | set(BACKUP_FILES)
    src_fd = open_dir(src)
    try:
        copier.make_dir(src_fd, dst)
        copier.tree(src_fd, dst, rel="", skipped=skipped)
        # Last, as pg_basebackup sends it; read until two reads agree, so that a write by the
        # checkpointer during the read cannot leave a torn (CRC-failing) control file.
        global_fd = open_dir("global", dir_fd=src_fd)
        try:
            copier.stable_file(global_fd, "pg_control", dst / "global" / "pg_control")
        finally:
            os.close(global_fd)
    finally:
        os.close(src_fd)
    return copier.stats


def copy_files(
    src_dir: Path,
    dst_dir: Path,
    names: list[str],
    *,
    cancel: threading.Event,
    spares: SparePool | None = None,
) -> CopyStats:
    """Copy the named files of ``src_dir`` (WAL segments, say) into the existing ``dst_dir``."""
    copier = _Copier(online=False, cancel=cancel, spares=spares)
    src_fd = open_dir(src_dir)
    try:
        for name in names:
            copier.file(src_fd, name, str(dst_dir / name))
    finally:
        os.close(src_fd)
    return copier.stats


def open_dir(path: Path | str, *, dir_fd: int | None = None) -> int:
    """A descriptor of the directory ``path`` (relative to ``dir_fd``), never through a link."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(path, flags, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise ComputeError(f"cannot copy {path}: not a directory (a link?)") from exc
        raise


def open_regular_file(name: str, *, dir_fd: int | None = None) -> int:
    """A descriptor for reading the regular file ``name``: never a link, FIFO or device."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ComputeError(f"cannot copy {name}: a symbolic link") from exc
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ComputeError(f"cannot copy {name}: not a regular file")
    return fd


class _Copier:
    def __init__(
        self,
        *,
        online: bool,
        cancel: threading.Event,
        spares: SparePool | None,
    ) -> None:
        self.online = online
        self._cancel = cancel
        self._spares = spares
        self.stats = CopyStats()
        self._clone = sys.platform == "linux"
        self._copy_range = hasattr(os, "copy_file_range")  # not on macOS

    def make_dir(self, src_fd: int, dst: Path | str) -> None:
        st = os.fstat(src_fd)
        if self._spares is None or not self._spares.place_dir(os.fspath(dst)):
            os.mkdir(dst, 0o700)
        os.chmod(dst, stat.S_IMODE(st.st_mode))  # mkdir's mode went through the umask
        self.stats.dirs += 1

    def _subdir(self, dir_fd: int, name: str) -> int | None:
        try:
            return open_dir(name, dir_fd=dir_fd)
        except FileNotFoundError:
            if self.online:
                return None  # a database dropped during the copy: replay drops it too
            raise

    def tree(self, src_fd: int, dst: Path | str, *, rel: str, skipped: frozenset[str]) -> None:
        with os.scandir(src_fd) as it:
            entries = list(it)
        unlogged = _unlogged_relations(entries) if self.online else frozenset()
        top = not rel
        for entry in entries:
            name = entry.name
            target = os.path.join(dst, name)
            if name.startswith(_SKIPPED_PREFIXES) or (top and name in skipped):
                continue
            if entry.is_symlink():
                # pgplane never makes any; one in pg_tblspc is a tablespace, whose data lives
                # elsewhere and would end up shared between the parent and the branch.
                raise ComputeError(f"cannot branch {rel}/{name}: a symbolic link (tablespace?)")
            if entry.is_dir(follow_symlinks=False):
                sub_fd = self._subdir(src_fd, name)
                if sub_fd is None:
                    continue
                try:
                    self.make_dir(sub_fd, target)
                    if top and name in EMPTIED_DIRS:
                        if name == "pg_wal":  # archive_status (and summaries in 17) must exist
                            self._skeleton(sub_fd, target)
                        continue
                    self.tree(sub_fd, target, rel=f"{rel}/{name}", skipped=skipped)
                finally:
                    os.close(sub_fd)
            elif entry.is_file(follow_symlinks=False):
                if unlogged and _is_unlogged_data(name, unlogged):
                    continue
                if rel == "/global" and name == "pg_control":
                    continue  # copied last
                self.file(src_fd, name, target)
            else:
                raise ComputeError(f"cannot branch {rel}/{name}: not a file or directory")

    def _skeleton(self, src_fd: int, dst: str) -> None:
        """The subdirectories of ``src_fd`` under ``dst``, recursively, without any file."""
        with os.scandir(src_fd) as it:
            subdirs = [e.name for e in it if e.is_dir(follow_symlinks=False)]
        for name in subdirs:
            sub_fd = self._subdir(src_fd, name)
            if sub_fd is None:
                continue
            try:
                target = os.path.join(dst, name)
                self.make_dir(sub_fd, target)
                self._skeleton(sub_fd, target)
            finally:
                os.close(sub_fd)

    def file(self, dir_fd: int, name: str, dst: str) -> None:
        if self._cancel.is_set():
            raise CopyCancelled
        try:
            fin = open_regular_file(name, dir_fd=dir_fd)
        except FileNotFoundError:
            if self.online:
                self.stats.vanished.append(name)
                return
            raise
        try:
            st = os.fstat(fin)
            if self._spares is not None and self._spares.place_file(dst):
                fout = os.open(dst, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            else:
                fout = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                self._data(fin, fout)
                if st.st_size >= _WRITEBACK_FROM:
                    start_writeback(fout)
                if stat.S_IMODE(st.st_mode) != 0o600:
                    os.fchmod(fout, stat.S_IMODE(st.st_mode))
            finally:
                os.close(fout)
        finally:
            os.close(fin)
        self.stats.files += 1
        self.stats.bytes += st.st_size

    def stable_file(self, dir_fd: int, name: str, dst: Path) -> None:
        fd = open_regular_file(name, dir_fd=dir_fd)
        try:
            data = _read_all(fd)
            for _ in range(100):
                again = _read_all(fd)
                if again == data:
                    break
                data = again
            else:
                raise ComputeError(f"{name} kept changing while it was read")
            mode = stat.S_IMODE(os.fstat(fd).st_mode)
        finally:
            os.close(fd)
        out = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.write(out, data)
            os.fchmod(out, mode)
        finally:
            os.close(out)
        self.stats.files += 1
        self.stats.bytes += len(data)

    def _data(self, fin: int, fout: int) -> None:
        if self._clone:
            try:
                fcntl.ioctl(fout, _FICLONE, fin)
            except OSError as exc:
                if exc.errno not in _UNSUPPORTED:
                    raise
                self._clone = False  # not on this filesystem: do not ask again for every file
            else:
                return
        if self._copy_range:
            try:
                while os.copy_file_range(fin, fout, _CHUNK):
                    pass
            except OSError as exc:
                if exc.errno not in _UNSUPPORTED:
                    raise
                self._copy_range = False  # the file offsets tell where the fallback resumes
            else:
                return
        while chunk := os.read(fin, 1 << 20):
            view = memoryview(chunk)
            while view:
                view = view[os.write(fout, view) :]


def _read_all(fd: int) -> bytes:
    chunks = []
    offset = 0
    while chunk := os.pread(fd, 1 << 16, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def _unlogged_relations(entries: list[os.DirEntry[str]]) -> frozenset[str]:
    """Relfilenodes with an init fork in this directory: the unlogged relations."""
    return frozenset(e.name[: -len("_init")] for e in entries if e.name.endswith("_init"))


def _is_unlogged_data(name: str, unlogged: frozenset[str]) -> bool:
    match = _RELATION_FILE.fullmatch(name)
    return match is not None and match.group(1) in unlogged and match.group(2) != "init"

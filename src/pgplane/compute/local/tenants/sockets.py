"""An endpoint's socket directory: as root, a small filesystem of its own.

Besides its branch's files (its disk share, :mod:`.volumes`), the only place a compute writes
is the directory of its unix socket, which Postgres must be able to create files in (its socket
and the socket's lock file). On the data directory's disk, a tenant holding its compute's OS
user could fill that disk from there; on a tmpfs of 1 MiB (and a few inodes), mounted for the
compute's life, it fills 1 MiB of memory at most. Mounted with mount(2) itself: a wake pays
about 0.1 ms for it, where the ``mount`` program costs milliseconds.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import shutil
from pathlib import Path

from pgplane.compute.local.tenants.user import RunAs

SOCKET_DIR_BYTES = 1 << 20
_INODES = 64
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 2, 4, 8
_MNT_DETACH = 2
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def make_socket_dir(path: Path, run_as: RunAs, *, own_filesystem: bool) -> None:
    """The endpoint's socket directory, its user's, 0700; on a tmpfs of its own when asked."""
    path.mkdir(mode=0o700, exist_ok=True)
    if own_filesystem and not os.path.ismount(path):
        options = f"size={SOCKET_DIR_BYTES},nr_inodes={_INODES},mode=0700"
        options += f",uid={run_as.uid},gid={run_as.gid}"
        flags = _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
        if _libc.mount(b"tmpfs", os.fsencode(path), b"tmpfs", flags, options.encode()) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"mounting a tmpfs on {path}: {os.strerror(err)}")
        return
    path.chmod(0o700)
    run_as.chown(path)


def remove_socket_dir(path: Path) -> None:
    """Unmount (lazily: a connection may still hold its socket) and remove it (blocking)."""
    if os.path.ismount(path):
        _libc.umount2(os.fsencode(path), _MNT_DETACH)
    shutil.rmtree(path, ignore_errors=True)

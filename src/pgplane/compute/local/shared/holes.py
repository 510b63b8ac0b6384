"""A completed WAL segment's zero tail given back to the disk.

A segment completed early (``pg_switch_wal``, which the shipping rounds call every couple of
seconds to bound what a lost machine loses) is zero-filled to its full size by Postgres, and
archiving links it as it is: 16 MiB on the disk for a few kilobytes of WAL, in the project's
own disk share, kept for the whole history window. The zeros after its last written page are
punched out (``fallocate(PUNCH_HOLE | KEEP_SIZE)``): the file keeps its size and reads back the
same bytes (a hole reads as zeros), so its checksum, its replay and what was shipped are
unchanged; only the blocks go. Postgres never writes a completed segment again
(``wal_recycle=off``), and the file is reached as every tenant file is (``untrusted``): no link
followed, no FIFO opened, a regular file only.
"""

from __future__ import annotations

import ctypes
import os

from pgplane.compute.local.tenants import untrusted

_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02
_PAGE = 8192  # Postgres' WAL page: the tail freed starts on one
_CHUNK = 1 << 16
_libc = ctypes.CDLL(None, use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]


def free_zero_tail(path: untrusted.TenantPath) -> int:
    """Punch out the all-zero pages at the end of the file; the bytes freed (0 where the
    filesystem cannot, or there were none). Blocking."""
    fd = untrusted.open_regular(path, writable=True)
    try:
        size = os.fstat(fd).st_size
        end = _data_end(fd, size)
        keep = -(-end // _PAGE) * _PAGE
        if size - keep < _PAGE:
            return 0
        if _libc.fallocate(fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, keep, size - keep):
            return 0  # not supported here (EOPNOTSUPP): the zeros stay, as they were
        return size - keep
    finally:
        os.close(fd)


def _data_end(fd: int, size: int) -> int:
    """The offset after the file's last non-zero byte, read backwards from its end."""
    end = size
    while end > 0:
        start = max(0, end - _CHUNK)
        data = os.pread(fd, end - start, start)
        kept = data.rstrip(b"\0")
        if kept:
            return start + len(kept)
        end = start
    return 0

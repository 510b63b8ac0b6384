"""The one way root reads a file that a tenant can write.

A tenant may hold its compute's OS user (DESIGN §6), so anything in its data directory, its WAL
archive or a log its postmaster writes may be a link to another account's file, a FIFO that
blocks its reader until someone opens the other end, a device, or gigabytes. Root reads such a
file only here:

- opened from a directory the platform made and named (the *anchor*: a branch directory, a data
  directory, a log directory), one component at a time, never following a link on the way
  (``O_NOFOLLOW`` on each, ``O_DIRECTORY`` on all but the last): a tenant's ``pg_wal`` made a
  link to another project's leads nowhere;
- opened with ``O_NONBLOCK`` and checked with ``fstat`` to be a regular file before a byte is
  read, so a FIFO or a device is refused at once;
- read up to a bound the caller names (hashing reads in chunks, any size, off the loop);
- never on the event loop: the ``a``-prefixed forms run in a thread.

What root does not do with tenant data at all is here too, as a rule rather than code: it never
removes, chowns or writes a path it *took from* tenant data (a pid file's socket directory, a
link's target); every path it acts on comes from :mod:`..layout` and the platform's records.
``tests/unit/test_tenant_reads.py`` finds any other read of a file under ``compute/local``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

_HASH_CHUNK = 1 << 20
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class UntrustedFileError(OSError):
    """A tenant's file that is not a plain readable file of a sane size."""


@dataclass(frozen=True, slots=True)
class TenantPath:
    """A file below a platform-made directory (``anchor``) whose lower parts a tenant controls."""

    anchor: Path
    rel: str

    def __truediv__(self, name: str) -> TenantPath:
        return TenantPath(self.anchor, f"{self.rel}/{name}" if self.rel else name)

    def __str__(self) -> str:
        return str(self.anchor / self.rel)

    @property
    def name(self) -> str:
        return self.rel.rsplit("/", 1)[-1]


def under(anchor: Path, rel: str = "") -> TenantPath:
    return TenantPath(anchor, rel.strip("/"))


def open_regular(path: TenantPath, *, writable: bool = False) -> int:
    """A descriptor of the regular file at ``path``, reached without following any link
    (``writable``: for a change that keeps its bytes, as freeing a segment's zero tail)."""
    parts = [p for p in path.rel.split("/") if p]
    if not parts or any(p in (".", "..") for p in parts):
        raise UntrustedFileError(f"{path}: not a file below its anchor")
    fd = os.open(path.anchor, _DIR_FLAGS)
    try:
        for part in parts[:-1]:
            next_fd = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = next_fd
        flags = (_FILE_FLAGS & ~os.O_ACCMODE) | os.O_RDWR if writable else _FILE_FLAGS
        file_fd = os.open(parts[-1], flags, dir_fd=fd)
    finally:
        os.close(fd)
    if not stat.S_ISREG(os.fstat(file_fd).st_mode):
        os.close(file_fd)
        raise UntrustedFileError(f"{path} is not a regular file")
    return file_fd


def read_bytes(path: TenantPath, limit: int) -> bytes:
    """The whole file, refused when it holds more than ``limit`` bytes."""
    fd = open_regular(path)
    try:
        data = os.read(fd, limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise UntrustedFileError(f"{path} is larger than {limit} bytes")
    return data


def read_tail(path: TenantPath, size: int) -> bytes:
    """At most the last ``size`` bytes (a log a tenant may have filled)."""
    fd = open_regular(path)
    try:
        end = os.fstat(fd).st_size
        return os.pread(fd, size, max(0, end - size))
    finally:
        os.close(fd)


def read_text(path: TenantPath, limit: int) -> str:
    return read_bytes(path, limit).decode(errors="replace")


def sha256(path: TenantPath) -> str:
    """The file's sha256, read in chunks (WAL segments are megabytes)."""
    fd = open_regular(path)
    digest = hashlib.sha256()
    try:
        while chunk := os.read(fd, _HASH_CHUNK):
            digest.update(chunk)
    finally:
        os.close(fd)
    return digest.hexdigest()


def text_or_empty(path: TenantPath, limit: int) -> str:
    """The tail of a log for an error message: "" when it cannot be read safely."""
    with contextlib.suppress(OSError):
        return read_tail(path, limit).decode(errors="replace")
    return ""


async def aread_text(path: TenantPath, limit: int) -> str:
    return await asyncio.to_thread(read_text, path, limit)


async def atext_or_empty(path: TenantPath, limit: int) -> str:
    return await asyncio.to_thread(text_or_empty, path, limit)

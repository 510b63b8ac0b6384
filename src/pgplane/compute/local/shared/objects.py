"""The seam to shared storage: named objects, each written whole or not at all.

What moves between nodes (the cold archive, each branch's shipped history) is kept as objects
under ``/``-separated keys, the operations an S3-compatible object store offers (put, get,
head, list, delete), so that one could sit behind :class:`ObjectStore` later. Here it is a
directory every node reaches (:class:`DirectoryStore`: NFS in real life, one directory in the
tests).

Shared storage is root's (0700) and no tenant's compute reaches it, but what is read back is
treated as untrusted input all the same, as a disk that another machine writes: every
directory and file is opened without following a link (``O_NOFOLLOW`` at each component, from
the root's descriptor), a FIFO or device is refused without blocking, every read is bounded by
a size the caller names, and every object comes back with its sha256 so the caller checks it
against what it recorded.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import hashlib
import os
import re
import secrets
import shutil
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO, Protocol, TypeVar

from pgplane.compute.driver import ComputeError

T = TypeVar("T")

_CHUNK = 1 << 20
_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_ID_NAME = "pgplane-storage.id"


# Threads of their own for storage calls: a store that hangs (an object store that stopped
# answering, NFS gone) holds these, never the event loop's default executor, on which every
# file operation of the platform runs (it has only cores + 4 threads).
#
# They run niced: what they do is background work (packing, sealing and uploading base states
# and segments, the store's copy), and on a node the computes' own work comes first. Linux
# keeps a nice value per thread, and the platform's threads compete with the computes'
# cgroups each by its own weight, so a packing thread takes a core from no compute's query.
_NICE = 10


def _background() -> None:
    with contextlib.suppress(OSError, AttributeError):  # not where threads have no nice value
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), _NICE)


_IO = concurrent.futures.ThreadPoolExecutor(
    max_workers=8, thread_name_prefix="shared-storage", initializer=_background
)


async def off_loop(fn: Callable[..., T], /, *args: object) -> T:
    """``fn(*args)``, a blocking call to shared or object storage, on the storage's threads."""
    return await asyncio.get_running_loop().run_in_executor(_IO, functools.partial(fn, *args))


class Written:
    """What a read or write moved: its size and sha256."""

    __slots__ = ("sha256", "size")

    def __init__(self, size: int, sha256: str) -> None:
        self.size = size
        self.sha256 = sha256


class Unreachable(ComputeError):
    """The store did not answer as a store does (no connection, a timeout, its own 5xx): it
    may later. Every other error is its answer (wrong credentials, no bucket, a quota)."""


class ObjectStore(Protocol):
    """Objects under keys; every method blocks (callers run them off the event loop)."""

    @property
    def identity(self) -> str:
        """An id the storage itself holds: two nodes that read the same one share it."""
        ...

    def write(self, key: str, source: BinaryIO, *, max_bytes: int) -> Written:
        """Store what ``source`` holds (at most ``max_bytes``) as ``key``, replacing any
        object of that key only once it is all durable."""
        ...

    def write_bytes(self, key: str, data: bytes, *, replace: bool = True) -> Written:
        """Store ``data`` as ``key``; with ``replace=False`` an object already there stays."""
        ...

    def read(self, key: str, sink: BinaryIO, *, max_bytes: int) -> Written:
        """Copy the object into ``sink``; ComputeError past ``max_bytes``, FileNotFoundError
        when there is none."""
        ...

    def read_bytes(self, key: str, *, max_bytes: int) -> bytes: ...

    def exists(self, key: str) -> bool: ...

    def sizes(self, prefix: str) -> dict[str, int]:
        """Every object under ``prefix``, by key (sorted), with the bytes it takes there."""
        ...

    def delete(self, prefix: str) -> None:
        """The object ``prefix``, or every object under it; nothing when there is none."""
        ...


def check_key(key: str) -> list[str]:
    """A key's parts, each a name that can be written only one way (no ``.``, ``..``, empty
    parts or leading dots: temporaries start with one)."""
    parts = key.split("/")
    if not parts or any(_PART.fullmatch(p) is None or ".." in p for p in parts):
        raise ComputeError(f"invalid shared storage key {key!r}")
    return parts


def read_or_make_identity(store: ObjectStore) -> str:
    """The id the storage holds (``pgplane-storage.id``), made on first use. Two nodes starting
    together on new storage: the first write stays (``replace=False``), and each reads back
    the one that won."""
    with contextlib.suppress(FileNotFoundError):
        return store.read_bytes(_ID_NAME, max_bytes=128).decode().strip()
    store.write_bytes(_ID_NAME, secrets.token_hex(16).encode(), replace=False)
    return store.read_bytes(_ID_NAME, max_bytes=128).decode().strip()


class DirectoryStore:
    """Objects as files under a directory (root's, 0700), each renamed into place whole."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._identity: str | None = None

    @property
    def identity(self) -> str:
        if self._identity is None:
            self._identity = self._read_or_make_identity()
        return self._identity

    def _read_or_make_identity(self) -> str:
        self._prepare_root()
        return read_or_make_identity(self)

    def _prepare_root(self) -> None:
        with contextlib.suppress(FileExistsError):
            os.makedirs(self.root, mode=0o700)
        st = os.lstat(self.root)
        if not stat.S_ISDIR(st.st_mode):
            raise ComputeError(f"shared storage {self.root} is not a directory")
        if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o077:
            # The platform's alone: no compute user may list, read or plant anything there.
            os.chown(self.root, os.geteuid(), os.getegid(), follow_symlinks=False)
            os.chmod(self.root, 0o700, follow_symlinks=False)

    # -- writing --------------------------------------------------------------------------------

    def write(self, key: str, source: BinaryIO, *, max_bytes: int) -> Written:
        return self._put(key, _chunks(source, max_bytes, key), replace=True)

    def write_bytes(self, key: str, data: bytes, *, replace: bool = True) -> Written:
        return self._put(key, iter((data,)), replace=replace)

    def _put(self, key: str, chunks: Iterator[bytes], *, replace: bool) -> Written:
        parts = check_key(key)
        with self._dir(parts[:-1], create=True) as dfd:
            name = parts[-1]
            _remove_temporaries(dfd, name)
            tmp = f".{name}.tmp-{secrets.token_hex(4)}"
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(tmp, flags, 0o600, dir_fd=dfd)
            try:
                digest, size = hashlib.sha256(), 0
                with open(fd, "wb", closefd=False) as out:  # root's: made here, O_EXCL
                    for chunk in chunks:
                        digest.update(chunk)
                        size += len(chunk)
                        out.write(chunk)
                os.fsync(fd)
                if replace:
                    os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
                else:  # the first one stays (a link fails where the name exists)
                    with contextlib.suppress(FileExistsError):
                        os.link(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)
                    os.unlink(tmp, dir_fd=dfd)
                os.fsync(dfd)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=dfd)
                raise
            finally:
                os.close(fd)
        return Written(size, digest.hexdigest())

    # -- reading --------------------------------------------------------------------------------

    def read(self, key: str, sink: BinaryIO, *, max_bytes: int) -> Written:
        digest, size = hashlib.sha256(), 0
        with self._file(key) as fd:
            while chunk := os.read(fd, _CHUNK):
                size += len(chunk)
                if size > max_bytes:
                    raise ComputeError(f"shared object {key} is larger than {max_bytes} bytes")
                digest.update(chunk)
                sink.write(chunk)
        return Written(size, digest.hexdigest())

    def read_bytes(self, key: str, *, max_bytes: int) -> bytes:
        with self._file(key) as fd:
            data = os.read(fd, max_bytes + 1)
        if len(data) > max_bytes:
            raise ComputeError(f"shared object {key} is larger than {max_bytes} bytes")
        return data

    def exists(self, key: str) -> bool:
        parts = check_key(key)
        try:
            with self._dir(parts[:-1], create=False) as dfd:
                st = os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False)
        except (FileNotFoundError, NotADirectoryError):
            return False
        return stat.S_ISREG(st.st_mode)

    def sizes(self, prefix: str) -> dict[str, int]:
        parts = check_key(prefix)
        found: dict[str, int] = {}
        try:
            with self._dir(parts, create=False) as dfd:
                _walk(dfd, prefix, found)
        except (FileNotFoundError, NotADirectoryError):
            return {}
        return dict(sorted(found.items()))

    def delete(self, prefix: str) -> None:
        parts = check_key(prefix)
        try:
            with self._dir(parts[:-1], create=False) as dfd:
                try:
                    st = os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False)
                except FileNotFoundError:
                    return
                if stat.S_ISDIR(st.st_mode):
                    # rmtree with a dir_fd never follows a link it meets.
                    shutil.rmtree(parts[-1], dir_fd=dfd)
                else:
                    os.unlink(parts[-1], dir_fd=dfd)
                os.fsync(dfd)
        except (FileNotFoundError, NotADirectoryError):
            return

    # -- descriptors ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def _dir(self, parts: list[str], *, create: bool) -> Iterator[int]:
        """The directory ``parts`` below the root, reached without following a link."""
        if create:
            self._prepare_root()
        fd = os.open(self.root, _DIR_FLAGS)
        try:
            for part in parts:
                if create:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, 0o700, dir_fd=fd)
                next_fd = os.open(part, _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = next_fd
            yield fd
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def _file(self, key: str) -> Iterator[int]:
        parts = check_key(key)
        try:
            with self._dir(parts[:-1], create=False) as dfd:
                fd = os.open(parts[-1], _FILE_FLAGS, dir_fd=dfd)
        except NotADirectoryError:
            raise FileNotFoundError(key) from None
        except OSError as exc:
            if isinstance(exc, FileNotFoundError):
                raise
            raise ComputeError(f"shared object {key} cannot be read: {exc}") from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ComputeError(f"shared object {key} is not a regular file")
            yield fd
        finally:
            os.close(fd)


def _chunks(source: BinaryIO, max_bytes: int, key: str) -> Iterator[bytes]:
    size = 0
    while chunk := source.read(_CHUNK):
        size += len(chunk)
        if size > max_bytes:
            raise ComputeError(f"{key}: more than {max_bytes} bytes to store")
        yield chunk


def _walk(dfd: int, prefix: str, found: dict[str, int]) -> None:
    for entry in sorted(os.listdir(dfd)):
        if entry.startswith(".") or _PART.fullmatch(entry) is None:
            continue  # a temporary, or nothing of ours
        st = os.stat(entry, dir_fd=dfd, follow_symlinks=False)
        if stat.S_ISREG(st.st_mode):
            found[f"{prefix}/{entry}"] = st.st_blocks * 512
        elif stat.S_ISDIR(st.st_mode):
            sub = os.open(entry, _DIR_FLAGS, dir_fd=dfd)
            try:
                _walk(sub, f"{prefix}/{entry}", found)
            finally:
                os.close(sub)


def _remove_temporaries(dfd: int, name: str) -> None:
    """What a crash left of an earlier write of ``name``."""
    for entry in os.listdir(dfd):
        if entry.startswith(f".{name}.tmp-"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry, dir_fd=dfd)

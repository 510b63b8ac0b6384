"""Reading a cold archive back into a tree: the extraction behind ``archive.unpack``.

The archive is untrusted input until it has matched its manifest: every member is checked
against the manifest before a byte of it is written, and every file's data against its size
and sha256 as it is written.

Two threads share the work, because on a large tree (a recovery's base state of a GB, a
reattach) each half took about as long as the other: this one decompresses the archive and
reads its tar headers, making the checks and the directories; a writer hashes and writes each
file's data (the decompressors, sha256 and write(2) release the GIL, so the two overlap on two
cores). A GB of pgbench's tables took 4.6 s in one thread from gzip, 2.7 s in two, and 1.9 s
from zstandard (``bench.object_store`` prints a recovery's share of it).
"""

from __future__ import annotations

import hashlib
import io
import os
import posixpath
import queue
import tarfile
import threading
import zlib
from pathlib import Path
from typing import BinaryIO

import zstandard

from pgplane.compute.driver import ComputeError
from pgplane.compute.local.cold.manifest import FileEntry, Manifest, _is_safe_path
from pgplane.compute.local.files import start_writeback

# Smaller files are left to the final sync (as in datacopy).
_WRITEBACK_FROM = 1 << 20
_CHUNK = 1 << 20
# tarfile's stream mode joins what it reads into each of its buffers: larger ones, fewer
# joins (64 KiB cost a third of a GB's extraction more than 1 MiB).
_TAR_BUFFER = 1 << 20
# Compressed bytes read at once, and the most one inflate call returns (unbounded, a MiB of
# zero-filled pages inflated into a buffer regrown ~16 times: 2.5x the time of the inflate).
_READ = 256 << 10
# Chunks queued for the writer: at most this many MiB held while it catches up.
_QUEUE = 4


def extract(
    src: Path, archive: Path, root: Path, manifest: Manifest, owner: tuple[int, int] | None
) -> None:
    """Extract ``archive`` (of the archive directory ``src``, named in errors) into the empty
    directory ``root``: what ``manifest`` lists, as it lists it, or ComputeError. The files are
    ``owner``'s when given. OSError, EOFError, zlib.error, zstandard.ZstdError and
    tarfile.TarError propagate."""
    with archive.open("rb") as raw:  # root's: the archive directory is made by root
        _Restore(src, root, manifest, owner).run(tar_stream(raw, manifest.format))


def tar_stream(raw: BinaryIO, format_: int) -> BinaryIO:
    """The tar an archive of this format compresses, read back a bounded amount at a time
    (never one inflate of all a run of zeros holds)."""
    if format_ == 1:
        return io.BufferedReader(_Inflater(raw), _TAR_BUFFER)
    reader = zstandard.ZstdDecompressor().stream_reader(raw, read_size=_READ, closefd=False)
    return io.BufferedReader(reader, _TAR_BUFFER)


class _Restore:
    """One extraction into ``root``: what the manifest lists, as it lists it, or an error."""

    def __init__(
        self, src: Path, root: Path, manifest: Manifest, owner: tuple[int, int] | None
    ) -> None:
        self.src = src
        self.root = root
        self.owner = owner
        self.dirs = {entry.path: entry for entry in manifest.dirs}
        self.files = {entry.path: entry for entry in manifest.files}
        self.links = {entry.path: entry for entry in manifest.symlinks}
        self.seen: set[str] = set()
        self.made_dirs: dict[str, int] = {}  # path: mtime, in archive order (parents first)
        self.made_links: dict[str, int] = {}

    def run(self, stream: BinaryIO) -> None:
        writer = _Writer(self.owner)
        try:
            with tarfile.open(fileobj=stream, mode="r|", bufsize=_TAR_BUFFER) as tar:
                for member in tar:
                    self._place(tar, member, writer)
        finally:
            writer.close()  # joined before anything else is done to the tree (or it is removed)
        writer.raise_failure()
        missing = sorted((self.dirs.keys() | self.files.keys() | self.links.keys()) - self.seen)
        if missing:
            raise ComputeError(
                f"archive {self.src} lacks {len(missing)} entries of its manifest, "
                f"such as {missing[0]!r}"
            )
        # Links last: until then no path can lead through one.
        for name, mtime in self.made_links.items():
            path = self.root / name
            os.symlink(self.links[name].target, path)
            if self.owner is not None:
                os.lchown(path, *self.owner)
            os.utime(path, (mtime, mtime), follow_symlinks=False)
        # Children before their parents: a directory's mode may forbid writing into it.
        for name, mtime in reversed(self.made_dirs.items()):
            path = self.root / name
            if self.owner is not None:
                os.chown(path, *self.owner)
            os.chmod(path, self.dirs[name].mode)
            os.utime(path, (mtime, mtime))

    def _place(self, tar: tarfile.TarFile, member: tarfile.TarInfo, writer: _Writer) -> None:
        name = member.name
        if name != "." and not _is_safe_path(name):
            raise self._refuse(member, "has an unsafe path")
        if name in self.seen:
            raise self._refuse(member, "appears twice")
        self.seen.add(name)
        # Each parent is a directory made here, so nothing is written through a link.
        if name != "." and (posixpath.dirname(name) or ".") not in self.made_dirs:
            raise self._refuse(member, "comes before its directory")
        if member.isdir():
            entry = self.dirs.get(name)
            if entry is None or member.mode != entry.mode:
                raise self._refuse(member, "does not match the manifest")
            if name != ".":
                os.mkdir(self.root / name, 0o700)
            self.made_dirs[name] = int(member.mtime)
        elif member.type in (tarfile.REGTYPE, tarfile.AREGTYPE):
            self._place_file(tar, member, writer)
        elif member.issym():
            link = self.links.get(name)
            if link is None or member.linkname != link.target:
                raise self._refuse(member, "does not match the manifest")
            self.made_links[name] = int(member.mtime)
        else:
            raise self._refuse(member, "is not a regular file, directory or symlink")

    def _place_file(self, tar: tarfile.TarFile, member: tarfile.TarInfo, writer: _Writer) -> None:
        file = self.files.get(member.name)
        if file is None or (member.size, member.mode) != (file.size, file.mode):
            raise self._refuse(member, "does not match the manifest")
        source = tar.extractfile(member)
        if source is None:
            raise self._refuse(member, "has no data")
        with source:
            writer.begin(_File(self.root / member.name, file, member.mtime))
            while chunk := source.read(_CHUNK):
                writer.write(chunk)
            writer.end()

    def _refuse(self, member: tarfile.TarInfo, why: str) -> ComputeError:
        return ComputeError(f"archive {self.src}: member {member.name!r} {why}")


class _Inflater(io.RawIOBase):
    """A gzip archive's data (format 1; one member or several, as gzip allows), at most
    ``len(b)`` bytes a read: gzip's reader (and tarfile's "r|gz") return unbounded chunks, and
    a run of zeros (an archived WAL segment) inflates to one regrown buffer after another.
    Each member's CRC and length are checked by zlib; a truncated archive is an EOFError,
    damage a zlib.error."""

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        self._inflate = zlib.decompressobj(zlib.MAX_WBITS | 16)
        self._pending = b""

    def readable(self) -> bool:
        return True

    def readinto(self, b: memoryview) -> int:  # type: ignore[override]
        while True:
            if self._inflate.eof:  # a member ended: another one, or the end of the archive
                rest = self._inflate.unused_data or self._raw.read(_READ)
                if not rest:
                    return 0
                self._inflate = zlib.decompressobj(zlib.MAX_WBITS | 16)
                self._pending = rest
            elif not self._pending:
                self._pending = self._raw.read(_READ)
                if not self._pending:
                    raise EOFError("the archive ends inside its compressed data")
            out = self._inflate.decompress(self._pending, len(b))
            self._pending = self._inflate.unconsumed_tail
            if out:
                b[: len(out)] = out
                return len(out)


class _File:
    """A file the writer is to make: where, what its manifest says, and its tar mtime."""

    __slots__ = ("entry", "mtime", "path")

    def __init__(self, path: Path, entry: FileEntry, mtime: float) -> None:
        self.path = path
        self.entry = entry
        self.mtime = mtime


_END = object()  # the file begun last is complete
_STOP = object()


class _Writer:
    """Checks each file the extraction reads against its manifest entry and writes it, on a
    thread of its own, in order. (Checking and writing on a thread each was slower, not
    faster: three threads on two cores spent the gain waiting for the GIL.)

    Its first failure is kept (``raise_failure``, and the next ``begin`` or ``write`` raises
    it); after one it drains what is queued and writes nothing more."""

    def __init__(self, owner: tuple[int, int] | None) -> None:
        self.failure: BaseException | None = None
        self._queue: queue.Queue[object] = queue.Queue(_QUEUE)
        self._checks = _Checks()
        self._writes = _Writes(owner)
        self._thread = threading.Thread(target=self._run, name="pgplane-unpack", daemon=True)
        self._thread.start()

    def begin(self, file: _File) -> None:
        self._put(file)

    def write(self, chunk: bytes) -> None:
        self._put(chunk)

    def end(self) -> None:
        self._put(_END)

    def close(self) -> None:
        self._queue.put(_STOP)
        self._thread.join()

    def raise_failure(self) -> None:
        if self.failure is not None:
            raise self.failure

    def _put(self, item: object) -> None:
        self.raise_failure()
        self._queue.put(item)

    def _run(self) -> None:
        checks, writes = self._checks, self._writes
        while (item := self._queue.get()) is not _STOP:
            if self.failure is not None:
                continue
            try:
                if isinstance(item, _File):
                    checks.begin(item)
                    writes.begin(item)
                elif isinstance(item, bytes):
                    checks.data(item)
                    writes.data(item)
                else:
                    checks.end()  # before the file is given its owner and mode
                    writes.end()
            except BaseException as exc:  # handed to the extracting thread
                self.failure = exc
        writes.abandon()


class _Checks:
    """Each file's data against its manifest entry: its size and sha256."""

    def __init__(self) -> None:
        self._entry: FileEntry | None = None
        self._digest = hashlib.sha256()
        self._size = 0

    def begin(self, file: _File) -> None:
        self._entry = file.entry
        self._digest = hashlib.sha256()
        self._size = 0

    def data(self, chunk: bytes) -> None:
        self._digest.update(chunk)
        self._size += len(chunk)

    def end(self) -> None:
        entry = self._entry
        if entry is not None and (
            self._size != entry.size or self._digest.hexdigest() != entry.sha256
        ):
            raise ComputeError(
                f"archive file {entry.path!r} is corrupt: {self._size} bytes with sha256 "
                f"{self._digest.hexdigest()}, its manifest says {entry.size} with {entry.sha256}"
            )


class _Writes:
    """Each file created anew (never through a link), written, then given its owner, mode and
    mtime."""

    def __init__(self, owner: tuple[int, int] | None) -> None:
        self._owner = owner
        self._file: _File | None = None
        self._fd = -1
        self._size = 0

    def begin(self, file: _File) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        self._fd = os.open(file.path, flags, 0o600)
        self._file = file
        self._size = 0

    def data(self, chunk: bytes) -> None:
        self._size += len(chunk)
        view = memoryview(chunk)
        while view:
            view = view[os.write(self._fd, view) :]

    def end(self) -> None:
        file = self._file
        if file is None:
            return
        try:
            if self._owner is not None:
                os.fchown(self._fd, *self._owner)
            os.fchmod(self._fd, file.entry.mode)  # after the chown, which may clear mode bits
            if self._size >= _WRITEBACK_FROM:
                start_writeback(self._fd)
        finally:
            self.abandon()
        os.utime(file.path, (file.mtime, file.mtime))

    def abandon(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._file = None

"""The cold archive of a project: its whole directory tree as one compressed file and a manifest.

A project idle long enough is detached: its tree (every branch's data directory and the small
files beside them) is packed and then removed; reattaching unpacks it. The tree must come back
byte for byte, with the modes Postgres insists on (0700 or 0750 on a data directory), or not at
all. So a manifest records every entry, with its mode and, for a file, its size and sha256, and
the sha256 of the archive itself: corruption is caught before extraction (the archive's
checksum) and during it (each file's, and any entry the manifest does not list), and an entry
missing from the archive at its end.

On disk, ``<dest>/`` holds::

    data.tar.gz     pax tar of the tree (member "." is its root), gzip level 1
    manifest.json   the Manifest as JSON; an archive without it is incomplete

Both directions build in a temporary sibling (``.<name>.tmp-<hex>``), make it durable and rename
it into place, so a destination is whole or absent; a crash leaves only the temporary, which the
next call removes. The callers serialise the work on one destination: a second call removes
the temporary of one still running.

The tar is only a transport: extraction creates what the manifest lists and nothing else, with
the manifest's modes. Unsafe members (absolute paths, ``..``, hard links, devices, fifos, links
leading out of the tree) are refused by checks of our own on every Python version, rather than
by tarfile's extraction filters (3.11.4+), whose "data" filter would also alter the modes.

The manifest and its checks are in ``archive_manifest``; reading the tenant's tree, and its
hazards, in :mod:`.tree`.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import os
import posixpath
import secrets
import shutil
import tarfile
import zlib
from pathlib import Path
from typing import IO

import msgspec

from pgplane.compute.driver import ComputeError
from pgplane.compute.local.cold.manifest import (
    ARCHIVE_NAME,
    FORMAT,
    MANIFEST_NAME,
    DirEntry,
    FileEntry,
    LinkEntry,
    Manifest,
    Mode,
    Sha256,
    Size,
    _is_safe_path,
    verify,
)
from pgplane.compute.local.cold.tree import _CHUNK, _write_archive, tree_checksums
from pgplane.compute.local.files import fsync_dir, start_writeback, sync_tree, write_atomic

__all__ = [
    "ARCHIVE_NAME",
    "FORMAT",
    "MANIFEST_NAME",
    "DirEntry",
    "FileEntry",
    "LinkEntry",
    "Manifest",
    "Mode",
    "Sha256",
    "Size",
    "pack",
    "tree_checksums",
    "unpack",
    "verify",
]

# Smaller files are left to the final sync (as in datacopy).
_WRITEBACK_FROM = 1 << 20
_TAR_BUFFER = 64 << 10


# -- pack ---------------------------------------------------------------------------------------


def pack(src: Path, dest: Path) -> Manifest:
    """Archive the tree ``src`` into the new directory ``dest``; converges.

    A ``dest`` that exists was renamed there complete, so it is verified and returned as it is:
    after a crash between packing and removing ``src``, the retry finds it even with ``src``
    gone. Nothing must write to ``src`` meanwhile (a file changing under the read is refused).
    """
    _ensure_dir(dest.parent)
    _remove_temporaries(dest)
    if os.path.lexists(dest):
        return verify(dest)
    if not src.is_dir() or src.is_symlink():
        raise ComputeError(f"cannot archive {src}: not a directory")
    if dest.resolve().is_relative_to(src.resolve()):
        raise ComputeError(f"cannot archive {src} into {dest}, inside it")
    tmp = _temporary(dest)
    try:
        os.mkdir(tmp, 0o700)
        manifest = _write_archive(src, tmp / ARCHIVE_NAME)
        write_atomic(tmp / MANIFEST_NAME, msgspec.json.encode(manifest) + b"\n")
        os.rename(tmp, dest)
        fsync_dir(dest.parent)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ComputeError(f"archiving {src} to {dest}: {exc}") from exc
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


# -- unpack -------------------------------------------------------------------------------------


def unpack(src: Path, dest: Path, *, owner: tuple[int, int] | None = None) -> Manifest:
    """Restore the archive directory ``src`` as the new tree ``dest``, owned by ``owner``.

    Nothing appears at ``dest`` unless every file matched the manifest.
    """
    _remove_temporaries(dest)
    if os.path.lexists(dest):
        raise ComputeError(f"cannot restore archive {src} to {dest}: it exists")
    manifest = verify(src)
    tmp = _temporary(dest)
    try:
        os.mkdir(tmp, 0o700)
        _Restore(src, tmp, manifest, owner).run()
        sync_tree(tmp)
        _rename_new(tmp, dest)
    except (OSError, EOFError, zlib.error, tarfile.TarError) as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ComputeError(f"restoring archive {src} to {dest}: {exc}") from exc
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


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

    def run(self) -> None:
        # gzip's own reader under an uncompressed tar stream: tarfile's "r|gz" keeps all it
        # decompressed of one read in a buffer it slices at every header, quadratic in what a
        # run of zeros (an archived WAL segment) inflates to; measured 17 s of 22 on 460 MB.
        with (
            (self.src / ARCHIVE_NAME).open("rb") as raw,
            gzip.GzipFile(fileobj=raw, mode="rb") as unzipped,
            tarfile.open(fileobj=unzipped, mode="r|", bufsize=_TAR_BUFFER) as tar,
        ):
            for member in tar:
                self._place(tar, member)
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

    def _place(self, tar: tarfile.TarFile, member: tarfile.TarInfo) -> None:
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
            file = self.files.get(name)
            if file is None or (member.size, member.mode) != (file.size, file.mode):
                raise self._refuse(member, "does not match the manifest")
            _extract_file(tar, member, self.root / name, file, self.owner)
        elif member.issym():
            link = self.links.get(name)
            if link is None or member.linkname != link.target:
                raise self._refuse(member, "does not match the manifest")
            self.made_links[name] = int(member.mtime)
        else:
            raise self._refuse(member, "is not a regular file, directory or symlink")

    def _refuse(self, member: tarfile.TarInfo, why: str) -> ComputeError:
        return ComputeError(f"archive {self.src}: member {member.name!r} {why}")


def _rename_new(tmp: Path, dest: Path) -> None:
    # rename(2) would replace an empty directory that appeared at dest since the first check.
    if os.path.lexists(dest):
        raise ComputeError(f"cannot restore to {dest}: it appeared meanwhile")
    os.rename(tmp, dest)
    fsync_dir(dest.parent)


def _extract_file(
    tar: tarfile.TarFile,
    member: tarfile.TarInfo,
    path: Path,
    entry: FileEntry,
    owner: tuple[int, int] | None,
) -> None:
    source: IO[bytes] | None = tar.extractfile(member)
    if source is None:
        raise ComputeError(f"archive member {member.name!r} has no data")
    digest = hashlib.sha256()
    size = 0
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    with source, open(os.open(path, flags, 0o600), "wb") as out:
        while chunk := source.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
            out.write(chunk)
        if size != entry.size or digest.hexdigest() != entry.sha256:
            raise ComputeError(
                f"archive file {entry.path!r} is corrupt: {size} bytes with sha256 "
                f"{digest.hexdigest()}, its manifest says {entry.size} with {entry.sha256}"
            )
        out.flush()
        if owner is not None:
            os.fchown(out.fileno(), *owner)
        os.fchmod(out.fileno(), entry.mode)  # after the chown, which may clear mode bits
        if size >= _WRITEBACK_FROM:
            start_writeback(out.fileno())
    os.utime(path, (member.mtime, member.mtime))


def _temporary(dest: Path) -> Path:
    return dest.with_name(f".{dest.name}.tmp-{secrets.token_hex(4)}")


def _remove_temporaries(dest: Path) -> None:
    """Remove what a crash left of an earlier pack or unpack to ``dest``."""
    prefix = f".{dest.name}.tmp-"
    with contextlib.suppress(FileNotFoundError):
        for entry in dest.parent.iterdir():
            if entry.name.startswith(prefix):
                shutil.rmtree(entry, ignore_errors=True)


def _ensure_dir(path: Path) -> None:
    """Make ``path`` and its missing parents, durably: the archive is all that will be left."""
    if path.is_dir():
        return
    _ensure_dir(path.parent)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    fsync_dir(path.parent)

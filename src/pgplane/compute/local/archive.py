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
the manifest's modes. The tree packed belongs to a tenant who may own its files as its OS
user: the caller stops its computes and ends every process of that user first, so nothing
changes the tree while root reads it; links are never followed (``lstat``, ``O_NOFOLLOW``) and
anything but a file, directory or link inside the tree is refused. Unsafe members (absolute
paths, ``..``, hard links, devices, fifos, links leading out of the tree) are refused by checks
of our own on every Python version, rather than by tarfile's extraction filters (3.11.4+), whose
"data" filter would also alter the modes.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import os
import posixpath
import secrets
import shutil
import stat
import tarfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Annotated, BinaryIO

import msgspec

from pgplane.compute.driver import ComputeError
from pgplane.compute.local.files import fsync_dir, start_writeback, sync_tree, write_atomic

ARCHIVE_NAME = "data.tar.gz"
MANIFEST_NAME = "manifest.json"
FORMAT = 1

# Speed over size: an archive is written at every detach, and Postgres pages (zero-filled
# free space, repeated tuple headers) compress well even at the fastest level.
_COMPRESS_LEVEL = 1
_CHUNK = 1 << 20
# Smaller files are left to the final sync (as in datacopy).
_WRITEBACK_FROM = 1 << 20
# A data directory never holds set-id files; restoring one (maybe as root) from an archive that
# is ours only by its say-so would hand out privileges.
_SET_ID = stat.S_ISUID | stat.S_ISGID

Sha256 = Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")]
Mode = Annotated[int, msgspec.Meta(ge=0, le=0o7777)]
Size = Annotated[int, msgspec.Meta(ge=0)]


class FileEntry(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    path: str
    size: Size
    mode: Mode
    sha256: Sha256


class DirEntry(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    path: str
    mode: Mode


class LinkEntry(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    path: str
    target: str


class Manifest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What an archive holds. Paths are relative, "/"-separated; the root directory is ".".

    Entries are in archive order: every directory before what it contains.
    """

    format: int
    archive_size: Size
    archive_sha256: Sha256
    dirs: tuple[DirEntry, ...]
    files: tuple[FileEntry, ...]
    symlinks: tuple[LinkEntry, ...]

    @property
    def data_size(self) -> int:
        """Bytes of file data once unpacked (what a restore needs on disk, give or take)."""
        return sum(entry.size for entry in self.files)


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


def _write_archive(src: Path, archive: Path) -> Manifest:
    dirs: list[DirEntry] = []
    files: list[FileEntry] = []
    links: list[LinkEntry] = []
    with archive.open("xb") as raw:
        sink = _HashingWriter(raw)
        # mtime=0: the gzip header then depends on the content only.
        with (
            gzip.GzipFile(mode="wb", fileobj=sink, compresslevel=_COMPRESS_LEVEL, mtime=0) as gz,
            tarfile.TarFile(
                fileobj=gz, mode="w", format=tarfile.PAX_FORMAT, copybufsize=_CHUNK
            ) as tar,
        ):
            for rel, st in _walk(src):
                path = src / rel
                info = tarfile.TarInfo(rel)
                info.mtime = int(st.st_mtime)
                info.mode = stat.S_IMODE(st.st_mode)
                if stat.S_ISDIR(st.st_mode):
                    info.type = tarfile.DIRTYPE
                    tar.addfile(info)
                    dirs.append(DirEntry(path=rel, mode=info.mode))
                elif stat.S_ISLNK(st.st_mode):
                    target = os.readlink(path)
                    if not _link_stays_inside(rel, target):
                        raise ComputeError(
                            f"cannot archive {path}: links to {target!r}, not a relative path "
                            "inside the tree (it could not be restored)"
                        )
                    info.type = tarfile.SYMTYPE
                    info.linkname = target
                    tar.addfile(info)
                    links.append(LinkEntry(path=rel, target=target))
                elif stat.S_ISREG(st.st_mode):
                    files.append(_add_file(tar, path, info))
                else:
                    raise ComputeError(
                        f"cannot archive {path}: not a regular file, directory or symlink"
                    )
        raw.flush()
        os.fsync(raw.fileno())
    return Manifest(
        format=FORMAT,
        archive_size=sink.size,
        archive_sha256=sink.digest.hexdigest(),
        dirs=tuple(dirs),
        files=tuple(files),
        symlinks=tuple(links),
    )


def _add_file(tar: tarfile.TarFile, path: Path, info: tarfile.TarInfo) -> FileEntry:
    # Size and mode from the open file, not the walk: they describe the bytes actually read.
    # O_NONBLOCK: a FIFO put there meanwhile must not hang the read (it is refused below).
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    with open(os.open(path, flags), "rb") as f:
        before = os.fstat(f.fileno())
        if not stat.S_ISREG(before.st_mode):
            raise ComputeError(f"cannot archive {path}: replaced while archiving")
        info.size = before.st_size
        info.mode = stat.S_IMODE(before.st_mode)
        if info.mode & _SET_ID:
            raise ComputeError(f"cannot archive {path}: set-id mode {info.mode:o}")
        reader = _HashingReader(f)
        tar.addfile(info, reader)  # raises OSError if the file got shorter
        after = os.fstat(f.fileno())
    if (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns):
        raise ComputeError(f"cannot archive {path}: written to while archiving")
    return FileEntry(
        path=info.name, size=info.size, mode=info.mode, sha256=reader.digest.hexdigest()
    )


class _HashingReader:
    """Hashes what tarfile reads, so that each file is read once."""

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        self.digest = hashlib.sha256()

    def read(self, size: int = -1, /) -> bytes:
        data = self._raw.read(size)
        self.digest.update(data)
        return data


class _HashingWriter:
    """Hashes the compressed bytes on their way to disk, so the archive is not read back."""

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        self.digest = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes, /) -> int:
        self.digest.update(data)
        self.size += len(data)
        return self._raw.write(data)

    def flush(self) -> None:
        self._raw.flush()


# -- verify -------------------------------------------------------------------------------------


def verify(src: Path) -> Manifest:
    """Check that the archive directory ``src`` is complete and its archive intact, unextracted."""
    manifest = _read_manifest(src)
    archive = src / ARCHIVE_NAME
    try:
        with archive.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size != manifest.archive_size:
                raise ComputeError(
                    f"archive {src} is corrupt: {ARCHIVE_NAME} has {size} bytes, "
                    f"its manifest says {manifest.archive_size}"
                )
            digest = hashlib.file_digest(f, "sha256").hexdigest()
    except FileNotFoundError:
        raise ComputeError(f"archive {src} is incomplete: it has no {ARCHIVE_NAME}") from None
    except OSError as exc:
        raise ComputeError(f"reading archive {src}: {exc}") from exc
    if digest != manifest.archive_sha256:
        raise ComputeError(
            f"archive {src} is corrupt: {ARCHIVE_NAME} has sha256 {digest}, "
            f"its manifest says {manifest.archive_sha256}"
        )
    return manifest


def _read_manifest(src: Path) -> Manifest:
    try:
        data = (src / MANIFEST_NAME).read_bytes()
    except FileNotFoundError:
        what = "incomplete: it has no manifest" if src.is_dir() else "missing"
        raise ComputeError(f"archive {src} is {what}") from None
    except OSError as exc:
        raise ComputeError(f"reading archive {src}: {exc}") from exc
    try:
        manifest = msgspec.json.decode(data, type=Manifest)
    except msgspec.DecodeError as exc:
        raise ComputeError(f"archive {src} has an unreadable manifest: {exc}") from exc
    problem = _manifest_problem(manifest)
    if problem is not None:
        raise ComputeError(f"archive {src} has an invalid manifest: {problem}")
    return manifest


def _manifest_problem(manifest: Manifest) -> str | None:
    """What makes a decoded manifest unusable (its paths become paths on this machine)."""
    if manifest.format != FORMAT:
        return f"format {manifest.format}, this version reads format {FORMAT}"
    if not manifest.dirs or manifest.dirs[0].path != ".":
        return "the root directory is not listed first"
    return next(_entry_problems(manifest), None)


def _entry_problems(manifest: Manifest) -> Iterator[str]:
    paths = [entry.path for entry in manifest.dirs[1:]]
    paths += [entry.path for entry in manifest.files]
    paths += [entry.path for entry in manifest.symlinks]
    yield from (f"unsafe path {path!r}" for path in paths if not _is_safe_path(path))
    if len(set(paths)) != len(paths):
        yield "a path is listed twice"
    for file in manifest.files:
        if file.mode & _SET_ID:
            yield f"{file.path!r} has set-id mode {file.mode:o}"
    for link in manifest.symlinks:
        if not _link_stays_inside(link.path, link.target):
            yield f"link {link.path!r} to {link.target!r} may lead out of the tree"


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
        with (
            (self.src / ARCHIVE_NAME).open("rb") as raw,
            tarfile.open(fileobj=raw, mode="r|gz", bufsize=_CHUNK) as tar,
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


# -- shared -------------------------------------------------------------------------------------


def tree_checksums(root: Path) -> dict[str, str]:
    """The sha256 of every regular file under ``root``, by relative path; links not followed."""
    sums: dict[str, str] = {}
    for rel, st in _walk(root):
        if stat.S_ISREG(st.st_mode):
            with open(os.open(root / rel, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC), "rb") as f:
                sums[rel] = hashlib.file_digest(f, "sha256").hexdigest()
    return sums


def _walk(root: Path) -> Iterator[tuple[str, os.stat_result]]:
    """Every entry under ``root`` ("." first), each directory before its content, by name."""
    top = os.lstat(root)
    if not stat.S_ISDIR(top.st_mode):
        raise ComputeError(f"{root} is not a directory")
    yield ".", top
    pending = [""]
    while pending:
        rel_dir = pending.pop()
        with os.scandir(root / rel_dir) as scan:
            entries = sorted(scan, key=lambda entry: entry.name)
        subdirs = []
        for entry in entries:
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            try:
                rel.encode()
            except UnicodeEncodeError:
                raise ComputeError(f"{root / rel_dir}: a file name is not UTF-8") from None
            st = entry.stat(follow_symlinks=False)
            yield rel, st
            if stat.S_ISDIR(st.st_mode):
                subdirs.append(rel)
        pending.extend(reversed(subdirs))


def _is_safe_path(path: str) -> bool:
    """A relative path that names something under the root, and is written only one way."""
    return "\0" not in path and all(part not in ("", ".", "..") for part in path.split("/"))


def _link_stays_inside(path: str, target: str) -> bool:
    """Whether the link at ``path`` to ``target`` resolves inside the tree, whatever it holds.

    A lexical check is enough only for a target in normal form (".." leading, if any): the
    kernel climbs from the link's directory, a real one, then descends, and a link met on the
    way down stays inside by the same rule. "a/l/.." could climb out through a link "a/l".
    """
    if not target or "\0" in target or target.startswith("/"):
        return False
    if posixpath.normpath(target) != target:
        return False
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
    return resolved != ".." and not resolved.startswith("../")


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

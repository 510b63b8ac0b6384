"""The manifest of a cold archive, and the checks of one read back.

A manifest records every entry, with its mode and, for a file, its size and sha256, and the
sha256 of the archive itself. Its paths become paths on this machine: unsafe ones (absolute
paths, ``..``, links leading out of the tree) and set-id modes are refused before anything is
extracted.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import msgspec

from pgplane.compute.driver import ComputeError

MANIFEST_NAME = "manifest.json"
# Format 2: the tar compressed with zstandard (a GB of pgbench's tables compressed in 0.8 s,
# gzip took 2.8 s, decompressed in a third of gzip's time, and a quarter smaller). Format 1,
# gzip, is still read: archives of detached projects and objects stored by earlier versions.
FORMAT = 2
ARCHIVE_NAME = "data.tar.zst"
_ARCHIVE_NAMES = {1: "data.tar.gz", 2: ARCHIVE_NAME}
ARCHIVE_NAMES = frozenset(_ARCHIVE_NAMES.values())

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


def archive_name(format_: int) -> str:
    """The archive's file name in an archive of this (readable) format."""
    return _ARCHIVE_NAMES[format_]


# -- verify -------------------------------------------------------------------------------------


def verify(src: Path) -> Manifest:
    """Check that the archive directory ``src`` is complete and its archive intact, unextracted."""
    manifest = _read_manifest(src)
    name = archive_name(manifest.format)
    archive = src / name
    try:
        with archive.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size != manifest.archive_size:
                raise ComputeError(
                    f"archive {src} is corrupt: {name} has {size} bytes, "
                    f"its manifest says {manifest.archive_size}"
                )
            digest = hashlib.file_digest(f, "sha256").hexdigest()
    except FileNotFoundError:
        raise ComputeError(f"archive {src} is incomplete: it has no {name}") from None
    except OSError as exc:
        raise ComputeError(f"reading archive {src}: {exc}") from exc
    if digest != manifest.archive_sha256:
        raise ComputeError(
            f"archive {src} is corrupt: {name} has sha256 {digest}, "
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
    return parse_manifest(data, str(src))


def parse_manifest(data: bytes, where: str) -> Manifest:
    """A manifest read back (from ``where``), checked before any of its paths is used."""
    try:
        manifest = msgspec.json.decode(data, type=Manifest)
    except msgspec.DecodeError as exc:
        raise ComputeError(f"archive {where} has an unreadable manifest: {exc}") from exc
    problem = _manifest_problem(manifest)
    if problem is not None:
        raise ComputeError(f"archive {where} has an invalid manifest: {problem}")
    return manifest


def _manifest_problem(manifest: Manifest) -> str | None:
    """What makes a decoded manifest unusable (its paths become paths on this machine)."""
    if manifest.format not in _ARCHIVE_NAMES:
        return f"format {manifest.format}, this version reads formats up to {FORMAT}"
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

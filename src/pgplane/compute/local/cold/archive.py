"""The cold archive of a project: its whole directory tree as one compressed file and a manifest.

A project idle long enough is detached: its tree (every branch's data directory and the small
files beside them) is packed and then removed; reattaching unpacks it. The tree must come back
byte for byte, with the modes Postgres insists on (0700 or 0750 on a data directory), or not at
all. So a manifest records every entry, with its mode and, for a file, its size and sha256, and
the sha256 of the archive itself: corruption is caught before extraction (the archive's
checksum) and during it (each file's, and any entry the manifest does not list), and an entry
missing from the archive at its end.

On disk, ``<dest>/`` holds::

    data.tar.zst    pax tar of the tree (member "." is its root), zstandard level 1
                    (data.tar.gz, gzip, in archives of format 1, still read)
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
import os
import secrets
import shutil
import tarfile
import zlib
from pathlib import Path

import msgspec
import zstandard

from pgplane.compute.driver import ComputeError
from pgplane.compute.local.cold.extract import extract
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
    archive_name,
    verify,
)
from pgplane.compute.local.cold.tree import _write_archive, tree_checksums
from pgplane.compute.local.files import fsync_dir, sync_tree, write_atomic

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
    "archive_name",
    "pack",
    "tree_checksums",
    "unpack",
    "verify",
]

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
        extract(src, src / archive_name(manifest.format), tmp, manifest, owner)
        sync_tree(tmp)
        _rename_new(tmp, dest)
    except (OSError, EOFError, zlib.error, zstandard.ZstdError, tarfile.TarError) as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ComputeError(f"restoring archive {src} to {dest}: {exc}") from exc
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def _rename_new(tmp: Path, dest: Path) -> None:
    # rename(2) would replace an empty directory that appeared at dest since the first check.
    if os.path.lexists(dest):
        raise ComputeError(f"cannot restore to {dest}: it appeared meanwhile")
    os.rename(tmp, dest)
    fsync_dir(dest.parent)


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

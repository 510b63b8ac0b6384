"""The cold archive on shared storage: a node's archive directory (``cold.archive``) as two
objects, so that another node can restore it.

``<prefix>/data.tar.zst`` (``data.tar.gz`` in an archive of format 1) goes first, then
``<prefix>/manifest.json``: an archive without its manifest is incomplete, as on disk. Nothing
read back is believed before it is checked: the manifest is bounded and validated as one read
from disk is, and the archive's size and sha256 must be the manifest's, checked as it is copied
(and again, file by file, as it is unpacked).
"""

from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path
from typing import BinaryIO

from pgplane.compute.driver import ComputeError
from pgplane.compute.local.cold import archive
from pgplane.compute.local.cold.manifest import MANIFEST_NAME, Manifest, archive_name
from pgplane.compute.local.cold.manifest import parse_manifest as parse
from pgplane.compute.local.files import fsync_dir
from pgplane.compute.local.shared.objects import ObjectStore

# A manifest lists every file of a project (its branches' data and history): megabytes at most.
_MAX_MANIFEST = 256 << 20


def prefix_of(project_id: str) -> str:
    return f"archive/{project_id}"


def upload(store: ObjectStore, prefix: str, local: Path) -> Manifest:
    """The verified archive directory ``local`` as the objects under ``prefix``."""
    manifest = archive.verify(local)
    name = archive_name(manifest.format)
    with (local / name).open("rb") as f:  # root's: archive/
        sent = store.write(f"{prefix}/{name}", f, max_bytes=manifest.archive_size)
    if (sent.size, sent.sha256) != (manifest.archive_size, manifest.archive_sha256):
        raise ComputeError(f"archive {local} changed while it was stored")
    store.write_bytes(f"{prefix}/{MANIFEST_NAME}", (local / MANIFEST_NAME).read_bytes())  # root's
    return manifest


def manifest_of(store: ObjectStore, prefix: str) -> Manifest | None:
    """The stored archive's manifest, checked; None when there is no complete archive."""
    try:
        data = store.read_bytes(f"{prefix}/{MANIFEST_NAME}", max_bytes=_MAX_MANIFEST)
    except FileNotFoundError:
        return None
    return parse(data, f"{prefix} on shared storage")


def verify(store: ObjectStore, prefix: str) -> Manifest:
    """The stored archive whole: its manifest valid and its data the manifest's."""
    manifest = manifest_of(store, prefix)
    if manifest is None:
        raise ComputeError(f"archive {prefix} is missing from shared storage")
    with open(os.devnull, "wb") as sink:
        _check(store, prefix, manifest, sink)
    return manifest


def download(store: ObjectStore, prefix: str, local: Path) -> Manifest:
    """The stored archive as the new archive directory ``local`` (whole, or not there)."""
    manifest = manifest_of(store, prefix)
    if manifest is None:
        raise ComputeError(f"archive {prefix} is missing from shared storage")
    tmp = local.with_name(f".{local.name}.tmp-{secrets.token_hex(4)}")
    try:
        os.mkdir(tmp, 0o700)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        name = archive_name(manifest.format)
        with open(os.open(tmp / name, flags, 0o600), "wb") as out:  # root's: made here
            _check(store, prefix, manifest, out)
            out.flush()
            os.fsync(out.fileno())
        data = _same_manifest(store, prefix, manifest)
        with open(os.open(tmp / MANIFEST_NAME, flags, 0o600), "wb") as out:  # root's: made here
            out.write(data)
            os.fsync(out.fileno())
        os.rename(tmp, local)
        fsync_dir(local.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def _same_manifest(store: ObjectStore, prefix: str, manifest: Manifest) -> bytes:
    """The manifest read again: the one the archive was checked against, or an error."""
    data = store.read_bytes(f"{prefix}/{MANIFEST_NAME}", max_bytes=_MAX_MANIFEST)
    if parse(data, prefix) != manifest:
        raise ComputeError(f"archive {prefix} on shared storage changed while read")
    return data


def _check(store: ObjectStore, prefix: str, manifest: Manifest, sink: BinaryIO) -> None:
    name = archive_name(manifest.format)
    try:
        got = store.read(f"{prefix}/{name}", sink, max_bytes=manifest.archive_size)
    except FileNotFoundError:
        raise ComputeError(f"archive {prefix} on shared storage has no {name}") from None
    if (got.size, got.sha256) != (manifest.archive_size, manifest.archive_sha256):
        raise ComputeError(
            f"archive {prefix} on shared storage is corrupt: {got.size} bytes with sha256"
            f" {got.sha256}, its manifest says {manifest.archive_size} with"
            f" {manifest.archive_sha256}"
        )

"""A sealed snapshot kept on shared or object storage too, so it outlives this machine.

``snapshots/<project_id>/<snapshot_id>/`` there holds the snapshot's directory (its data and
its record) as a cold archive (``data.tar.zst``, then ``manifest.json``: one without its
manifest is incomplete). It goes up once the snapshot is sealed, when the tenant can no longer
reach it, and comes back (``fetch``) into a project rebuilt elsewhere, checked file by file
against the manifest, and sealed again.
"""

from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path

from pgplane.compute.local.cold import archive
from pgplane.compute.local.cold.manifest import MANIFEST_NAME
from pgplane.compute.local.layout import check_id
from pgplane.compute.local.shared import cold
from pgplane.compute.local.shared.objects import ObjectStore


def prefix_of(project_id: str, snapshot_id: str | None = None) -> str:
    top = f"snapshots/{check_id('project id', project_id)}"
    return top if snapshot_id is None else f"{top}/{check_id('snapshot id', snapshot_id)}"


def ship(store: ObjectStore, top: Path, prefix: str, staging: Path) -> None:
    """The sealed snapshot directory ``top`` stored under ``prefix``, unless it is already
    (blocking; a retry after a crash packs and stores it again, whole)."""
    if store.exists(f"{prefix}/{MANIFEST_NAME}"):
        return
    local = _fresh(staging, "snapshot")
    try:
        archive.pack(top, local)
        cold.upload(store, prefix, local)
    finally:
        shutil.rmtree(local, ignore_errors=True)  # root's: the staging copy made here


def fetch(store: ObjectStore, prefix: str, top: Path, staging: Path) -> None:
    """The stored snapshot unpacked as the new directory ``top`` (root's), checked."""
    local = _fresh(staging, "snapshot-fetch")
    try:
        cold.download(store, prefix, local)
        archive.unpack(local, top, owner=(os.geteuid(), os.getegid()))
    finally:
        shutil.rmtree(local, ignore_errors=True)  # root's: the staging copy made here


def _fresh(staging: Path, kind: str) -> Path:
    staging.mkdir(mode=0o700, parents=True, exist_ok=True)
    return staging / f"{kind}-{secrets.token_hex(4)}"

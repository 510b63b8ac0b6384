"""``pgplane backups verify``: what the object store holds of each branch, proven restorable.

For each live branch of the platform's store (of one project, or all), beside a running
``serve``: its newest base state and every WAL file after it are fetched from the bucket into a
scratch data directory, checked against their checksums, and replayed to the end by a temporary
postmaster of the project's user, exactly as ``recover`` and ``nodes recover`` would; a detached
project's cold archive is fetched and unpacked, file by file against its manifest. The scratch
directory is removed after. Nothing is written to the bucket: the scratch driver's store refuses
every write and delete, so a verification can never change what a recovery would find.

The report says, per branch, whether it came back and to when (its newest shipped WAL's time),
and how long it took; each branch's result is recorded in the store (its backup check), where
the console shows it.

``serve`` runs the same check itself (``run_checks``): every ``backup_verify_seconds`` (a week
by default) for each branch placed on its node, counted from the branch's last check, or from
its creation before the first. ``/metrics`` says when the last check ran and how many
branches it found unrestorable.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets
import shutil
import subprocess
import time
from collections.abc import Collection
from pathlib import Path

from pgplane import startup
from pgplane.compute.driver import ComputeError
from pgplane.compute.local import LocalComputeDriver
from pgplane.compute.local.layout import Layout, ensure_dir
from pgplane.compute.local.shared import shipping
from pgplane.compute.local.shared.objects import ObjectStore
from pgplane.config import Settings
from pgplane.core import clock, scrub
from pgplane.core.models import BackupCheck, Project
from pgplane.objectstore.bucket import ReadOnly, open_bucket
from pgplane.store import Store
from pgplane.telemetry.metrics import NO_METRICS, Metrics

log = logging.getLogger(__name__)


async def verify(
    settings: Settings,
    store: Store,
    *,
    project_ids: Collection[str] | None = None,
    branch_ids: Collection[str] | None = None,
) -> list[dict[str, object]]:
    """One row per branch verified (``error`` set when it could not be restored), of the
    given projects or of every project (only ``branch_ids`` of them, when given); each
    recorded as the branch's backup check."""
    if settings.object_store is None or settings.archive_key_file is None:
        raise ComputeError("backups verify needs --object-store and --archive-key-file")
    try:
        opened = await asyncio.to_thread(
            open_bucket, settings.object_store, settings.archive_key_file
        )
    except ValueError as exc:
        raise ComputeError(str(exc)) from None
    sealed = ReadOnly(opened.sealed)
    scrub.hide(settings.data_dir)  # the errors kept are shown in the tenant's console
    async with store.read() as tx:
        if project_ids is None:
            project_ids = set()
            for load in await tx.node_loads():
                project_ids |= await tx.node_project_ids(load.node.name)
        projects = []
        for pid in sorted(project_ids):
            found = await tx.get_project_by_id(pid)
            if found is not None and found.deleted_at is None:
                projects.append(found)
        work = [
            (
                p,
                [
                    b.id
                    for b in await tx.list_branches(p.id)
                    if b.current_state != "init" and (branch_ids is None or b.id in branch_ids)
                ],
            )
            for p in projects
        ]
    scratch = settings.data_dir / "scratch" / f"verify-{secrets.token_hex(4)}"
    await asyncio.to_thread(_make_scratch, scratch)
    rows: list[dict[str, object]] = []
    try:
        local = dataclasses.replace(settings, data_dir=scratch, store=None)
        driver, _ = await startup.driver(local, sealed)
        try:
            for project, of_project in work:
                for branch_id in of_project:
                    check, seconds = await _one(driver, sealed, project, branch_id)
                    async with store.write() as tx:
                        await tx.put_backup_check(check)
                    rows.append(_row(check, seconds))
        finally:
            await driver.close()
    finally:
        await asyncio.to_thread(_discard, scratch)
    return rows


def _row(check: BackupCheck, seconds: float) -> dict[str, object]:
    to = check.restorable_to
    return {
        "project_id": check.project_id,
        "branch_id": check.branch_id,
        "restorable_to": None if to is None else clock.format_us(to),
        "error": check.error,
        "seconds": round(seconds, 1),
    }


async def _one(
    driver: LocalComputeDriver, sealed: ObjectStore, project: Project, branch_id: str
) -> tuple[BackupCheck, float]:
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
        error = None
    except ComputeError as exc:
        end, error = None, scrub.scrub(str(exc))
    check = BackupCheck(
        project_id=project.id,
        branch_id=branch_id,
        checked_at=clock.now_us(),
        restorable_to=end,
        error=error,
    )
    return check, time.monotonic() - began


async def due(store: Store, node: str, every_us: int) -> dict[str, set[str]]:
    """The live branches, by project, of the projects placed on ``node`` whose last check
    (or, before the first, their creation) is ``every_us`` old. Only those: a branch made a
    moment ago has nothing in the bucket yet, and would be reported unrestorable."""
    now = clock.now_us()
    async with store.read() as tx:
        checked = {c.branch_id: c.checked_at for c in await tx.backup_checks()}
        found: dict[str, set[str]] = {}
        for pid in await tx.node_project_ids(node):
            project = await tx.get_project_by_id(pid)
            if project is None or project.deleted_at is not None:
                continue
            for b in await tx.list_branches(pid):
                since = checked.get(b.id, b.created_at)
                if b.current_state != "init" and now - since >= every_us:
                    found.setdefault(pid, set()).add(b.id)
    return found


async def run_checks(
    settings: Settings, store: Store, node: str, metrics: Metrics = NO_METRICS
) -> None:
    """``serve``'s own checks: the due projects' branches verified, in a look each
    ``backup_verify_seconds`` (at most hourly), and what they found in the metrics."""
    every = settings.backup_verify_seconds
    if every <= 0 or settings.object_store is None:
        return
    while True:
        try:
            branches = await due(store, node, int(every * 1e6))
            if branches:
                rows = await verify(
                    settings,
                    store,
                    project_ids=set(branches),
                    branch_ids=set().union(*branches.values()),
                )
                failed = [r for r in rows if r["error"]]
                for row in failed:
                    log.error("backup of %s does not restore: %s", row["branch_id"], row["error"])
                log.info("backups verified: %d branch(es), %d failed", len(rows), len(failed))
                metrics.backups_verified(branches=len(rows), failed=len(failed))
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("verifying backups failed; trying again later")
            metrics.backups_verified(branches=0, failed=None)
        await asyncio.sleep(min(every, 3600.0))


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

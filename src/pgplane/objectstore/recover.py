"""``pgplane recover``: the platform brought back from its object store into an empty data
directory, after the machine it ran on was lost.

In order, each step done before the next begins, and nothing written before the checks pass:

1. The data directory holds no platform (no projects; no store, or the empty one a refused
   ``serve`` made), or what a recovery stopped
   midway left (its marker, ``recover.unfinished``, says so: it goes on from there, and
   ``serve`` refuses the directory meanwhile); its server lock is taken.
2. The prefix holds a platform, sealed with the archive key given (else refused by name).
3. The lost platform's lease on the prefix has lapsed (waited for, up to a lease's length):
   a platform still live there is never recovered over; then the lease is this process'.
4. The store's newest copy comes down, checked by SQLite; the data directory takes the lost
   node's id (``node.id``), so the next ``serve`` is that node again.
5. Every attached project is brought back as a lost node's is (``moves.bring_back``): its
   unfinished operations failed with the reason and started again, a ``tenant_attach`` and the
   computes that ran queued for ``serve``. Then each branch is rebuilt here, now, from its
   newest base state and every WAL file after it (so the report is the truth, and the queued
   attach finds the work done); its snapshots come down too. A detached project's cold archive
   stays in the bucket, brought back on first use as on any node.

The report names what came back, each branch with the time its newest shipped WAL was written
(it holds every commit up to then), and what could not: such a branch's project stays detached,
its queued ``tenant_attach`` failing with the reason, never a platform that looks whole.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from pgplane import failpoints, startup
from pgplane.compute.driver import ComputeError
from pgplane.compute.local import LocalComputeDriver
from pgplane.compute.local.shared import shipping
from pgplane.config import Settings
from pgplane.core import clock
from pgplane.core.operations import Action
from pgplane.engine.node import NodeLease
from pgplane.objectstore import claim, storecopy
from pgplane.objectstore.bucket import Bucket, open_bucket
from pgplane.serverlock import AlreadyServing, ServerLock
from pgplane.services import moves
from pgplane.services.nodes import home_of
from pgplane.store import Store, Tx
from pgplane.store.open import open_store

log = logging.getLogger(__name__)

# In the data directory while a recovery runs: `serve` refuses it, `recover` goes on from it.
UNFINISHED = "recover.unfinished"

_REASON = (
    "the platform was recovered from its object store before this finished; the work started"
    " again on the recovered platform"
)


class NotRecoverable(Exception):
    """Recovery refused before anything was written (the message says why)."""


@dataclass
class Recovery:
    platform: str
    projects: int = 0
    branches: list[dict[str, object]] = field(default_factory=list)
    snapshots: list[dict[str, object]] = field(default_factory=list)
    detached: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)

    def document(self) -> dict[str, object]:
        return {
            "platform": self.platform,
            "projects": self.projects,
            "branches": self.branches,
            "snapshots": self.snapshots,
            "detached_projects": self.detached,
            "not_recovered": self.lost,
        }


async def recover(settings: Settings) -> Recovery:
    """Steps 1 to 5 of the module's docstring; NotRecoverable when refused."""
    data_dir = settings.data_dir
    data_dir.mkdir(parents=True, exist_ok=True)
    lock = ServerLock(data_dir)
    try:
        lock.acquire()
    except AlreadyServing as exc:
        raise NotRecoverable(str(exc)) from None
    try:
        marker = data_dir / UNFINISHED
        resumed = marker.exists()
        if not resumed:
            _check_empty(settings)
        bucket = await _claimed(settings, holder=f"recover {data_dir.resolve()}")
        try:
            await asyncio.to_thread(_write_new, marker, b"")
            report = await _recover(settings, bucket, resumed=resumed)
            marker.unlink()
            return report
        finally:
            if bucket.sealed.lease is not None:
                await asyncio.to_thread(bucket.sealed.lease.release)
    finally:
        lock.release()


def _check_empty(settings: Settings) -> None:
    """No platform here: no projects, and no store, or the empty one a ``serve`` refused over
    the prefix left (removed: the recovered store takes its place)."""
    projects = settings.data_dir / "projects"
    if projects.exists() or (settings.store_path.exists() and _holds_anything(settings)):
        raise NotRecoverable(
            f"{settings.data_dir} already holds a platform: recover into an empty data directory"
        )
    for suffix in ("", "-wal", "-shm"):
        settings.store_path.with_name(settings.store_path.name + suffix).unlink(missing_ok=True)


def _holds_anything(settings: Settings) -> bool:
    conn = sqlite3.connect(f"file:{settings.store_path}?mode=ro", uri=True)
    try:
        return any(
            conn.execute(f"SELECT EXISTS (SELECT 1 FROM {table})").fetchone()[0]  # noqa: S608 - a constant
            for table in ("accounts", "projects")
        )
    except sqlite3.Error:
        return True  # not a store this version reads: never removed
    finally:
        conn.close()


async def _claimed(settings: Settings, *, holder: str) -> Bucket:
    """Steps 2 and 3: the bucket, its platform's, with this process holding its lease."""
    url, key_file = settings.object_store, settings.archive_key_file
    if url is None or key_file is None:
        raise NotRecoverable("recover needs --object-store and --archive-key-file")
    try:
        bucket = await asyncio.to_thread(open_bucket, url, key_file)
        found = await asyncio.to_thread(claim.read_platform, bucket.raw)
        if found is None:
            raise NotRecoverable(f"{url} holds no pgplane platform")
        claim.check_key(found, bucket.fingerprint)
        lease = claim.PrefixLease(bucket.raw, platform=found.platform, instance=holder)
        # The lost platform's lease ends when it says (however long its node's leases were);
        # one still renewed past that is a live platform's.
        left = await asyncio.to_thread(lease.remaining)
        deadline = time.monotonic() + left + 5
        while (left := await asyncio.to_thread(lease.remaining)) > 0:
            if time.monotonic() > deadline:
                raise NotRecoverable(
                    "a live platform still renews its lease on the prefix: stop it first"
                )
            log.info("waiting %.0f s for the lost platform's lease on the prefix to end", left)
            await asyncio.sleep(min(left, 2.0))
        await asyncio.to_thread(lease.take)
    except (ValueError, ComputeError, claim.Refused) as exc:
        raise NotRecoverable(str(exc)) from None
    bucket.sealed.lease = lease
    return bucket


async def _recover(settings: Settings, bucket: Bucket, *, resumed: bool) -> Recovery:
    """Steps 4 and 5. ``resumed``: a recovery stopped midway (its marker says so) goes on from
    the store it fetched: each step converges (the projects brought back again end the first
    run's queued work ``failed`` with the reason; rebuilt branches and fetched snapshots are
    kept)."""
    lease = bucket.sealed.lease
    assert lease is not None  # noqa: S101 - taken by _claimed
    report = Recovery(platform=lease.platform)
    if not (resumed and settings.store_path.exists()):
        try:
            await asyncio.to_thread(storecopy.fetch, bucket.sealed, settings.store_path)
        except ComputeError as exc:
            raise NotRecoverable(str(exc)) from None
    await failpoints.reached("recover:store_fetched")
    store = await open_store(None, settings.store_path)
    try:
        async with store.read() as tx:
            homes = {home_of(load.node.instance) for load in await tx.node_loads()}
        if len(homes) == 1:  # the lost node's data directory id: the next serve is that node
            _write_node_id(settings.data_dir, homes.pop())
        queued = await _bring_back_all(settings, store, report)
        driver, _ = await startup.driver(settings, bucket.sealed)
        try:
            for project_id in queued:
                await _rebuild(store, driver, bucket, project_id, report)
                await failpoints.reached("recover:project_rebuilt")
        finally:
            await driver.close()
    finally:
        await store.close()
    return report


def _write_node_id(data_dir: Path, home: str) -> None:
    tmp = data_dir / ".node.id.recover"
    tmp.unlink(missing_ok=True)
    _write_new(tmp, f"{home}\n".encode())
    os.replace(tmp, data_dir / "node.id")


def _write_new(path: Path, data: bytes) -> None:
    """A file of root's, durable (an existing one is kept as it is: a resumed recovery's)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        return
    with open(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


async def _bring_back_all(settings: Settings, store: Store, report: Recovery) -> list[str]:
    """Step 5's store part: this directory registered as the platform's node (which takes the
    projects of its old name: the same ``node.id``), then each attached project brought back
    on it, in one transaction; the detached ones noted. The node's lease ends with the
    recovery: ``serve`` takes the name back at its start."""
    node = NodeLease(store, settings)
    await node.register(settings.proxy_port)
    now = clock.now_us()
    queued = []
    try:
        async with store.write() as tx:
            for project_id in sorted(await tx.node_project_ids(node.name)):
                project = await tx.get_project_by_id(project_id)
                if project is None or project.deleted_at is not None:
                    continue
                report.projects += 1
                unsettled = await tx.list_unsettled_operations(project_id=project_id)
                if any(o.action is Action.TENANT_ATTACH for o in unsettled):
                    queued.append(project_id)  # brought back by a recovery stopped midway
                    continue
                if project.storage_state != "attached":
                    report.detached.append(project_id)
                    continue
                await moves.bring_back(tx, project_id, to=node.name, reason=_REASON, now=now)
                queued.append(project_id)
    finally:
        await node.release()
    return queued


async def _rebuild(
    store: Store, driver: LocalComputeDriver, bucket: Bucket, project_id: str, report: Recovery
) -> None:
    async with store.read() as tx:
        project = await tx.get_project_by_id(project_id)
        assert project is not None  # noqa: S101 - read in _bring_back_all
        branches = [b for b in await tx.list_branches(project_id) if b.current_state != "init"]
        snapshots = [s for s in await tx.list_snapshots(project_id) if s.state == "ready"]
    whole = True
    for branch in sorted(branches, key=lambda b: b.id):
        row: dict[str, object] = {"project_id": project_id, "branch_id": branch.id}
        row["name"] = branch.name
        try:
            await driver.attach_tenant(
                project_id=project_id,
                branch_ids=[branch.id],
                pg_version=project.pg_version,
                history_retention_seconds=project.history_retention_seconds,
            )
            head = await asyncio.to_thread(
                shipping.read_head, bucket.sealed, shipping.prefix_of(project_id, branch.id)
            )
            end = None if head is None or not head.wal_end_at else head.wal_end_at
            row["recovered_to"] = None if end is None else clock.format_us(end)
        except ComputeError as exc:
            whole = False
            row["error"] = str(exc)
            report.lost.append(f"branch {branch.id} of project {project_id}: {exc}")
        report.branches.append(row)
    for snapshot in snapshots:
        await _fetch_snapshot(store, driver, project_id, snapshot.id, report)
    if not whole:
        log.error("project %s did not come back whole: see the report", project_id)


async def _fetch_snapshot(
    store: Store, driver: LocalComputeDriver, project_id: str, snapshot_id: str, report: Recovery
) -> None:
    error = None
    try:
        if not await driver.fetch_snapshot(project_id=project_id, snapshot_id=snapshot_id):
            error = "its data is not in the object store"
    except ComputeError as exc:
        error = str(exc)
    report.snapshots.append({"project_id": project_id, "snapshot_id": snapshot_id, "error": error})
    if error is None:
        return
    report.lost.append(f"snapshot {snapshot_id} of project {project_id}: {error}")
    async with store.write() as tx:  # never offered for a restore it cannot do
        await _fail_snapshot(tx, project_id, snapshot_id)


async def _fail_snapshot(tx: Tx, project_id: str, snapshot_id: str) -> None:
    snapshot = await tx.get_snapshot(project_id=project_id, snapshot_id=snapshot_id)
    if snapshot is not None:
        await tx.update_snapshot(
            msgspec.structs.replace(snapshot, state="failed", updated_at=clock.now_us())
        )

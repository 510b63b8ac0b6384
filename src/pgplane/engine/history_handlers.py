"""Restores (a branch's data replaced by another's, or its own past), and the history keeper.

A restore is ``create_timeline`` with the branch it restores from (``source_branch_id``), as the
branch gets a new timeline: the data plane builds the source's data at the point beside the
branch's, ends the branch's computes, swaps the data in (the old data going to the branch that
preserves it, if any), then the branch's roles and databases are applied on it (so its roles'
passwords, and every connection string, hold) through its compute, which comes back on the
restored data. A preserving branch gets its data from the swap; its own ``create_branch``,
started after the restore, only finds it there (or, had the restore failed for good, copies the
branch as it still is).
"""

from __future__ import annotations

import asyncio
import logging

import msgspec

from pgplane.compute.driver import ComputeDriver, Point
from pgplane.config import Settings
from pgplane.core import clock
from pgplane.core.models import Operation
from pgplane.engine.branch_config import apply_roles_and_databases, restart_replicas
from pgplane.engine.context import Context, OnFinish, PermanentError, project_of, require_branch
from pgplane.store import Store, Tx
from pgplane.telemetry.metrics import NO_METRICS, Metrics

log = logging.getLogger(__name__)


def point_of(op: Operation) -> Point | None:
    """The point of history the operation rebuilds at, if any (its LSN was checked on entry)."""
    if op.point_lsn is not None:
        high, _, low = op.point_lsn.partition("/")
        return Point(lsn=(int(high, 16) << 32) | int(low, 16))
    if op.point_time is not None:
        return Point(time_us=op.point_time)
    return None


async def record_start(tx: Tx, project_id: str, branch_id: str, lsn: int | None) -> None:
    """The LSN of the parent the branch's data starts at, as Neon shows it (when known)."""
    branch = await tx.get_branch(project_id=project_id, branch_id=branch_id)
    if branch is None or lsn is None:
        return
    shown = f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"
    await tx.update_branch(msgspec.structs.replace(branch, parent_lsn=shown))


async def restore_branch(ctx: Context, op: Operation) -> OnFinish | None:
    project = await project_of(ctx, op)
    branch_id = require_branch(op)
    source_id = op.source_branch_id
    if project.deleted_at is not None or source_id is None:
        return None
    async with ctx.store.read() as tx:
        branch = await tx.get_branch(project_id=project.id, branch_id=branch_id)
        source = await tx.get_branch(project_id=project.id, branch_id=source_id)
    if branch is None:
        return None  # deleted since: delete_timeline removes whatever was built
    if source is None and source_id != branch_id:
        raise PermanentError(f"branch {source_id}, the source of the restore, was deleted")
    lsn = await ctx.driver.restore_branch(
        project_id=project.id,
        branch_id=branch_id,
        source_branch_id=source_id,
        pg_version=project.pg_version,
        point=point_of(op),
        preserve_branch_id=op.preserve_branch_id,
        restore_id=op.id,
    )
    applied = await apply_roles_and_databases(ctx, project, branch_id)
    await restart_replicas(ctx, project, branch_id)  # the restore stopped them

    async def restored(tx: Tx) -> None:
        if applied is not None:
            await applied(tx)
        await tx.set_branch_state(
            branch_id=branch_id, current_state="ready", pending_state=None, now=clock.now_us()
        )
        await record_start(tx, project.id, branch_id, lsn)

    return restored


async def restore_given_up(tx: Tx, op: Operation) -> None:
    """A restore that failed for good left the branch's data as it was: the branch is ready."""
    if op.branch_id is not None and op.source_branch_id is not None:
        await tx.set_branch_state(
            branch_id=op.branch_id, current_state="ready", pending_state=None, now=clock.now_us()
        )


async def keep_history(driver: ComputeDriver, settings: Settings) -> None:
    """Every ``keep_history_seconds``: base states due are taken, what left the window is
    freed."""
    while True:
        try:
            await driver.keep_history()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("keeping history failed; continuing")
        await asyncio.sleep(settings.keep_history_seconds)


async def ship_history(
    driver: ComputeDriver,
    settings: Settings,
    store: Store,
    node: str | None,
    metrics: Metrics = NO_METRICS,
) -> None:
    """Every ``shipping_seconds``, with shared or object storage: the new history of each branch
    of the
    projects placed on this node shipped there. Only those: a project moved away (or brought
    back elsewhere while this node was gone) is its new node's to ship, and what this node may
    still hold of it is stale."""
    if settings.shared_dir is None and settings.object_store is None:
        return
    while True:
        more = False
        try:
            mine = None
            if node is not None:
                async with store.read() as tx:
                    mine = await tx.node_project_ids(node)
            done = await driver.ship_history(mine)
            if done is not None:
                metrics.shipping_round(done)
                more = done.more
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("history shipping failed; continuing")
        # A round that left a backlog (each branch ships its share of one) goes on at once.
        await asyncio.sleep(0 if more else settings.shipping_seconds)

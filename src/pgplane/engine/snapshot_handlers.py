"""Snapshots: built (``create_snapshot``), freed (``delete_snapshot``), restored into a new
branch (its ``create_branch``, carrying the snapshot) or onto a branch (its ``create_timeline``,
carrying the snapshot, as a branch restore: see history_handlers.py)."""

from __future__ import annotations

import msgspec

from pgplane.core import clock
from pgplane.core.models import Operation, Snapshot
from pgplane.engine.branch_config import apply_roles_and_databases
from pgplane.engine.context import (
    Context,
    OnFinish,
    PermanentError,
    branch_at_work,
    project_of,
    require_branch,
)
from pgplane.engine.history_handlers import point_of
from pgplane.services import history
from pgplane.store import Tx


def _snapshot_id(op: Operation) -> str:
    if op.snapshot_id is None:
        raise PermanentError(f"{op.action} needs a snapshot")
    return op.snapshot_id


async def _snapshot(ctx: Context, op: Operation) -> Snapshot | None:
    async with ctx.store.read() as tx:
        return await tx.get_snapshot_any(_snapshot_id(op))


async def create_snapshot(ctx: Context, op: Operation) -> OnFinish | None:
    project = await project_of(ctx, op)
    branch_id = require_branch(op)
    snapshot = await _snapshot(ctx, op)
    if project.deleted_at is not None or snapshot is None or snapshot.deleted_at is not None:
        return None  # deleted since: its delete_snapshot frees whatever was built
    made = await ctx.driver.create_snapshot(
        project_id=project.id,
        branch_id=branch_id,
        snapshot_id=snapshot.id,
        pg_version=project.pg_version,
        point=point_of(op),
    )

    async def ready(tx: Tx) -> None:
        current = await tx.get_snapshot_any(snapshot.id)
        if current is None:
            return
        await tx.update_snapshot(
            msgspec.structs.replace(
                current,
                state="ready",
                lsn=history.format_lsn(made.lsn) if made.lsn is not None else current.lsn,
                full_size=made.bytes,
                updated_at=clock.now_us(),
            )
        )

    return ready


async def create_snapshot_given_up(tx: Tx, op: Operation) -> None:
    """A snapshot that could not be taken says so (it is listed, and refuses a restore)."""
    if op.snapshot_id is None:
        return
    current = await tx.get_snapshot_any(op.snapshot_id)
    if current is not None and current.state == "creating":
        await tx.update_snapshot(
            msgspec.structs.replace(current, state="failed", updated_at=clock.now_us())
        )


async def delete_snapshot(ctx: Context, op: Operation) -> OnFinish | None:
    await ctx.driver.delete_snapshot(project_id=op.project_id, snapshot_id=_snapshot_id(op))
    return None


async def branch_from_snapshot(ctx: Context, op: Operation) -> OnFinish | None:
    found = await branch_at_work(ctx, op)
    if found is None:
        return None
    project, branch = found
    branch_id = branch.id
    await ctx.driver.branch_from_snapshot(
        project_id=project.id,
        snapshot_id=_snapshot_id(op),
        branch_id=branch_id,
        pg_version=project.pg_version,
    )

    async def ready(tx: Tx) -> None:
        await tx.set_branch_state(
            branch_id=branch_id, current_state="ready", pending_state=None, now=clock.now_us()
        )

    return ready


async def restore_snapshot(ctx: Context, op: Operation) -> OnFinish | None:
    found = await branch_at_work(ctx, op)
    if found is None:
        return None
    project, branch = found
    branch_id = branch.id
    await ctx.driver.restore_snapshot(
        project_id=project.id,
        snapshot_id=_snapshot_id(op),
        branch_id=branch_id,
        pg_version=project.pg_version,
        preserve_branch_id=op.preserve_branch_id,
        restore_id=op.id,
    )
    applied = await apply_roles_and_databases(ctx, project, branch_id)

    async def restored(tx: Tx) -> None:
        if applied is not None:
            await applied(tx)
        await tx.set_branch_state(
            branch_id=branch_id, current_state="ready", pending_state=None, now=clock.now_us()
        )

    return restored

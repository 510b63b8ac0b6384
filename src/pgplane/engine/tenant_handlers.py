"""Handlers of a project's storage as a whole: its availability check, detach and reattach,
its history settings, its deletion. Each converges, as every handler does."""

from __future__ import annotations

from pgplane.core import clock
from pgplane.core.models import Operation
from pgplane.engine.context import (
    Context,
    OnFinish,
    compute_spec,
    project_of,
    require_branch,
)
from pgplane.services import moves
from pgplane.store import Tx


async def apply_storage_config(ctx: Context, op: Operation) -> OnFinish | None:
    project = await project_of(ctx, op)
    if project.deleted_at is None:
        await ctx.driver.apply_storage_config(
            project_id=project.id, history_retention_seconds=project.history_retention_seconds
        )
    return None


async def delete_tenant(ctx: Context, op: Operation) -> OnFinish | None:
    await ctx.driver.delete_tenant(project_id=op.project_id)

    async def release(tx: Tx) -> None:
        await tx.delete_project_endpoints(project_id=op.project_id, now=clock.now_us())

    return release


async def check_availability(ctx: Context, op: Operation) -> OnFinish | None:
    """The branch's data is readable and a compute can start on it (or runs and answers)."""
    project = await project_of(ctx, op)
    branch_id = require_branch(op)
    if project.deleted_at is not None or project.storage_state != "attached":
        return None  # nothing to check: gone, or resting in the archive
    async with ctx.store.read() as tx:
        branch = await tx.get_branch(project_id=project.id, branch_id=branch_id)
        computes = [
            e
            for e in await tx.list_endpoints(project.id)
            if e.branch_id == branch_id and not e.disabled
        ]
    if branch is None or not computes:
        return None  # deleted since, or no compute left to check
    await ctx.driver.check_availability(
        project_id=project.id,
        branch_id=branch_id,
        pg_version=project.pg_version,
        compute=compute_spec(project, computes[0]),
    )
    return None


async def tenant_detach(ctx: Context, op: Operation) -> OnFinish | None:
    project = await project_of(ctx, op)
    if project.deleted_at is not None:
        return None
    await ctx.driver.detach_tenant(project_id=project.id)

    async def detached(tx: Tx) -> None:
        await _not_running(tx, project.id, storage="detached")
        # A draining node's project goes elsewhere with this very write: nothing can bring it
        # back here in between (its reattach then runs on its new node).
        await moves.after_detach(tx, project_id=project.id)

    return detached


async def _not_running(tx: Tx, project_id: str, *, storage: str) -> None:
    """The project's storage state, and its computes idle: none runs on its data now."""
    now = clock.now_us()
    await tx.set_project_storage(project_id=project_id, state=storage)
    for endpoint in await tx.list_endpoints(project_id):
        if endpoint.current_state != "idle":
            await tx.set_endpoint_state(
                endpoint_id=endpoint.id,
                current_state="idle",
                pending_state=endpoint.pending_state,
                now=now,
            )


async def tenant_reattach(ctx: Context, op: Operation) -> OnFinish | None:
    project = await project_of(ctx, op)
    if project.deleted_at is not None:
        return None
    await ctx.driver.reattach_tenant(project_id=project.id)

    async def attached(tx: Tx) -> None:
        await tx.set_project_storage(project_id=project.id, state="attached")

    return attached


async def tenant_attach(ctx: Context, op: Operation) -> OnFinish | None:
    """The project's data made hot on this node: from its archive, or (its node lost) rebuilt
    from its branches' history on shared storage. Its computes, which ran elsewhere if at all,
    are idle here until started."""
    project = await project_of(ctx, op)
    if project.deleted_at is not None:
        return None
    async with ctx.store.read() as tx:
        # A branch still being made has no history of its own: its creation, started again
        # after this, makes it.
        branch_ids = [b.id for b in await tx.list_branches(project.id) if b.current_state != "init"]
    await ctx.driver.attach_tenant(
        project_id=project.id,
        branch_ids=sorted(branch_ids),
        pg_version=project.pg_version,
        history_retention_seconds=project.history_retention_seconds,
    )

    async def attached(tx: Tx) -> None:
        await _not_running(tx, project.id, storage="attached")

    return attached

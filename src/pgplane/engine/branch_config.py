"""A branch's roles and databases applied on its data, and an endpoint marked active: shared by
the handlers of configuration changes and of restores (which apply the branch's roles anew)."""

from __future__ import annotations

from pgplane.compute.driver import ConfigChange, DatabaseSpec
from pgplane.core import clock
from pgplane.core.models import Project
from pgplane.engine import rolesync
from pgplane.engine.context import Context, OnFinish, compute_spec, role_specs
from pgplane.store import Tx


def mark_active(endpoint_id: str) -> OnFinish:
    async def active(tx: Tx) -> None:
        await tx.set_endpoint_state(
            endpoint_id=endpoint_id, current_state="active", pending_state=None, now=clock.now_us()
        )

    return active


async def apply_roles_and_databases(
    ctx: Context, project: Project, branch_id: str
) -> OnFinish | None:
    async with ctx.store.read() as tx:
        branch = await tx.get_branch(project_id=project.id, branch_id=branch_id)
        if branch is None:
            return None  # deleted since
        roles = await tx.list_roles(branch_id)
        gone_roles = await tx.list_roles(branch_id, deleted=True)
        databases = await tx.list_databases(branch_id)
        gone_databases = await tx.list_databases(branch_id, deleted=True)
        computes = [
            e
            for e in await tx.list_endpoints(project.id)
            if e.branch_id == branch_id and e.type == "read_write" and not e.disabled
        ]
    live_roles = {r.name for r in roles}
    live_databases = {d.name for d in databases}
    change = ConfigChange(
        roles=role_specs(project, roles),
        databases=[DatabaseSpec(name=d.name, owner_name=d.owner_name) for d in databases],
        renamed_databases={
            d.applied_name: d.name
            for d in databases
            if d.applied_name is not None and d.applied_name != d.name
        },
        # A name that is live again (deleted, then created anew) is kept, not dropped.
        dropped_databases=[
            d.applied_name
            for d in gone_databases
            if d.applied_name is not None and d.applied_name not in live_databases
        ],
        dropped_roles=[r.name for r in gone_roles if r.name not in live_roles],
    )
    compute = computes[0] if computes else None
    spec = compute_spec(project, compute) if compute else None
    await ctx.driver.apply_config(
        project_id=project.id,
        branch_id=branch_id,
        pg_version=project.pg_version,
        compute=spec,
        change=change,
    )
    synced = None if spec is None else await rolesync.read(ctx.driver, spec)

    async def applied(tx: Tx) -> None:
        # Exactly what was applied: later changes have operations of their own.
        await tx.mark_databases_applied([(d.id, d.name) for d in databases])
        await tx.purge_databases([d.id for d in gone_databases])
        await tx.purge_roles(branch_id=branch_id, tombstones=gone_roles)
        if compute is not None:
            await mark_active(compute.id)(tx)
        await rolesync.write(tx, branch_id=branch_id, verifiers=synced)

    return applied


async def restart_replicas(ctx: Context, project: Project, branch_id: str) -> None:
    """Start the branch's read-only computes that should run (after a restore stopped them: a
    replica's data is a copy of the branch's, made anew as it starts)."""
    async with ctx.store.read() as tx:
        endpoints = await tx.list_endpoints(project.id)
    primary = rolesync.branch_compute(endpoints, branch_id)
    for e in endpoints:
        if (
            e.branch_id == branch_id
            and e.type == "read_only"
            and not e.disabled
            and "active" in (e.current_state, e.pending_state)
        ):
            await ctx.driver.start_compute(compute_spec(project, e, primary))

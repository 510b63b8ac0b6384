"""One handler per action. Each converges ("make it so"), so a retry after a crash is safe.

A handler does the data-plane work and returns what to record in the store when the operation
finishes; the engine writes that in the same transaction that marks the operation finished.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import msgspec

from pgplane import failpoints
from pgplane.compute.driver import (
    BranchStorage,
    ComputeError,
    DatabaseSpec,
    PortInUse,
)
from pgplane.core import clock
from pgplane.core.models import Endpoint, Operation, Project
from pgplane.core.operations import Action
from pgplane.engine import rolesync, usage
from pgplane.engine.branch_config import apply_roles_and_databases, mark_active
from pgplane.engine.context import (
    Context,
    Handler,
    OnFinish,
    PermanentError,
    branch_at_work,
    compute_spec,
    project_of,
    require_branch,
    role_specs,
)
from pgplane.engine.history_handlers import (
    point_of,
    record_start,
    restore_branch,
    restore_given_up,
)
from pgplane.engine.masking_handlers import anonymize, anonymize_given_up
from pgplane.engine.schema_only import create_schema_only
from pgplane.engine.snapshot_handlers import (
    branch_from_snapshot,
    create_snapshot,
    create_snapshot_given_up,
    delete_snapshot,
    restore_snapshot,
)
from pgplane.engine.tenant_handlers import (
    apply_storage_config,
    check_availability,
    delete_tenant,
    tenant_attach,
    tenant_detach,
    tenant_reattach,
)
from pgplane.services import anonymized
from pgplane.services.endpoints import allocate_port
from pgplane.store import Tx

log = logging.getLogger(__name__)


async def create_timeline(ctx: Context, op: Operation) -> OnFinish | None:
    project = await project_of(ctx, op)
    branch_id = require_branch(op)
    if project.deleted_at is not None:
        return None
    async with ctx.store.read() as tx:
        roles = await tx.list_roles(branch_id)
        databases = await tx.list_databases(branch_id)
    # The history window decides whether the root branch's first base state is taken.
    await ctx.driver.apply_storage_config(
        project_id=project.id, history_retention_seconds=project.history_retention_seconds
    )
    await ctx.driver.create_timeline(
        project_id=project.id,
        branch_id=branch_id,
        pg_version=project.pg_version,
        roles=role_specs(project, roles),
        databases=[DatabaseSpec(name=d.name, owner_name=d.owner_name) for d in databases],
    )

    async def ready(tx: Tx) -> None:
        await tx.set_branch_state(
            branch_id=branch_id, current_state="ready", pending_state=None, now=clock.now_us()
        )

    return ready


async def start_compute(ctx: Context, op: Operation) -> OnFinish | None:
    project = await project_of(ctx, op)
    if project.deleted_at is not None or op.endpoint_id is None:
        return None
    async with ctx.store.read() as tx:
        endpoint = await tx.get_endpoint(project_id=project.id, endpoint_id=op.endpoint_id)
    if endpoint is None or endpoint.disabled:
        return None  # deleted or disabled since: nothing to start
    await _start(ctx, project, endpoint)
    return mark_active(endpoint.id)


async def _start(ctx: Context, project: Project, endpoint: Endpoint) -> None:
    """Start (or restart with changed settings) the endpoint's compute."""
    async with ctx.store.read() as tx:
        masking = await tx.get_masking(endpoint.branch_id)
    if not anonymized.served(masking):
        raise PermanentError(anonymized.unmasked(endpoint.branch_id))
    primary = None
    if endpoint.type == "read_only":  # it follows its branch's read-write compute
        async with ctx.store.read() as tx:
            found = await tx.list_endpoints(project.id)
        primary = rolesync.branch_compute(found, endpoint.branch_id)
    try:
        await ctx.driver.start_compute(compute_spec(project, endpoint, primary))
    except PortInUse as exc:
        # Another program took the port while the compute was down. Clients never see it (the
        # proxy reaches the compute by its own socket), so the compute moves to a free one.
        endpoint = await _move_port(ctx, endpoint, exc.port)
        await ctx.driver.start_compute(compute_spec(project, endpoint, primary))


async def _move_port(ctx: Context, endpoint: Endpoint, taken: int) -> Endpoint:
    async with ctx.store.write() as tx:
        current = await tx.get_endpoint(project_id=endpoint.project_id, endpoint_id=endpoint.id)
        if current is None:
            raise PermanentError(f"endpoint {endpoint.id} was deleted")
        if current.port != taken:
            return current  # moved already (by an earlier attempt)
        moved = msgspec.structs.replace(current, port=await allocate_port(tx, ctx.settings))
        await tx.set_endpoint_port(endpoint_id=moved.id, port=moved.port, now=clock.now_us())
    log.warning("endpoint %s: port %d is taken, moved to %d", endpoint.id, taken, moved.port)
    return moved


async def suspend_compute(ctx: Context, op: Operation) -> OnFinish | None:
    if op.endpoint_id is None:
        raise PermanentError("suspend_compute needs an endpoint")
    endpoint_id, branch_id = op.endpoint_id, require_branch(op)
    project = await project_of(ctx, op)
    async with ctx.store.read() as tx:
        endpoint = await tx.get_endpoint(project_id=project.id, endpoint_id=endpoint_id)
    # A compute its tenant stopped (SIGSTOP) answers nothing: asked nothing, it is killed at
    # once, so the operation's slot is not held through each question's timeout.
    halted = await ctx.driver.compute_halted(
        project_id=op.project_id, branch_id=branch_id, endpoint_id=endpoint_id
    )
    if halted:
        log.warning("endpoint %s: its compute was stopped by its tenant: killed", endpoint_id)
    # Its roles, read while it still runs: once suspended, only the store can tell the proxy.
    # (A read-only compute's are its primary's, maybe older: not read.) The compute stopped is
    # the one on the operation's branch: a finalized restore stops it on the data it left.
    synced = (
        None
        if endpoint is None or endpoint.type != "read_write" or halted
        else await rolesync.read(
            ctx.driver,
            compute_spec(project, msgspec.structs.replace(endpoint, branch_id=branch_id)),
        )
    )
    await failpoints.reached("suspend_compute:roles_read")
    asked = endpoint is not None and not halted
    sizes = await _last_sizes(ctx, op.project_id, branch_id) if asked else None
    await ctx.driver.stop_compute(
        project_id=op.project_id, branch_id=branch_id, endpoint_id=endpoint_id
    )
    # Its last figures, read by the driver as it stopped: recorded whole, with its suspend
    # (also when the endpoint was deleted: a project's figures count its deleted computes).
    used = await ctx.driver.compute_usage(
        project_id=op.project_id, branch_id=branch_id, endpoint_id=endpoint_id
    )

    async def idle(tx: Tx) -> None:
        now = clock.now_us()
        await tx.set_endpoint_state(
            endpoint_id=endpoint_id, current_state="idle", pending_state=None, now=now
        )
        await rolesync.write(tx, branch_id=branch_id, verifiers=synced)
        if sizes is not None:
            await usage.record_sizes(
                tx, sizes, project_id=op.project_id, branch_id=branch_id, now_us=now
            )
        await usage.record(
            tx,
            used,
            endpoint_id=endpoint_id,
            project_id=op.project_id,
            branch_id=branch_id,
            default_cpus=usage.DELETED_CPUS
            if endpoint is None
            else endpoint.autoscaling_limit_max_cu,
            now_us=now,
        )

    return idle


async def _last_sizes(ctx: Context, project_id: str, branch_id: str) -> BranchStorage | None:
    """The branch's logical size and WAL position, asked of its compute before it stops (the
    disk is walked by the next sample); None when it cannot say, which never stops a suspend."""
    try:
        return await ctx.driver.branch_storage(
            project_id=project_id, branch_id=branch_id, walk=False
        )
    except ComputeError as exc:
        log.warning("branch %s: sizes not read before the suspend: %s", branch_id, exc)
        return None


async def create_branch(ctx: Context, op: Operation) -> OnFinish | None:
    found = await branch_at_work(ctx, op)
    if found is None:
        return None
    project, branch = found
    branch_id = branch.id
    if branch.init_source == "schema-only":
        return await create_schema_only(ctx, op, project, branch)
    parent_id = op.source_branch_id or branch.parent_id
    if parent_id is None:
        raise PermanentError(f"branch {branch_id} has no parent to copy")
    async with ctx.store.read() as tx:
        parent_compute = rolesync.branch_compute(await tx.list_endpoints(project.id), parent_id)
    # The copy carries the parent's roles, so the proxy must know them for the new branch too.
    synced = (
        None
        if parent_compute is None
        else await rolesync.read(ctx.driver, compute_spec(project, parent_compute))
    )
    lsn = await ctx.driver.create_branch(
        project_id=project.id,
        parent_branch_id=parent_id,
        branch_id=branch_id,
        pg_version=project.pg_version,
        point=point_of(op),
    )

    async def ready(tx: Tx) -> None:
        await tx.set_branch_state(
            branch_id=branch_id, current_state="ready", pending_state=None, now=clock.now_us()
        )
        await record_start(tx, project.id, branch_id, lsn)
        await tx.copy_role_verifiers(from_branch_id=parent_id, to_branch_id=branch_id)
        if synced:  # an empty read (the parent is not running) keeps what was copied
            await tx.set_role_verifiers(branch_id=branch_id, verifiers=synced)

    return ready


async def delete_timeline(ctx: Context, op: Operation) -> OnFinish | None:
    await ctx.driver.delete_timeline(project_id=op.project_id, branch_id=require_branch(op))
    return None


async def apply_config(ctx: Context, op: Operation) -> OnFinish | None:
    """An endpoint's new settings (restart it if it runs), or a branch's roles and databases."""
    project = await project_of(ctx, op)
    if project.deleted_at is not None:
        return None
    if op.endpoint_id is not None:
        async with ctx.store.read() as tx:
            endpoint = await tx.get_endpoint(project_id=project.id, endpoint_id=op.endpoint_id)
        # Whether the compute should run is the endpoint's state, not whether a postmaster runs
        # now: a restart that failed left none, and the retry must start it with the new
        # settings, not call the change done. A suspended compute takes them at its next start.
        if (
            endpoint is None
            or endpoint.disabled
            or "active" not in (endpoint.current_state, endpoint.pending_state)
        ):
            return None
        try:
            await _start(ctx, project, endpoint)  # a restart if the settings changed
        except ComputeError:
            # The old postmaster is gone and the new one did not start: say so until one does.
            await _mark_down(ctx, endpoint.id)
            raise
        return mark_active(endpoint.id)
    return await apply_roles_and_databases(ctx, project, require_branch(op))


async def _mark_down(ctx: Context, endpoint_id: str) -> None:
    async with ctx.store.write() as tx:
        await tx.set_endpoint_state(
            endpoint_id=endpoint_id,
            current_state="idle",
            pending_state="active",
            now=clock.now_us(),
        )


async def _suspend_given_up(tx: Tx, op: Operation) -> None:
    """A suspend that failed for good leaves the endpoint as it was, and due another try.

    Left pending ``idle``, the endpoint would say a suspend is under way for ever, and the
    scheduler, which leaves an endpoint with a change pending alone, would never suspend it
    again. A change asked for since (a start: pending ``active``) is left to its own operation.
    """
    if op.endpoint_id is None:
        return
    endpoint = await tx.get_endpoint(project_id=op.project_id, endpoint_id=op.endpoint_id)
    if endpoint is not None and endpoint.pending_state == "idle":
        await tx.set_endpoint_state(
            endpoint_id=endpoint.id,
            current_state=endpoint.current_state,
            pending_state=None,
            now=clock.now_us(),
        )


async def _start_given_up(tx: Tx, op: Operation) -> None:
    """A start (or a restart with new settings) that failed for good: the endpoint says so.

    Left pending ``active``, it would read "idle → active" for ever. Its compute is not
    running (the attempts stopped what they started); the next connection or start tries
    again, and the failed operation says why this one could not.
    """
    if op.endpoint_id is None:
        return
    endpoint = await tx.get_endpoint(project_id=op.project_id, endpoint_id=op.endpoint_id)
    if endpoint is not None and endpoint.pending_state == "active":
        await tx.set_endpoint_state(
            endpoint_id=endpoint.id,
            current_state=endpoint.current_state,
            pending_state=None,
            now=clock.now_us(),
        )


GivenUp = Callable[[Tx, Operation], Awaitable[None]]

# What an action that failed for good must undo, written with its failure.
GIVEN_UP: dict[Action, GivenUp] = {
    Action.ANONYMIZE: anonymize_given_up,
    Action.SUSPEND_COMPUTE: _suspend_given_up,
    Action.START_COMPUTE: _start_given_up,
    Action.APPLY_CONFIG: _start_given_up,
    Action.CREATE_TIMELINE: restore_given_up,
    Action.CREATE_SNAPSHOT: create_snapshot_given_up,
}

HANDLERS: dict[Action, Handler] = {
    Action.ANONYMIZE: anonymize,
    # With a snapshot: a branch restored from it (a copy of the snapshot, not of a parent).
    Action.CREATE_BRANCH: lambda ctx, op: (
        branch_from_snapshot(ctx, op) if op.snapshot_id else create_branch(ctx, op)
    ),
    Action.CREATE_SNAPSHOT: create_snapshot,
    Action.DELETE_SNAPSHOT: delete_snapshot,
    Action.DELETE_TIMELINE: delete_timeline,
    Action.APPLY_CONFIG: apply_config,
    # With a snapshot or a source branch: a restore (the branch gets a new timeline).
    Action.CREATE_TIMELINE: lambda ctx, op: (
        restore_snapshot(ctx, op)
        if op.snapshot_id
        else restore_branch(ctx, op)
        if op.source_branch_id
        else create_timeline(ctx, op)
    ),
    Action.START_COMPUTE: start_compute,
    Action.SUSPEND_COMPUTE: suspend_compute,
    Action.APPLY_STORAGE_CONFIG: apply_storage_config,
    Action.DELETE_TENANT: delete_tenant,
    Action.CHECK_AVAILABILITY: check_availability,
    Action.TENANT_DETACH: tenant_detach,
    Action.TENANT_REATTACH: tenant_reattach,
    # Start-up reconciliation's attach of a project found only in the archive, and a lost
    # node's project brought back on another (services/moves.py).
    Action.TENANT_ATTACH: tenant_attach,
}

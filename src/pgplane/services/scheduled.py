"""The operations the platform starts on its own: idle suspend, availability checks, detach,
the deletion of expired branches.

Each re-reads what it acts on inside the caller's write transaction, so a decision made on a
slightly stale read (the scheduler's) never starts work that is no longer due.
"""

from __future__ import annotations

import msgspec

from pgplane.core import clock
from pgplane.core.models import Endpoint, Operation
from pgplane.core.operations import Action
from pgplane.services import branches, operations
from pgplane.store import Tx


async def suspend_idle(tx: Tx, *, endpoint_id: str, idle_before: int) -> Operation | None:
    """``suspend_compute`` for an endpoint still active and unused since ``idle_before``."""
    endpoint = await tx.find_endpoint(endpoint_id)
    if endpoint is None or max(endpoint.last_active or 0, endpoint.started_at or 0) >= idle_before:
        return None
    return await _suspend(tx, endpoint)


async def suspend_for_stop(
    tx: Tx, *, tried: set[str], mine: set[str] | None = None
) -> list[Operation]:
    """``suspend_compute`` for every active endpoint not in ``tried``, used or not: ``serve
    --stop-computes`` stopping. One with an operation under way is left for the next call.
    ``mine``: only the endpoints of these projects (the stopping node's)."""
    started = []
    for endpoint in await tx.list_live_endpoints():
        if endpoint.id in tried or (mine is not None and endpoint.project_id not in mine):
            continue
        op = await _suspend(tx, endpoint)
        if op is not None:
            started.append(op)
    return started


async def active_endpoints(tx: Tx, mine: set[str] | None = None) -> list[str]:
    """Endpoints running or about to change (their compute may be up when this returns); of
    the projects ``mine`` only, when given."""
    return [
        e.id
        for e in await tx.list_live_endpoints()
        if (e.current_state == "active" or e.pending_state is not None)
        and (mine is None or e.project_id in mine)
    ]


async def _suspend(tx: Tx, endpoint: Endpoint) -> Operation | None:
    if endpoint.current_state != "active" or endpoint.pending_state is not None:
        return None
    unsettled = await tx.list_unsettled_operations(project_id=endpoint.project_id)
    if any(o.endpoint_id == endpoint.id or o.branch_id is None for o in unsettled):
        return None  # something is about to change it anyway; look again next tick
    await tx.update_endpoint(
        msgspec.structs.replace(endpoint, pending_state="idle", updated_at=clock.now_us())
    )
    (op,) = await operations.start(
        tx,
        project_id=endpoint.project_id,
        starts=[
            operations.Start(
                Action.SUSPEND_COMPUTE, branch_id=endpoint.branch_id, endpoint_id=endpoint.id
            )
        ],
    )
    return op


async def check_availability(tx: Tx, *, project_id: str, branch_id: str) -> Operation | None:
    project = await tx.get_project_by_id(project_id)
    if project is None or project.deleted_at is not None or project.storage_state != "attached":
        return None
    unsettled = await tx.list_unsettled_operations(project_id=project_id)
    if any(o.action is Action.CHECK_AVAILABILITY and o.branch_id == branch_id for o in unsettled):
        return None
    (op,) = await operations.start(
        tx,
        project_id=project_id,
        starts=[operations.Start(Action.CHECK_AVAILABILITY, branch_id=branch_id)],
    )
    return op


async def detach(tx: Tx, *, project_id: str, idle_before: int) -> Operation | None:
    if project_id not in await tx.detach_candidates(idle_before=idle_before):
        return None
    (op,) = await operations.start(
        tx, project_id=project_id, starts=[operations.Start(Action.TENANT_DETACH)]
    )
    return op


async def expire(tx: Tx, *, project_id: str, branch_id: str, now: int) -> list[Operation] | None:
    """Delete a branch whose ``expires_at`` has come, as a DELETE would; None when it is gone
    already or no longer due (deleted, or its expiry moved, since the scheduler looked).

    The branch is marked deleted in the same transaction that starts its ``delete_timeline``,
    so however many ticks race (or a restarted ``serve`` looks again), one deletion wins.
    A branch that may not be deleted (the default, protected, a parent: the API refuses to let
    an expiring branch become one) raises :class:`pgplane.errors.Conflict` and stays.
    """
    branch = await tx.get_branch(project_id=project_id, branch_id=branch_id)
    if branch is None or branch.expires_at is None or branch.expires_at > now:
        return None
    project = await tx.get_project_by_id(project_id)
    if project is None or project.deleted_at is not None:
        return None
    _, ops = await branches.remove(tx, branch=branch)
    return ops

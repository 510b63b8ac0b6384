"""The operations the platform starts on its own: idle suspend, availability checks, detach.

Each re-reads what it acts on inside the caller's write transaction, so a decision made on a
slightly stale read (the scheduler's) never starts work that is no longer due.
"""

from __future__ import annotations

import msgspec

from pgplane.core import clock
from pgplane.core.models import Operation
from pgplane.core.operations import Action
from pgplane.services import operations
from pgplane.store import Tx


async def suspend_idle(tx: Tx, *, endpoint_id: str, idle_before: int) -> Operation | None:
    """``suspend_compute`` for an endpoint still active and unused since ``idle_before``."""
    endpoint = await tx.find_endpoint(endpoint_id)
    if (
        endpoint is None
        or endpoint.current_state != "active"
        or endpoint.pending_state is not None
        or max(endpoint.last_active or 0, endpoint.started_at or 0) >= idle_before
    ):
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

"""Finalizing a snapshot's restore (Neon's ``finalize_restore``): the branch a snapshot was
restored into, left un-finalized to be inspected first, takes the place of the branch it
replaces (``restored_as``, the restore's target).

As Neon does: the target's computes move to the restored branch (the same endpoint ids, hosts
and connection strings, now serving the snapshot's data: they are restarted), the restored
branch takes the target's name, default flag and protection, and the target is renamed
(``name``, else ``<name> (old)``) and kept with its data, as the restored branch's parent. Its
backup schedule moves too, so the branch now serving keeps being backed up, and so do other
restores waiting to replace it: they replace the branch in its place.

It is one transaction in the store and, for each moved compute, a ``suspend_compute`` on the
target (stopping whatever of it runs on the old data) then, for one that should run, a
``start_compute`` on the restored branch. Each converges, in that order (their scopes overlap
on the endpoint), so a crash anywhere ends the same way: nothing of the computes left on the
old data, those that ran serving the new. Start-up reconciliation leaves a compute with work
in flight to that work, and stops one found on a branch other than its endpoint's.
"""

from __future__ import annotations

import msgspec

from pgplane.core import clock
from pgplane.core.models import Branch, Endpoint, Operation
from pgplane.core.operations import Action
from pgplane.errors import BadRequest, Conflict, Locked
from pgplane.services import access, anonymized, expiry, names, operations
from pgplane.store import Tx

RESTORED = "restored"
FINALIZED = "finalized"
_MAX_OLD_NAMES = 100


async def finalize(
    tx: Tx, *, account_id: str, project_id: str, branch_id: str, name: str | None
) -> list[Operation]:
    """``branch_id``: the branch a snapshot was restored into; ``name``: the replaced branch's
    new name."""
    project = await access.live_project(tx, account_id=account_id, project_id=project_id)
    restored = await access.branch(tx, project_id=project.id, branch_id=branch_id)
    old_name = names.branch(name) if name is not None else None
    if restored.restore_status == FINALIZED:
        raise Conflict(f"the restore of branch {restored.id} was finalized already")
    if restored.restore_status != RESTORED or restored.restored_as is None:
        raise BadRequest(
            f"branch {restored.id} has no restore to finalize: only a branch a snapshot was"
            " restored into without finalize_restore can be finalized"
        )
    if restored.current_state != "ready":
        raise Locked(
            f"branch {restored.id} is still being restored from snapshot"
            f" {restored.restored_from}; try again once its operations finish"
        )
    target = await tx.get_branch(project_id=project.id, branch_id=restored.restored_as)
    if target is None:
        raise Conflict(
            f"branch {restored.restored_as}, which the restore was to replace, was deleted"
        )
    anonymized.refuse_restore(target)
    _, ops = await replace(tx, project.id, restored, target, old_name)
    return ops


async def replace(
    tx: Tx, project_id: str, restored: Branch, target: Branch, old_name: str | None
) -> tuple[Branch, list[Operation]]:
    """``restored`` takes ``target``'s place (its computes, name, flags, schedule); ``target``
    is renamed ``old_name`` (None: ``<name> (old)``). Also a restore's own last step with
    ``finalize_restore``, in the transaction that made ``restored``: its computes start once
    its data is built (their starts follow its ``create_branch``)."""
    # It takes the target's default flag and protection, which an expiring branch cannot hold
    # (the scheduler would delete the default, and every compute moved onto it).
    if target.default:
        expiry.refuse_if_expiring(restored, "it would become the default", field="expires_at")
    if target.protected:
        expiry.refuse_if_expiring(restored, "it would become protected", field="expires_at")
    endpoints = await tx.list_endpoints(project_id)
    moving = _moving(endpoints, target.id)
    _refuse_two_writers(endpoints, moving, restored)
    now = clock.now_us()
    branches = await tx.list_branches(project_id)
    if old_name is None:
        old_name = _free_name(f"{target.name} (old)", branches)
    # The old name first: the restored branch takes it in the same transaction.
    await tx.update_branch(
        msgspec.structs.replace(
            target, name=old_name, default=False, protected=False, updated_at=now
        )
    )
    replaced = msgspec.structs.replace(
        restored,
        name=target.name,
        default=target.default,
        protected=target.protected,
        restore_status=FINALIZED,
        updated_at=now,
    )
    await tx.update_branch(replaced)
    # Other restores waiting to replace the target now replace the branch in its place.
    for b in branches:
        if b.restore_status == RESTORED and b.restored_as == target.id and b.id != restored.id:
            await tx.update_branch(msgspec.structs.replace(b, restored_as=restored.id))
    await _move_schedule(tx, project_id, target.id, restored.id, now)
    return replaced, await _move_computes(tx, project_id, moving, target.id, restored.id, now)


def _moving(endpoints: list[Endpoint], branch_id: str) -> list[Endpoint]:
    """The branch's computes, its read-write one first (its replicas start after it)."""
    found = [e for e in endpoints if e.branch_id == branch_id]
    return sorted(found, key=lambda e: e.type != "read_write")


def _refuse_two_writers(endpoints: list[Endpoint], moving: list[Endpoint], to: Branch) -> None:
    if not any(e.type == "read_write" for e in moving):
        return
    own = next((e for e in endpoints if e.branch_id == to.id and e.type == "read_write"), None)
    if own is not None:
        raise Conflict(
            f"branch {to.id} has a read-write compute of its own ({own.id}), and the replaced"
            " branch's moves to it: a branch has one; delete one of them first"
        )


def _free_name(wanted: str, branches: list[Branch]) -> str:
    """``wanted``, or the first of ``wanted 2``, ``wanted 3``... no live branch holds."""
    taken = {b.name for b in branches}
    for n in range(1, _MAX_OLD_NAMES + 1):
        candidate = wanted if n == 1 else f"{wanted} {n}"
        if candidate not in taken:
            return names.branch(candidate[: names.MAX_OBJECT_NAME])
    raise Conflict(f"every name from {wanted!r} to {wanted!r} {_MAX_OLD_NAMES} is taken: send name")


async def _move_schedule(tx: Tx, project_id: str, old: str, new: str, now: int) -> None:
    held = await tx.get_backup_schedule(old)
    if held is None or await tx.get_backup_schedule(new) is not None:
        return
    await tx.set_backup_schedule(project_id=project_id, branch_id=new, schedule=held[0], now=now)
    await tx.set_backup_schedule(project_id=project_id, branch_id=old, schedule=[], now=now)


async def _move_computes(
    tx: Tx, project_id: str, moving: list[Endpoint], old: str, new: str, now: int
) -> list[Operation]:
    stops, starts = [], []
    for e in moving:
        # Runs, or is to: not one a suspend was asked of (it stays suspended, on the new data).
        wanted = e.pending_state or e.current_state
        runs = not e.disabled and wanted == "active"
        await tx.set_endpoint_branch(endpoint_id=e.id, branch_id=new, now=now)
        if runs:
            # Pending until its start on the new data: the scheduler leaves it alone meanwhile,
            # and a connection waits for that start (services/endpoints.py wake).
            await tx.set_endpoint_state(
                endpoint_id=e.id, current_state=e.current_state, pending_state="active", now=now
            )
            starts.append(operations.Start(Action.START_COMPUTE, branch_id=new, endpoint_id=e.id))
        # Whatever of it runs on the old data stops (a no-op for one that does not run).
        stops.append(operations.Start(Action.SUSPEND_COMPUTE, branch_id=old, endpoint_id=e.id))
    if not stops:
        return []
    return await operations.start(tx, project_id=project_id, starts=[*stops, *starts])

"""Restoring a branch: its data replaced by its parent's (a reset), another branch's, or its own
past, keeping its id, its endpoints (their hosts) and its roles' passwords.

As Neon does: the source is the branch itself (then a point, ``source_lsn`` or
``source_timestamp``, and ``preserve_under_name`` are required) or another branch of the
project, at its head or a point of its history. With ``preserve_under_name`` the state before
the restore is kept as a new branch of that name, which becomes the restored branch's parent
(so "reset from parent" undoes the restore) and its children's; a branch with children must
preserve. The work is a ``create_timeline`` with the source (the branch gets a new timeline),
then the preserving branch's ``create_branch`` (see engine/history_handlers.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from pgplane.compute.driver import HistoryBounds, Point
from pgplane.config import Settings
from pgplane.core import clock, ids
from pgplane.core.models import Branch, Operation, Role
from pgplane.core.operations import Action
from pgplane.errors import BadRequest
from pgplane.services import access, anonymized, expiry, history, names, operations, quotas
from pgplane.store import Tx


@dataclass(frozen=True, slots=True)
class RestoreSpec:
    source_branch_id: str
    point: history.NamedPoint | None = None
    preserve_under_name: str | None = None


async def source_of(
    tx: Tx, *, account_id: str, project_id: str, branch_id: str, source_branch_id: str
) -> Branch:
    """The source branch, once the project and the branch are known to be the account's."""
    project = await access.live_project(tx, account_id=account_id, project_id=project_id)
    await access.branch(tx, project_id=project.id, branch_id=branch_id)
    return await access.branch(tx, project_id=project.id, branch_id=source_branch_id)


async def restore(
    tx: Tx,
    *,
    account_id: str,
    project_id: str,
    branch_id: str,
    spec: RestoreSpec,
    settings: Settings,
    bounds: HistoryBounds | None = None,
) -> tuple[Branch, list[Operation]]:
    """``bounds``: what the source's history holds (looked up beforehand, for a point)."""
    project = await access.live_project(tx, account_id=account_id, project_id=project_id)
    branch = await access.branch(tx, project_id=project.id, branch_id=branch_id)
    source = await access.branch(tx, project_id=project.id, branch_id=spec.source_branch_id)
    anonymized.refuse_restore(branch)
    await anonymized.refuse_source(
        tx, source, at_point=spec.point is not None, what="source_branch_id"
    )
    own = source.id == branch.id
    if own and spec.point is None:
        raise BadRequest(
            "source_lsn or source_timestamp is required to restore a branch from its own history"
        )
    if own and not spec.preserve_under_name:
        raise BadRequest("preserve_under_name is required to restore a branch from its own history")
    children = [b for b in await tx.list_branches(project.id) if b.parent_id == branch.id]
    if children and not spec.preserve_under_name:
        raise BadRequest(
            f"preserve_under_name is required: branch {branch.id} has child branches, which"
            " keep the state they were made from"
        )
    if spec.point is not None:
        history.check(spec.point, project=project, branch=source, bounds=bounds or HistoryBounds())
    point = spec.point.point if spec.point else Point()
    now = clock.now_us()
    keeper = None
    if spec.preserve_under_name:
        # The branch that keeps the old state is a new branch of the project: it counts.
        await quotas.check_branches(tx, project_id=project.id, settings=settings)
        keeper = await preserve(tx, branch, names.branch(spec.preserve_under_name), now)
        for child in children:
            await tx.update_branch(
                msgspec.structs.replace(child, parent_id=keeper.id, updated_at=now)
            )
    restored = msgspec.structs.replace(
        branch,
        parent_id=keeper.id if keeper else branch.parent_id,
        parent_lsn=None if point.lsn is None else history.format_lsn(point.lsn),
        parent_timestamp=now if point.time_us is None else point.time_us,
        last_reset_at=now,
        current_state="resetting",
        pending_state="ready",
        state_changed_at=now,
        updated_at=now,
    )
    restored = expiry.restarted(restored, now)  # as Neon: a reset starts the countdown again
    await tx.update_branch(restored)
    starts = [
        operations.Start(
            Action.CREATE_TIMELINE,
            branch_id=branch.id,
            source_branch_id=source.id,
            point_lsn=restored.parent_lsn,
            point_time=point.time_us,
            preserve_branch_id=keeper.id if keeper else None,
        )
    ]
    if keeper is not None:
        starts.append(
            operations.Start(Action.CREATE_BRANCH, branch_id=keeper.id, source_branch_id=branch.id)
        )
    ops = await operations.start(tx, project_id=project.id, starts=starts)
    return restored, ops


async def preserve(tx: Tx, branch: Branch, name: str, now: int) -> Branch:
    """The branch that keeps ``branch``'s state before the restore, with its roles and
    databases (same passwords)."""
    keeper = Branch(
        id=ids.new_branch_id(),
        project_id=branch.project_id,
        parent_id=branch.parent_id,
        name=name,
        default=False,
        protected=False,
        current_state="init",
        pending_state="ready",
        state_changed_at=now,
        created_at=now,
        updated_at=now,
        parent_lsn=branch.parent_lsn,
        parent_timestamp=branch.parent_timestamp,
    )
    await tx.insert_branch(keeper)
    for r in await tx.list_roles(branch.id):
        await tx.insert_role(
            Role(
                branch_id=keeper.id,
                name=r.name,
                password=r.password,
                protected=r.protected,
                login=r.login,
                created_at=now,
                updated_at=now,
            )
        )
    for d in await tx.list_databases(branch.id):
        await tx.insert_database(
            branch_id=keeper.id, name=d.name, owner_name=d.owner_name, now=now, applied_name=d.name
        )
    return keeper

"""Snapshots (Neon's snapshot API): a branch's data at its head, an LSN or a time, kept as a
copy of its own; listed, renamed, expired, deleted, restored into a new branch.

A snapshot is written with the ``create_snapshot`` that builds its data, once the branch's
earlier work is done (its scope is the branch). It keeps the branch's roles (same passwords) and
databases as they were when it was taken, which a branch restored from it gets. A restore is,
as Neon's published spec has it, always into a new branch (that branch's ``create_branch``,
copying the snapshot), which is to replace a target (the snapshot's source branch unless
named). Without ``finalize_restore`` it waits to be finalized (services/finalize.py); with it,
it is finalized in the same request: the target's computes move to it (the same endpoint ids,
hosts and connection strings, serving the snapshot's data once it is built), it takes the
target's name, and the target is kept with its data under ``name`` (else ``<name> (old)``).
Deleting one (or its expiry) is ``delete_snapshot``, which frees its copy; deleting the project
frees them all.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import msgspec

from pgplane.compute.driver import HistoryBounds
from pgplane.config import Settings
from pgplane.core import clock, ids
from pgplane.core.models import Branch, Operation, Project, Role, Snapshot
from pgplane.core.operations import Action
from pgplane.errors import BadRequest, Conflict, NotFound
from pgplane.services import (
    access,
    anonymized,
    expiry,
    finalize,
    history,
    names,
    operations,
    quotas,
)
from pgplane.store import Tx

_US = 1_000_000


@dataclass(frozen=True, slots=True)
class NewSnapshot:
    point: history.NamedPoint | None = None
    name: str | None = None
    expires_at: int | None = None  # us
    slug: str | None = None


@dataclass(frozen=True, slots=True)
class SnapshotChanges:
    """What a PATCH changes: None keeps the name; UNSET keeps the expiry, None clears it."""

    name: str | None = None
    expires_at: int | msgspec.UnsetType | None = msgspec.UNSET


@dataclass(frozen=True, slots=True)
class RestoreSpec:
    name: str | None = None
    target_branch_id: str | None = None
    finalize_restore: bool = False


def parse_expiry(text: str, field: str = "expires_at") -> int:
    """An RFC 3339 time, in us, cut to the second; a 400 naming the field."""
    return history.parse_time(text, field) // _US * _US


def _check_expiry(expires_at: int, now: int, field: str = "expires_at") -> None:
    if expires_at <= now:
        raise BadRequest(
            f"{field} must be in the future: {clock.format_s(expires_at)} has passed"
            f" (it is {clock.format_s(now)})"
        )


async def find(tx: Tx, *, account_id: str, project_id: str, snapshot_id: str) -> Snapshot:
    """The account's snapshot; missing, foreign or malformed ids are the same NotFound."""
    project = await access.live_project(tx, account_id=account_id, project_id=project_id)
    return await _snapshot(tx, project, snapshot_id)


async def _snapshot(tx: Tx, project: Project, snapshot_id: str) -> Snapshot:
    found = None
    if ids.is_valid_id(snapshot_id):
        found = await tx.get_snapshot(project_id=project.id, snapshot_id=snapshot_id)
    if found is None:
        raise NotFound("snapshot not found")
    return found


async def list_(tx: Tx, *, account_id: str, project_id: str) -> list[Snapshot]:
    project = await access.live_project(tx, account_id=account_id, project_id=project_id)
    return await tx.list_snapshots(project.id)


async def branch_of(tx: Tx, *, account_id: str, project_id: str, branch_id: str) -> Branch:
    """The branch a snapshot is taken of, once the project is known to be the account's."""
    project = await access.live_project(tx, account_id=account_id, project_id=project_id)
    return await access.branch(tx, project_id=project.id, branch_id=branch_id)


async def create(
    tx: Tx,
    *,
    account_id: str,
    project_id: str,
    branch_id: str,
    spec: NewSnapshot,
    bounds: HistoryBounds | None = None,
) -> tuple[Snapshot, list[Operation]]:
    """``bounds``: what the branch's history holds (looked up beforehand, for a point)."""
    project = await access.live_project(tx, account_id=account_id, project_id=project_id)
    branch = await access.branch(tx, project_id=project.id, branch_id=branch_id)
    await anonymized.refuse_source(tx, branch, at_point=spec.point is not None, what="snapshot")
    if spec.point is not None:
        history.check(spec.point, project=project, branch=branch, bounds=bounds or HistoryBounds())
    now = clock.now_us()
    if spec.expires_at is not None:
        _check_expiry(spec.expires_at, now)
    if spec.slug is not None:
        _check_slug(spec.slug)
        if await tx.snapshot_slug_taken(project_id=project.id, slug=spec.slug):
            raise Conflict(f"slug {spec.slug!r} is taken by another snapshot of the project")
    return await take(
        tx,
        project=project,
        branch=branch,
        point=spec.point,
        name=names.snapshot(spec.name) if spec.name is not None else None,
        expires_at=spec.expires_at,
        manual=True,
        slot=None,
        now=now,
        slug=spec.slug,
    )


# Neon's (createSnapshot's slug): a lowercase letter, then lowercase letters, digits or
# hyphens, ending with a letter or digit; 63 characters at most.
_SLUG = re.compile(r"[a-z](?:[a-z0-9-]{0,61}[a-z0-9])?")


def _check_slug(slug: str) -> None:
    if _SLUG.fullmatch(slug) is None:
        raise BadRequest(
            "slug: 1 to 63 characters, a lowercase letter first, then lowercase letters,"
            " digits or hyphens, ending with a letter or a digit"
        )


async def take(
    tx: Tx,
    *,
    project: Project,
    branch: Branch,
    point: history.NamedPoint | None,
    name: str | None,
    expires_at: int | None,
    manual: bool,
    slot: str | None,
    now: int,
    slug: str | None = None,
) -> tuple[Snapshot, list[Operation]]:
    """The snapshot written and its ``create_snapshot`` started (a request's or a schedule's:
    a slot or a slug taken already raises Conflict). Without a slug, its id is its slug."""
    snapshot_id = ids.new_snapshot_id()
    at = point.point if point else None
    shown_time = at.time_us if at is not None else now
    snapshot = Snapshot(
        id=snapshot_id,
        slug=slug or snapshot_id,
        project_id=project.id,
        source_branch_id=branch.id,
        name=name or f"{branch.name} {clock.format_s(shown_time if shown_time else now)}",
        state="creating",
        manual=manual,
        roles=[
            {"name": r.name, "password": r.password, "protected": r.protected, "login": r.login}
            for r in await tx.list_roles(branch.id)
        ],
        databases=[
            {"name": d.name, "owner_name": d.owner_name} for d in await tx.list_databases(branch.id)
        ],
        created_at=now,
        updated_at=now,
        lsn=history.format_lsn(at.lsn) if at is not None and at.lsn is not None else None,
        point_time=shown_time,
        schedule_slot=slot,
        expires_at=expires_at,
    )
    await tx.insert_snapshot(snapshot)
    ops = await operations.start(
        tx,
        project_id=project.id,
        starts=[
            operations.Start(
                Action.CREATE_SNAPSHOT,
                branch_id=branch.id,
                snapshot_id=snapshot.id,
                point_lsn=snapshot.lsn,
                point_time=at.time_us if at is not None else None,
            )
        ],
    )
    return snapshot, ops


async def update(
    tx: Tx, *, account_id: str, project_id: str, snapshot_id: str, changes: SnapshotChanges
) -> Snapshot:
    snapshot = await find(tx, account_id=account_id, project_id=project_id, snapshot_id=snapshot_id)
    now = clock.now_us()
    updated = msgspec.structs.replace(
        snapshot,
        name=snapshot.name if changes.name is None else names.snapshot(changes.name),
        updated_at=now,
    )
    if not isinstance(changes.expires_at, msgspec.UnsetType):
        if changes.expires_at is not None:
            _check_expiry(changes.expires_at, now, "snapshot.expires_at")
        updated = msgspec.structs.replace(updated, expires_at=changes.expires_at)
    await tx.update_snapshot(updated)
    return updated


async def delete(tx: Tx, *, account_id: str, project_id: str, snapshot_id: str) -> list[Operation]:
    snapshot = await find(tx, account_id=account_id, project_id=project_id, snapshot_id=snapshot_id)
    return await remove(tx, snapshot=snapshot)


async def remove(tx: Tx, *, snapshot: Snapshot) -> list[Operation]:
    """The deletion itself (a DELETE's, an expiry's): marked deleted with its ``delete_snapshot``
    in one transaction, so one deletion wins however many race."""
    now = clock.now_us()
    await tx.update_snapshot(msgspec.structs.replace(snapshot, deleted_at=now, updated_at=now))
    # Project-wide: it waits for every earlier operation, a restore from it among them.
    return await operations.start(
        tx,
        project_id=snapshot.project_id,
        starts=[operations.Start(Action.DELETE_SNAPSHOT, snapshot_id=snapshot.id)],
    )


async def restore(
    tx: Tx,
    *,
    account_id: str,
    project_id: str,
    snapshot_id: str,
    spec: RestoreSpec,
    settings: Settings,
) -> tuple[Branch, list[Operation]]:
    """Into a new branch (its parent the target), or, with ``finalize_restore``, onto the
    target itself; the target is the snapshot's source branch unless named."""
    project = await access.live_project(tx, account_id=account_id, project_id=project_id)
    snapshot = await _snapshot(tx, project, snapshot_id)
    if snapshot.state == "failed":
        raise Conflict(f"snapshot {snapshot.id} could not be taken; it has no data to restore")
    target_id = spec.target_branch_id or snapshot.source_branch_id
    target = await tx.get_branch(project_id=project.id, branch_id=target_id)
    if target is None:
        if spec.target_branch_id is not None:
            raise NotFound("branch not found")
        raise BadRequest(
            f"target_branch_id is required: branch {snapshot.source_branch_id}, the snapshot's"
            " source, was deleted"
        )
    await quotas.check_branches(tx, project_id=project.id, settings=settings)
    now = clock.now_us()
    if not spec.finalize_restore:
        return await _into_new(tx, project, snapshot, target, spec.name, now)
    anonymized.refuse_restore(target)  # finalized, it would serve the snapshot's data
    # Named for now by its id; finalized, it takes the target's name, and ``name`` the target.
    branch, ops = await _into_new(tx, project, snapshot, target, None, now)
    old_name = names.branch(spec.name) if spec.name is not None else None
    finalized, moves = await finalize.replace(tx, project.id, branch, target, old_name)
    return finalized, ops + moves


async def _into_new(
    tx: Tx, project: Project, snapshot: Snapshot, parent: Branch, name: str | None, now: int
) -> tuple[Branch, list[Operation]]:
    expiry.refuse_if_expiring(
        parent, "an expiring branch cannot have children", field="target_branch_id"
    )
    branch_id = ids.new_branch_id()
    branch = Branch(
        id=branch_id,
        project_id=project.id,
        parent_id=parent.id,
        name=names.branch(name) if name is not None else branch_id,
        default=False,
        protected=False,
        current_state="init",
        pending_state="ready",
        state_changed_at=now,
        created_at=now,
        updated_at=now,
        parent_lsn=snapshot.lsn,
        parent_timestamp=snapshot.point_time,
        # Waiting to be finalized (services/finalize.py): then it takes the parent's place.
        restored_from=snapshot.id,
        restore_status="restored",
        restored_as=parent.id,
    )
    await tx.insert_branch(branch)
    await _give_objects(tx, snapshot, branch_id, now)
    ops = await operations.start(
        tx,
        project_id=project.id,
        starts=[
            operations.Start(
                Action.CREATE_BRANCH,
                branch_id=branch_id,
                # Ordering only: after the snapshot's own create_snapshot on its branch.
                source_branch_id=snapshot.source_branch_id,
                snapshot_id=snapshot.id,
            )
        ],
    )
    return branch, ops


async def _give_objects(tx: Tx, snapshot: Snapshot, branch_id: str, now: int) -> None:
    """The snapshot's roles (same passwords) and databases, as the new branch's in the store."""
    for r in snapshot.roles:
        role = Role(
            branch_id=branch_id,
            name=str(r["name"]),
            password=str(r["password"]),
            protected=bool(r.get("protected", False)),
            login=bool(r.get("login", True)),
            created_at=now,
            updated_at=now,
        )
        await tx.insert_role(role)
    for d in snapshot.databases:
        await tx.insert_database(
            branch_id=branch_id,
            name=d["name"],
            owner_name=d["owner_name"],
            now=now,
            applied_name=d["name"],
        )

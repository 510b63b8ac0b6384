"""Branches: copies of a parent at its head, listed, renamed, protected, made default, deleted.

Creating a branch writes it with its parent's roles (same passwords) and databases, any computes
asked for, and ``create_branch``, which copies the parent's data once the parent's earlier work
is done (see :class:`pgplane.core.operations.Scope`). A schema-only branch (Neon's
``init_source``) is written the same way but as a root (no parent, no point shown): its
``create_branch`` names the parent only as the source of the schema and roles it is built from.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import msgspec

from pgplane.compute.driver import HistoryBounds, Point
from pgplane.config import Settings
from pgplane.core import clock, ids
from pgplane.core.models import Annotation, Branch, Database, Endpoint, Operation, Role
from pgplane.core.operations import Action
from pgplane.errors import BadRequest, Conflict
from pgplane.services import (
    access,
    anonymized,
    compute_settings,
    endpoints,
    expiry,
    history,
    names,
    operations,
    quotas,
)
from pgplane.store import Tx

MAX_LIMIT = 10_000
SORT_FIELDS = ("updated_at", "created_at", "name")


@dataclass(frozen=True, slots=True)
class NewBranch:
    name: str | None = None
    parent_id: str | None = None
    protected: bool = False
    endpoints: Sequence[endpoints.EndpointSpec] = ()
    point: history.NamedPoint | None = None  # a point of the parent's history, not its head
    expires_at: int | None = None  # when the platform deletes it (us, see services/expiry.py)
    annotation: Mapping[str, str] = field(default_factory=dict)
    # Neon's init_source schema-only: a root branch built from the parent's schema and roles
    # (at ``point``), with no rows and no parent (the parent is only its source).
    schema_only: bool = False
    # An anonymized branch's checked masking rules (services/anonymized.py), and whether its
    # masking starts at once; None: an ordinary branch.
    masking: list[dict[str, str]] | None = None
    anonymize: bool = False


@dataclass(frozen=True, slots=True)
class BranchChanges:
    """What a PATCH changes; None (UNSET for the expiry, where null clears it) keeps a field."""

    name: str | None = None
    protected: bool | None = None
    expires_at: int | msgspec.UnsetType | None = msgspec.UNSET
    annotation: Mapping[str, str] | None = None  # replaces the whole map; {} removes it


@dataclass(frozen=True, slots=True)
class CreatedBranch:
    branch: Branch
    endpoints: list[Endpoint]
    roles: list[Role]
    databases: list[Database]
    operations: list[Operation]


@dataclass(frozen=True, slots=True)
class BranchPage:
    branches: list[Branch]
    annotations: dict[str, Annotation]  # of the branches of the page that have one
    next: str | None  # the cursor of the next page, when there is one
    sort_by: str
    sort_order: str


def _sort_value(branch: Branch, sort_by: str) -> str:
    if sort_by == "name":
        return branch.name
    return clock.format_us(branch.created_at if sort_by == "created_at" else branch.updated_at)


def _encode_cursor(branch: Branch, sort_by: str, sort_order: str) -> str:
    data = {
        "branch_id": branch.id,
        "sort_by": sort_by,
        "sort_by_value": _sort_value(branch, sort_by),
        "sort_order": sort_order.upper(),
    }
    return base64.urlsafe_b64encode(json.dumps(data).encode()).decode()


def _decode_cursor(cursor: str, sort_by: str, sort_order: str) -> tuple[str, str]:
    try:
        data = json.loads(base64.urlsafe_b64decode(cursor.encode()))
        position = (str(data["sort_by_value"]), str(data["branch_id"]))
        same_order = data["sort_by"] == sort_by and data["sort_order"].lower() == sort_order
    except (ValueError, TypeError, KeyError, AttributeError, binascii.Error):
        same_order = False
    if not same_order:
        raise BadRequest("cursor must be the pagination.next of a previous page, same sort")
    return position


async def list_(
    tx: Tx,
    *,
    account_id: str,
    project_id: str,
    limit: int | None,
    cursor: str | None,
    sort_by: str | None,
    sort_order: str | None,
    search: str | None,
) -> BranchPage:
    """Every branch when there is no ``limit`` (what clients expect); else keyset pages."""
    project = await access.live_project(tx, account_id=account_id, project_id=project_id)
    by = sort_by or "updated_at"
    order = (sort_order or "desc").lower()
    if by not in SORT_FIELDS:
        raise BadRequest(f"sort_by must be one of {', '.join(SORT_FIELDS)}")
    if order not in ("asc", "desc"):
        raise BadRequest("sort_order must be asc or desc")
    if limit is not None and not 1 <= limit <= MAX_LIMIT:
        raise BadRequest(f"limit must be between 1 and {MAX_LIMIT}")
    found = await tx.list_branches(project.id)
    if search:
        needle = search.lower()
        found = [b for b in found if needle in b.name.lower() or needle in b.id]
    found.sort(key=lambda b: (_sort_value(b, by), b.id), reverse=order == "desc")
    if cursor is not None:
        after = _decode_cursor(cursor, by, order)
        found = [
            b
            for b in found
            if (
                (_sort_value(b, by), b.id) < after
                if order == "desc"
                else (_sort_value(b, by), b.id) > after
            )
        ]
    page = found if limit is None else found[:limit]
    annotations = await tx.list_annotations(project.id)
    return BranchPage(
        branches=page,
        annotations={b.id: annotations[b.id] for b in page if b.id in annotations},
        next=None if len(page) == len(found) else _encode_cursor(page[-1], by, order),
        sort_by=by,
        sort_order=order,
    )


async def count(tx: Tx, *, account_id: str, project_id: str, search: str | None) -> int:
    page = await list_(
        tx,
        account_id=account_id,
        project_id=project_id,
        limit=None,
        cursor=None,
        sort_by=None,
        sort_order=None,
        search=search,
    )
    return len(page.branches)


async def get(tx: Tx, *, account_id: str, project_id: str, branch_id: str) -> Branch:
    project = await access.live_project(tx, account_id=account_id, project_id=project_id)
    return await access.branch(tx, project_id=project.id, branch_id=branch_id)


async def get_annotated(
    tx: Tx, *, account_id: str, project_id: str, branch_id: str
) -> tuple[Branch, Annotation | None]:
    """The branch and its annotation (None: it has none)."""
    branch = await get(tx, account_id=account_id, project_id=project_id, branch_id=branch_id)
    return branch, await tx.get_annotation(branch.id)


async def create(
    tx: Tx,
    *,
    account_id: str,
    project_id: str,
    spec: NewBranch,
    settings: Settings,
    check_settings: compute_settings.SettingsCheck,
    bounds: HistoryBounds | None = None,
) -> CreatedBranch:
    """``bounds``: what the parent's history holds (looked up beforehand, for a point)."""
    project = await access.live_project(tx, account_id=account_id, project_id=project_id)
    await quotas.check_branches(tx, project_id=project.id, settings=settings)
    parent = await parent_of(tx, project_id=project.id, parent_id=spec.parent_id)
    if not spec.schema_only:  # a schema-only branch is a root: its source gets no child
        expiry.refuse_if_expiring(
            parent, "an expiring branch cannot have children", field="parent_id"
        )
        await anonymized.refuse_source(
            tx, parent, at_point=spec.point is not None, what="parent_id"
        )
    elif spec.masking is not None:
        raise BadRequest("init_source: an anonymized branch copies its parent's rows")
    point = spec.point.point if spec.point else Point()
    if spec.point is not None:
        history.check(spec.point, project=project, branch=parent, bounds=bounds or HistoryBounds())
    now = clock.now_us()
    branch_id = ids.new_branch_id()
    branch = Branch(
        id=branch_id,
        project_id=project.id,
        parent_id=parent.id,
        name=names.branch(spec.name) if spec.name is not None else branch_id,
        default=False,
        protected=spec.protected,
        current_state="init",
        pending_state="ready",
        state_changed_at=now,
        created_at=now,
        updated_at=now,
        parent_lsn=None if point.lsn is None else history.format_lsn(point.lsn),
        parent_timestamp=now if point.time_us is None else point.time_us,
        anonymized=spec.masking is not None,
    )
    if spec.schema_only:
        # A root of its own history, as Neon shows one: no parent, no point in another's.
        branch = msgspec.structs.replace(
            branch,
            parent_id=None,
            parent_lsn=None,
            parent_timestamp=None,
            init_source="schema-only",
        )
    if spec.expires_at is not None:
        branch = expiry.expiring(branch, spec.expires_at, has_children=False, now=now)
    await tx.insert_branch(branch)
    if spec.annotation:
        await tx.set_annotation(branch_id=branch_id, value=spec.annotation, now=now)
    # The copy holds the parent's roles and databases as they will be once the parent's
    # earlier operations (which create_branch waits for) are done: its desired state.
    roles = []
    for r in await tx.list_roles(parent.id):
        role = Role(
            branch_id=branch_id,
            name=r.name,
            password=r.password,
            protected=r.protected,
            login=r.login,
            created_at=now,
            updated_at=now,
        )
        await tx.insert_role(role)
        roles.append(role)
    databases = [
        await tx.insert_database(
            branch_id=branch_id, name=d.name, owner_name=d.owner_name, now=now, applied_name=d.name
        )
        for d in await tx.list_databases(parent.id)
    ]
    computes = [
        await endpoints.new_endpoint(
            tx,
            project=project,
            branch_id=branch_id,
            spec=e,
            settings=settings,
            check_settings=check_settings,
            now=now,
        )
        for e in spec.endpoints
    ]
    starts = [
        operations.Start(
            Action.CREATE_BRANCH,
            branch_id=branch_id,
            source_branch_id=parent.id,
            point_lsn=branch.parent_lsn,
            point_time=point.time_us,
        )
    ]
    if spec.masking is not None:
        computes, masking = await _anonymized(
            tx, branch, spec.masking, spec.anonymize, computes, now
        )
        starts += masking
    starts += [endpoints.start_op(e) for e in computes if e.pending_state == "active"]
    ops = await operations.start(tx, project_id=project.id, starts=starts)
    return CreatedBranch(
        branch=branch, endpoints=computes, roles=roles, databases=databases, operations=ops
    )


async def _anonymized(
    tx: Tx,
    branch: Branch,
    rules: list[dict[str, str]],
    start: bool,
    computes: list[Endpoint],
    now: int,
) -> tuple[list[Endpoint], list[operations.Start]]:
    """An anonymized branch's rules kept, and its masking queued after its copy (then its
    computes start), or, not started yet, its computes left idle: none may run before it."""
    masking = anonymized.new(branch, rules, now)
    if start:
        await tx.put_masking(msgspec.structs.replace(masking, state=anonymized.ANONYMIZING))
        return computes, [operations.Start(Action.ANONYMIZE, branch_id=branch.id)]
    await tx.put_masking(masking)
    return [await endpoints.left_idle(tx, e, now) for e in computes], []


async def parent_of(tx: Tx, *, project_id: str, parent_id: str | None) -> Branch:
    """The branch named as a parent, or the project's default branch."""
    if parent_id is not None:
        return await access.branch(tx, project_id=project_id, branch_id=parent_id)
    return await access.default_branch(tx, project_id=project_id)


async def update(
    tx: Tx, *, account_id: str, project_id: str, branch_id: str, changes: BranchChanges
) -> Branch:
    branch = await get(tx, account_id=account_id, project_id=project_id, branch_id=branch_id)
    now = clock.now_us()
    if changes.protected and not branch.protected and changes.expires_at is msgspec.UNSET:
        expiry.refuse_if_expiring(
            branch, "an expiring branch cannot be protected", field="protected"
        )
    updated = msgspec.structs.replace(
        branch,
        name=branch.name if changes.name is None else names.branch(changes.name),
        protected=branch.protected if changes.protected is None else changes.protected,
        updated_at=now,
    )
    if not isinstance(changes.expires_at, msgspec.UnsetType):
        children = changes.expires_at is not None and await tx.has_child_branches(branch.id)
        updated = expiry.expiring(updated, changes.expires_at, has_children=children, now=now)
    await tx.update_branch(updated)
    if changes.annotation is not None:
        await tx.set_annotation(branch_id=branch.id, value=changes.annotation, now=now)
    return updated


async def delete(
    tx: Tx, *, account_id: str, project_id: str, branch_id: str
) -> tuple[Branch, list[Operation]]:
    """Delete a branch that is neither the default, protected, nor the parent of another."""
    branch = await get(tx, account_id=account_id, project_id=project_id, branch_id=branch_id)
    return await remove(tx, branch=branch)


async def remove(tx: Tx, *, branch: Branch) -> tuple[Branch, list[Operation]]:
    """The deletion itself, of a branch already found: a DELETE's and an expiry's."""
    if branch.default:
        raise Conflict("the default branch cannot be deleted; make another branch the default")
    if branch.protected:
        raise Conflict("a protected branch cannot be deleted; unprotect it first")
    if await tx.has_child_branches(branch.id):
        raise Conflict("a branch with child branches cannot be deleted; delete them first")
    now = clock.now_us()
    for endpoint in await tx.list_endpoints(branch.project_id):
        if endpoint.branch_id == branch.id:
            await tx.delete_endpoint(endpoint_id=endpoint.id, now=now)
    await tx.delete_branch(branch_id=branch.id, now=now)
    await tx.set_annotation(branch_id=branch.id, value={}, now=now)
    ops = await operations.start(
        tx,
        project_id=branch.project_id,
        starts=[operations.Start(Action.DELETE_TIMELINE, branch_id=branch.id)],
    )
    return msgspec.structs.replace(branch, updated_at=now), ops


async def set_default(tx: Tx, *, account_id: str, project_id: str, branch_id: str) -> Branch:
    branch = await get(tx, account_id=account_id, project_id=project_id, branch_id=branch_id)
    if branch.default:
        return branch
    expiry.refuse_if_expiring(branch, "an expiring branch cannot be the default")
    now = clock.now_us()
    for other in await tx.list_branches(branch.project_id):
        if other.default:
            await tx.update_branch(msgspec.structs.replace(other, default=False, updated_at=now))
    updated = msgspec.structs.replace(branch, default=True, updated_at=now)
    await tx.update_branch(updated)
    return updated

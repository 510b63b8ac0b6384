"""Projects: created with their root branch, compute, role and database; changed; deleted.

Creating writes the whole desired state and the operations that realise it in the caller's
transaction, so a client reads roles, endpoints and passwords at once, while ``create_timeline``
and ``start_compute`` make them real.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from pgplane.config import Settings
from pgplane.core import clock, ids
from pgplane.core.models import Branch, Database, Endpoint, Operation, Project, Role
from pgplane.core.operations import Action
from pgplane.errors import BadRequest, Unavailable
from pgplane.services import (
    access,
    compute_settings,
    endpoints,
    names,
    nodes,
    operations,
    project_settings,
    quotas,
)
from pgplane.store import Tx

DEFAULT_LIMIT = 10
MAX_LIMIT = 400
MAX_HISTORY_RETENTION_SECONDS = 2_592_000
DEFAULT_HISTORY_RETENTION_SECONDS = 86_400
PROVISIONER = "k8s-pod"
# Up to Postgres 15 a role with CREATEROLE may grant itself any role but a superuser, among them
# pg_execute_server_program, whose COPY ... PROGRAM runs commands as the compute's OS user; 16
# took that away (CREATEROLE grants only roles it holds with ADMIN OPTION).
LAST_CREATEROLE_OS_MAJOR = 15
CREATEROLE_OS_ACCESS = (
    "Postgres 15 and older hand any role with CREATEROLE the OS user of its compute"
    " (pg_execute_server_program)"
)


@dataclass(frozen=True, slots=True)
class Notice:
    """Something a client should know of what it asked for, though it was done."""

    code: str
    message: str


@dataclass(frozen=True, slots=True)
class NewProject:
    """What a create request asks for; anything left None takes the platform's default."""

    name: str | None = None
    region_id: str | None = None
    pg_version: int | None = None
    branch_name: str | None = None
    role_name: str | None = None
    database_name: str | None = None
    history_retention_seconds: int | None = None
    store_passwords: bool | None = None
    default_endpoint_settings: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ProjectChanges:
    name: str | None = None
    history_retention_seconds: int | None = None
    default_endpoint_settings: dict[str, Any] | None = None
    settings: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class CreatedProject:
    project: Project
    branch: Branch
    endpoint: Endpoint
    roles: list[Role]
    databases: list[Database]
    operations: list[Operation]
    warnings: list[Notice] = field(default_factory=list)


def _retention(value: int | None) -> int:
    if value is None:
        return DEFAULT_HISTORY_RETENTION_SECONDS
    if not 0 <= value <= MAX_HISTORY_RETENTION_SECONDS:
        raise BadRequest(
            f"history_retention_seconds must be between 0 and {MAX_HISTORY_RETENTION_SECONDS}"
        )
    return value


def offered_pg_versions(settings: Settings) -> list[int]:
    """The majors a new project may have: those installed, from the operator's minimum on."""
    return sorted(v for v in settings.pg_versions if v >= settings.min_pg_version)


def _pg_version(requested: int | None, settings: Settings) -> int:
    """The major of a new project (existing ones keep theirs, whatever the minimum says)."""
    available = offered_pg_versions(settings)
    if not available:
        installed = ", ".join(str(v) for v in settings.pg_versions) or "none"
        raise Unavailable(
            f"no PostgreSQL version is offered for new projects: installed {installed}, the"
            f" minimum is {settings.min_pg_version} (PGPLANE_MIN_PG_VERSION)"
        )
    offered = ", ".join(str(v) for v in available)
    if requested is None:
        return max(available)
    if requested in settings.pg_versions and requested < settings.min_pg_version:
        why = f": {CREATEROLE_OS_ACCESS}" if requested <= LAST_CREATEROLE_OS_MAJOR else ""
        raise BadRequest(
            f"pg_version {requested} is not offered for new projects here, only"
            f" {settings.min_pg_version} and newer{why}; available: {offered}"
        )
    if requested not in available:
        raise BadRequest(f"pg_version {requested} is not available here; available: {offered}")
    return requested


def version_warnings(pg_version: int) -> list[Notice]:
    """What a new project of this major should be told: the OS user CREATEROLE reaches."""
    if pg_version > LAST_CREATEROLE_OS_MAJOR:
        return []
    return [
        Notice(
            code="PG_VERSION_CREATEROLE_OS_ACCESS",
            message=f"{CREATEROLE_OS_ACCESS}: a role of this project that has CREATEROLE can"
            " run programs as its compute's operating-system user. Choose pg_version 16 or"
            " newer unless the project needs this one.",
        )
    ]


async def create(
    tx: Tx,
    *,
    account_id: str,
    spec: NewProject,
    settings: Settings,
    check_settings: compute_settings.SettingsCheck,
) -> CreatedProject:
    now = clock.now_us()
    project_id = ids.new_project_id()
    if spec.region_id is not None and spec.region_id != settings.region_id:
        raise BadRequest(
            f"region_id {spec.region_id!r} is not served here; use {settings.region_id!r}"
        )
    await quotas.check_projects(tx, account_id=account_id, settings=settings)
    database_name = names.database(spec.database_name or "neondb")
    role_name = names.role(spec.role_name or f"{database_name}_owner")
    endpoint_settings = dict(spec.default_endpoint_settings)
    project = Project(
        id=project_id,
        account_id=account_id,
        name=names.project(spec.name) if spec.name is not None else project_id,
        region_id=settings.region_id,
        pg_version=_pg_version(spec.pg_version, settings),
        provisioner=PROVISIONER,
        store_passwords=True if spec.store_passwords is None else spec.store_passwords,
        history_retention_seconds=_retention(spec.history_retention_seconds),
        default_endpoint_settings=endpoint_settings,
        settings=project_settings.new(spec.settings),
        created_at=now,
        updated_at=now,
    )
    branch = Branch(
        id=ids.new_branch_id(),
        project_id=project_id,
        parent_id=None,
        name=names.branch(spec.branch_name or "main"),
        default=True,
        protected=False,
        current_state="init",
        pending_state="ready",
        state_changed_at=now,
        created_at=now,
        updated_at=now,
    )
    role = Role(
        branch_id=branch.id,
        name=role_name,
        password=ids.new_password(),
        protected=False,
        created_at=now,
        updated_at=now,
    )
    await tx.insert_project(project)
    await nodes.place(tx, project_id=project_id, now=now)
    await tx.insert_branch(branch)
    endpoint = await endpoints.new_endpoint(
        tx,
        project=project,
        branch_id=branch.id,
        spec=endpoints.EndpointSpec(),
        settings=settings,
        check_settings=check_settings,
        now=now,
    )
    await tx.insert_role(role)
    # create_timeline makes the database under this name.
    database = await tx.insert_database(
        branch_id=branch.id,
        name=database_name,
        owner_name=role_name,
        now=now,
        applied_name=database_name,
    )
    ops = await operations.start(
        tx,
        project_id=project_id,
        starts=[
            operations.Start(Action.CREATE_TIMELINE, branch_id=branch.id),
            operations.Start(Action.START_COMPUTE, branch_id=branch.id, endpoint_id=endpoint.id),
        ],
    )
    return CreatedProject(
        project=msgspec.structs.replace(project, locked=True),
        branch=branch,
        endpoint=endpoint,
        roles=[role],
        databases=[database],
        operations=ops,
        warnings=version_warnings(project.pg_version),
    )


async def get(tx: Tx, *, account_id: str, project_id: str) -> Project:
    return await access.project(tx, account_id=account_id, project_id=project_id)


async def list_(
    tx: Tx,
    *,
    account_id: str,
    limit: int | None,
    cursor: str | None,
    search: str | None = None,
    recoverable: bool = False,
) -> list[Project]:
    """A page of the account's live projects (``search``: those whose name or id holds it);
    ``recoverable``, of its deleted ones that can be recovered: none, as a deletion removes
    the project's data at once here (Neon keeps it a week)."""
    size = DEFAULT_LIMIT if limit is None else limit
    if not 1 <= size <= MAX_LIMIT:
        raise BadRequest(f"limit must be between 1 and {MAX_LIMIT}")
    if cursor is not None and not (
        ids.is_valid_id(cursor)
        and await tx.project_exists(account_id=account_id, project_id=cursor)
    ):
        raise BadRequest("cursor must be the pagination.cursor of a previous page")
    if recoverable:
        return []
    return await tx.list_projects(account_id=account_id, after_id=cursor, limit=size, search=search)


async def update(
    tx: Tx,
    *,
    account_id: str,
    project_id: str,
    changes: ProjectChanges,
    check_settings: compute_settings.SettingsCheck,
) -> tuple[Project, list[Operation]]:
    project = await get(tx, account_id=account_id, project_id=project_id)
    updated = msgspec.structs.replace(project, updated_at=clock.now_us())
    if changes.name is not None:
        updated = msgspec.structs.replace(updated, name=names.project(changes.name))
    if changes.default_endpoint_settings is not None:
        updated = msgspec.structs.replace(
            updated,
            default_endpoint_settings=await compute_settings.check_defaults(
                changes.default_endpoint_settings,
                pg_version=project.pg_version,
                check=check_settings,
            ),
        )
    if changes.settings is not None:
        updated = msgspec.structs.replace(
            updated, settings=project_settings.updated(project.settings, changes.settings)
        )
    starts = []
    if (
        changes.history_retention_seconds is not None
        and changes.history_retention_seconds != project.history_retention_seconds
    ):
        updated = msgspec.structs.replace(
            updated, history_retention_seconds=_retention(changes.history_retention_seconds)
        )
        starts.append(operations.Start(Action.APPLY_STORAGE_CONFIG))
    if project_settings.turns_on_logical_replication(project.settings, updated.settings):
        starts += await _logical_replication_starts(tx, project.id)
    await tx.update_project(updated)
    ops = await operations.start(tx, project_id=project_id, starts=starts) if starts else []
    if ops:
        updated = msgspec.structs.replace(updated, locked=True)
    return updated, ops


async def _logical_replication_starts(tx: Tx, project_id: str) -> list[operations.Start]:
    """Every branch's roles given REPLICATION, then each running read-write compute restarted
    with ``wal_level=logical`` (as on Neon, enabling restarts the project's computes; a
    suspended one takes it at its next start, a read-only one at its next restart)."""
    starts = [
        operations.Start(Action.APPLY_CONFIG, branch_id=b.id)
        for b in await tx.list_branches(project_id)
    ]
    starts += [
        operations.Start(Action.APPLY_CONFIG, branch_id=e.branch_id, endpoint_id=e.id)
        for e in await tx.list_endpoints(project_id)
        if e.type == "read_write"
        and not e.disabled
        and "active" in (e.current_state, e.pending_state)
    ]
    return starts


async def delete(tx: Tx, *, account_id: str, project_id: str) -> tuple[Project, list[Operation]]:
    """Mark the project deleted at once; ``delete_tenant`` stops its computes and frees its data."""
    project = await get(tx, account_id=account_id, project_id=project_id)
    now = clock.now_us()
    deleted = msgspec.structs.replace(project, deleted_at=now, updated_at=now, locked=True)
    await tx.update_project(deleted)
    ops = await operations.start(
        tx, project_id=project_id, starts=[operations.Start(Action.DELETE_TENANT)]
    )
    return deleted, ops

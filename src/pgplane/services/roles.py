"""Roles and databases of a branch: each change is written at once and applied on the compute by
an ``apply_config`` operation (deleted ones stay as tombstones until their drop is applied).
"""

from __future__ import annotations

import msgspec

from pgplane.core import clock, ids
from pgplane.core.models import Branch, Database, Operation, Role
from pgplane.core.operations import Action
from pgplane.errors import BadRequest, Conflict, NotFound, PreconditionFailed
from pgplane.services import access, names, operations
from pgplane.store import Tx


async def _branch(tx: Tx, *, account_id: str, project_id: str, branch_id: str) -> Branch:
    project = await access.live_project(tx, account_id=account_id, project_id=project_id)
    return await access.branch(tx, project_id=project.id, branch_id=branch_id)


async def _apply(tx: Tx, branch: Branch) -> list[Operation]:
    return await operations.start(
        tx,
        project_id=branch.project_id,
        starts=[operations.Start(Action.APPLY_CONFIG, branch_id=branch.id)],
    )


# -- roles ------------------------------------------------------------------------------------


async def list_roles(tx: Tx, *, account_id: str, project_id: str, branch_id: str) -> list[Role]:
    branch = await _branch(tx, account_id=account_id, project_id=project_id, branch_id=branch_id)
    return await tx.list_roles(branch.id)


async def get_role(
    tx: Tx, *, account_id: str, project_id: str, branch_id: str, role_name: str
) -> Role:
    branch = await _branch(tx, account_id=account_id, project_id=project_id, branch_id=branch_id)
    return await access.role(tx, branch_id=branch.id, name=role_name)


async def create_role(
    tx: Tx, *, account_id: str, project_id: str, branch_id: str, name: str, login: bool = True
) -> tuple[Role, list[Operation]]:
    branch = await _branch(tx, account_id=account_id, project_id=project_id, branch_id=branch_id)
    now = clock.now_us()
    role = Role(
        branch_id=branch.id,
        name=names.role(name),
        # A role that cannot log in has no password (Neon's no_login): none to show or reveal.
        password=ids.new_password() if login else "",
        protected=False,
        login=login,
        created_at=now,
        updated_at=now,
    )
    await tx.insert_role(role)
    return role, await _apply(tx, branch)


async def delete_role(
    tx: Tx, *, account_id: str, project_id: str, branch_id: str, role_name: str
) -> tuple[Role, list[Operation]]:
    branch = await _branch(tx, account_id=account_id, project_id=project_id, branch_id=branch_id)
    role = await access.role(tx, branch_id=branch.id, name=role_name)
    owned = [d.name for d in await tx.list_databases(branch.id) if d.owner_name == role.name]
    if owned:
        raise Conflict(
            f"role {role.name!r} owns database(s) {', '.join(map(repr, owned))}:"
            " delete them or give them another owner first"
        )
    now = clock.now_us()
    await tx.delete_role(branch_id=branch.id, name=role.name, now=now)
    return msgspec.structs.replace(role, deleted_at=now, updated_at=now), await _apply(tx, branch)


async def reveal_password(
    tx: Tx, *, account_id: str, project_id: str, branch_id: str, role_name: str
) -> str:
    project = await access.live_project(tx, account_id=account_id, project_id=project_id)
    branch = await access.branch(tx, project_id=project.id, branch_id=branch_id)
    role = await access.role(tx, branch_id=branch.id, name=role_name)
    _can_log_in(role)
    if not project.store_passwords:
        raise PreconditionFailed("this project does not store passwords; reset it instead")
    return role.password


def _can_log_in(role: Role) -> None:
    if not role.login:
        raise BadRequest(f"role {role.name!r} cannot log in (no_login): it has no password")


async def reset_password(
    tx: Tx, *, account_id: str, project_id: str, branch_id: str, role_name: str
) -> tuple[Role, list[Operation]]:
    """A new password; the old one works until the operation that applies it finishes."""
    branch = await _branch(tx, account_id=account_id, project_id=project_id, branch_id=branch_id)
    role = await access.role(tx, branch_id=branch.id, name=role_name)
    _can_log_in(role)
    updated = msgspec.structs.replace(role, password=ids.new_password(), updated_at=clock.now_us())
    await tx.update_role(updated)
    return updated, await _apply(tx, branch)


# -- databases --------------------------------------------------------------------------------


async def list_databases(
    tx: Tx, *, account_id: str, project_id: str, branch_id: str
) -> list[Database]:
    branch = await _branch(tx, account_id=account_id, project_id=project_id, branch_id=branch_id)
    return await tx.list_databases(branch.id)


async def get_database(
    tx: Tx, *, account_id: str, project_id: str, branch_id: str, database_name: str
) -> Database:
    branch = await _branch(tx, account_id=account_id, project_id=project_id, branch_id=branch_id)
    return await access.database(tx, branch_id=branch.id, name=database_name)


async def _owner(tx: Tx, branch: Branch, owner_name: str) -> str:
    # A name in a body that names nothing is a 404, as an id in a path is (and as a branch_id
    # or parent_id in a body is).
    if await tx.get_role(branch_id=branch.id, name=owner_name) is None:
        raise NotFound(f"owner role {owner_name!r} does not exist on this branch")
    return owner_name


async def create_database(
    tx: Tx, *, account_id: str, project_id: str, branch_id: str, name: str, owner_name: str
) -> tuple[Database, list[Operation]]:
    branch = await _branch(tx, account_id=account_id, project_id=project_id, branch_id=branch_id)
    database = await tx.insert_database(
        branch_id=branch.id,
        name=names.database(name),
        owner_name=await _owner(tx, branch, owner_name),
        now=clock.now_us(),
    )
    return database, await _apply(tx, branch)


async def update_database(
    tx: Tx,
    *,
    account_id: str,
    project_id: str,
    branch_id: str,
    database_name: str,
    name: str | None,
    owner_name: str | None,
) -> tuple[Database, list[Operation]]:
    branch = await _branch(tx, account_id=account_id, project_id=project_id, branch_id=branch_id)
    database = await access.database(tx, branch_id=branch.id, name=database_name)
    updated = msgspec.structs.replace(
        database,
        name=database.name if name is None else names.database(name),
        owner_name=database.owner_name
        if owner_name is None
        else await _owner(tx, branch, owner_name),
    )
    if updated == database:
        return database, []
    updated = msgspec.structs.replace(updated, updated_at=clock.now_us())
    await tx.update_database(updated)
    return updated, await _apply(tx, branch)


async def delete_database(
    tx: Tx, *, account_id: str, project_id: str, branch_id: str, database_name: str
) -> tuple[Database, list[Operation]]:
    branch = await _branch(tx, account_id=account_id, project_id=project_id, branch_id=branch_id)
    database = await access.database(tx, branch_id=branch.id, name=database_name)
    now = clock.now_us()
    await tx.delete_database(database_id=database.id, now=now)
    deleted = msgspec.structs.replace(database, deleted_at=now, updated_at=now)
    return deleted, await _apply(tx, branch)

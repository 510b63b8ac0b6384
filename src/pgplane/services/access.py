"""Lookups that decide what an account may see: anything not its own is the same 404 as nothing."""

from __future__ import annotations

from pgplane.core import ids
from pgplane.core.models import Branch, Database, Endpoint, Project, Role
from pgplane.errors import NotFound
from pgplane.store import Tx


async def project(
    tx: Tx, *, account_id: str, project_id: str, include_deleted: bool = False
) -> Project:
    """The account's project; missing, foreign or malformed ids all raise the same NotFound."""
    found = None
    if ids.is_valid_id(project_id):
        found = await tx.get_project(
            account_id=account_id, project_id=project_id, include_deleted=include_deleted
        )
    if found is None:
        raise NotFound("project not found")
    return found


async def require_project(tx: Tx, *, account_id: str, project_id: str) -> None:
    """Raise NotFound unless the id names a project of the account, deleted or not.

    The cheap check for the hot read paths (operations stay readable after a deletion).
    """
    if not (
        ids.is_valid_id(project_id)
        and await tx.project_exists(account_id=account_id, project_id=project_id)
    ):
        raise NotFound("project not found")


async def live_project(tx: Tx, *, account_id: str, project_id: str) -> Project:
    """The account's project, not deleted: what every change to its objects needs."""
    return await project(tx, account_id=account_id, project_id=project_id)


async def branch(tx: Tx, *, project_id: str, branch_id: str) -> Branch:
    """A live branch of the project (the project already checked); else NotFound."""
    found = None
    if ids.is_valid_id(branch_id):
        found = await tx.get_branch(project_id=project_id, branch_id=branch_id)
    if found is None:
        raise NotFound("branch not found")
    return found


async def default_branch(tx: Tx, *, project_id: str) -> Branch:
    """The project's default branch (the project already checked)."""
    for found in await tx.list_branches(project_id):
        if found.default:
            return found
    raise NotFound("the project has no default branch")


async def endpoint(tx: Tx, *, project_id: str, endpoint_id: str) -> Endpoint:
    """A live endpoint of the project (the project already checked); else NotFound."""
    found = None
    if ids.is_valid_id(endpoint_id):
        found = await tx.get_endpoint(project_id=project_id, endpoint_id=endpoint_id)
    if found is None:
        raise NotFound("endpoint not found")
    return found


async def role(tx: Tx, *, branch_id: str, name: str) -> Role:
    found = await tx.get_role(branch_id=branch_id, name=name)
    if found is None:
        raise NotFound("role not found")
    return found


async def database(tx: Tx, *, branch_id: str, name: str) -> Database:
    found = await tx.get_database(branch_id=branch_id, name=name)
    if found is None:
        raise NotFound("database not found")
    return found

"""Lookups that decide what an account may see: anything not its own is the same 404 as nothing."""

from __future__ import annotations

from pgplane.core import ids
from pgplane.core.models import Project
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

"""A branch's schema (``GET …/schema``) and the diff of two (``GET …/compare_schema``).

The SQL is what ``pg_dump --schema-only`` prints, read by the data plane (the driver's
``dump_schema``) outside any store transaction: it may take a temporary postmaster on a branch
whose compute is suspended, and never wakes it. The diff is a unified diff of the two dumps, as
Neon's ``compare_schema`` answers and as neonctl and the schema-diff-action compute it
themselves from two ``/schema`` answers (``diff``'s ``createPatch``).

Points of history (``lsn``, ``timestamp`` and the base's) are refused with a 400 that says so:
a schema at a point would need the point rebuilt from history first, which this does not do
yet; answering with the head instead would be a wrong answer a reviewer trusts.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Protocol

from pgplane.compute.driver import ComputeError, DatabaseNotFound, SchemaTooLarge
from pgplane.core.models import Branch, Project
from pgplane.errors import BadRequest, Conflict, LimitExceeded, Locked, NotFound, Unavailable
from pgplane.services import access
from pgplane.store import Tx


class SchemaDumper(Protocol):
    """The data plane's reading of one database's schema (the driver's ``dump_schema``)."""

    async def __call__(
        self, *, project_id: str, branch_id: str, pg_version: int, db_name: str, max_bytes: int
    ) -> str: ...


async def no_dumps(
    *, project_id: str, branch_id: str, pg_version: int, db_name: str, max_bytes: int
) -> str:
    """A dumper for an API without a data plane (unit tests): every read is unavailable."""
    raise Unavailable("this server reads no schemas")


@dataclass(frozen=True, slots=True)
class Target:
    """A branch's database whose schema is asked for, checked against the store."""

    project: Project
    branch: Branch
    db_name: str


def refuse_points(**given: str | None) -> None:
    """A 400 naming the first point-in-time parameter given (see the module docstring)."""
    for name, value in given.items():
        if value is not None:
            raise BadRequest(
                f"{name}: schemas at a point of a branch's history are not served yet; ask"
                " without it for the branch's current schema, or create a branch at that"
                " point (parent_lsn / parent_timestamp) and read its schema"
            )


def check_format(value: str | None) -> None:
    if value not in (None, "sql"):
        raise BadRequest(f"format {value!r} is not served: only sql (the default)")


async def target(
    tx: Tx, *, account_id: str, project_id: str, branch_id: str, db_name: str | None
) -> Target:
    """The project's branch and one of its databases; 404 when either is not there."""
    project = await access.live_project(tx, account_id=account_id, project_id=project_id)
    branch = await access.branch(tx, project_id=project.id, branch_id=branch_id)
    # After the lookups: another account's branch is the same 404 as none, whatever is asked.
    if not db_name:
        raise BadRequest("db_name is required: the database whose schema to read")
    await access.database(tx, branch_id=branch.id, name=db_name)
    if project.storage_state != "attached":
        raise Conflict(
            f"project {project.id} is detached (its data is in the cold archive): start an"
            " endpoint to bring it back, then read the schema"
        )
    if branch.current_state != "ready":
        raise Locked(f"branch {branch.id} is {branch.current_state}; try again in a moment")
    return Target(project, branch, db_name)


async def base_branch(
    tx: Tx, *, account_id: str, project_id: str, branch: Branch, base_branch_id: str | None
) -> Branch:
    """The branch to compare with: the one named, else the branch's parent."""
    if base_branch_id is None:
        if branch.parent_id is None:
            raise BadRequest(
                f"base_branch_id is required: branch {branch.id} has no parent to compare with"
            )
        base_branch_id = branch.parent_id
    await access.live_project(tx, account_id=account_id, project_id=project_id)
    try:
        return await access.branch(tx, project_id=project_id, branch_id=base_branch_id)
    except NotFound:
        raise NotFound(f"base branch {base_branch_id} not found") from None


async def read(dumper: SchemaDumper, found: Target, *, max_bytes: int) -> str:
    """The SQL of ``found``'s schema, its data-plane failures told as API errors."""
    try:
        return await dumper(
            project_id=found.project.id,
            branch_id=found.branch.id,
            pg_version=found.project.pg_version,
            db_name=found.db_name,
            max_bytes=max_bytes,
        )
    except DatabaseNotFound:
        raise NotFound(
            f"database {found.db_name!r} is not in the data of branch {found.branch.id}"
        ) from None
    except SchemaTooLarge as exc:
        raise LimitExceeded("schema_size", str(exc)) from None
    except ComputeError as exc:
        raise Unavailable(f"the schema of branch {found.branch.id} cannot be read: {exc}") from None


def diff(base_sql: str, sql: str, *, db_name: str, base: Branch, branch: Branch) -> str:
    """The unified diff from the base's schema to the branch's; empty when they are the same."""
    if base_sql == sql:
        return ""
    lines = difflib.unified_diff(
        base_sql.splitlines(keepends=True),
        sql.splitlines(keepends=True),
        fromfile=f"{db_name}-schema.sql (branch {base.id})",
        tofile=f"{db_name}-schema.sql (branch {branch.id})",
    )
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)

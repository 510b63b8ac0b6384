"""A branch's schema (``GET …/schema``) and the diff of two (``GET …/compare_schema``).

The SQL is what ``pg_dump --schema-only`` prints, read by the data plane (the driver's
``dump_schema``) outside any store transaction: it may take a temporary postmaster on a branch
whose compute is suspended, and never wakes it. The diff is a unified diff of the two dumps, as
Neon's ``compare_schema`` answers and as neonctl and the schema-diff-action compute it
themselves from two ``/schema`` answers (``diff``'s ``createPatch``).

At a point of history (``lsn`` or ``timestamp``, and the base's ``base_lsn`` or
``base_timestamp``) the point is checked as a branch at a point is (services/history.py: the same
400s), then the data plane rebuilds it into a temporary directory and reads it there.

Each read holds something every account shares while it lasts: a thread of the tenants' pool
waiting on ``pg_dump`` (up to its lock timeout, when the tenant keeps a table locked), and at a
point one of the node's few rebuilds. An account reads :data:`READS_PER_ACCOUNT` schemas at
once, however many projects it has; its further reads wait their turn (first come first).
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Protocol

from pgplane.compute.driver import (
    ComputeError,
    DatabaseNotFound,
    Point,
    PointNotInHistory,
    SchemaTooLarge,
)
from pgplane.core.models import Branch, Project
from pgplane.core.turns import Turns
from pgplane.errors import BadRequest, Conflict, LimitExceeded, Locked, NotFound, Unavailable
from pgplane.services import access, history
from pgplane.store import Tx

READS_PER_ACCOUNT = 2  # of the tenants' pool's 16 threads, of the node's 4 point rebuilds
_reads = Turns(READS_PER_ACCOUNT)


class SchemaDumper(Protocol):
    """The data plane's reading of one database's schema (the driver's ``dump_schema``)."""

    async def __call__(
        self,
        *,
        project_id: str,
        branch_id: str,
        pg_version: int,
        db_name: str,
        max_bytes: int,
        point: Point | None = None,
    ) -> str: ...


async def no_dumps(
    *,
    project_id: str,
    branch_id: str,
    pg_version: int,
    db_name: str,
    max_bytes: int,
    point: Point | None = None,
) -> str:
    """A dumper for an API without a data plane (unit tests): every read is unavailable."""
    raise Unavailable("this server reads no schemas")


@dataclass(frozen=True, slots=True)
class Target:
    """A branch's database whose schema is asked for, checked against the store."""

    project: Project
    branch: Branch
    db_name: str


def point(lsn: str | None, timestamp: str | None, *, prefix: str = "") -> history.NamedPoint | None:
    """The point asked for (``prefix``: ``base_`` for the base's), or None for the head."""
    return history.parse_point(
        lsn=lsn, timestamp=timestamp, lsn_field=f"{prefix}lsn", time_field=f"{prefix}timestamp"
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


async def base_target(
    tx: Tx, *, account_id: str, found: Target, base_branch_id: str | None
) -> Target:
    """What ``found`` is compared with: the same database on the branch named, else on the
    branch's parent (Neon's 404 when that branch lacks it)."""
    if base_branch_id is None:
        if found.branch.parent_id is None:
            raise BadRequest(
                f"base_branch_id is required: branch {found.branch.id} has no parent to compare"
                " with"
            )
        base_branch_id = found.branch.parent_id
    try:
        await access.branch(tx, project_id=found.project.id, branch_id=base_branch_id)
    except NotFound:
        raise NotFound(f"base branch {base_branch_id} not found") from None
    return await target(
        tx,
        account_id=account_id,
        project_id=found.project.id,
        branch_id=base_branch_id,
        db_name=found.db_name,
    )


async def read(
    dumper: SchemaDumper,
    found: Target,
    *,
    max_bytes: int,
    at: history.NamedPoint | None = None,
    lookup: history.HistoryLookup = history.unknown_history,
) -> str:
    """The SQL of ``found``'s schema (at its head, or at the point ``at`` once the history
    ``lookup`` reports shows it holds it), its data-plane failures told as API errors."""
    project, branch = found.project, found.branch
    if at is not None:
        bounds = await lookup(
            project_id=project.id, branch_id=branch.id, pg_version=project.pg_version
        )
        history.check(at, project=project, branch=branch, bounds=bounds)
    try:
        async with _reads.turn(project.account_id):
            return await dumper(
                project_id=project.id,
                branch_id=branch.id,
                pg_version=project.pg_version,
                db_name=found.db_name,
                max_bytes=max_bytes,
                point=None if at is None else at.point,
            )
    except PointNotInHistory as exc:  # freed between the check and the rebuild
        raise BadRequest(f"{at.field if at is not None else 'point'}: {exc}") from None
    except DatabaseNotFound:
        raise NotFound(
            f"database {found.db_name!r} is not in the data of branch {found.branch.id}"
        ) from None
    except SchemaTooLarge as exc:
        raise LimitExceeded("schema_size", str(exc)) from None
    except ComputeError as exc:
        raise Unavailable(f"the schema of branch {found.branch.id} cannot be read: {exc}") from None


# pg_dump's bracket for psql (``\restrict KEY`` ... ``\unrestrict KEY``): its key is derived
# from the dump's content, so two different schemas always differ there too; no schema is in it.
_RESTRICT = re.compile(r"\\(un)?restrict [0-9A-Za-z]+\s*")


def _schema_lines(sql: str) -> list[str]:
    return [line for line in sql.splitlines(keepends=True) if not _RESTRICT.fullmatch(line)]


def diff(base_sql: str, sql: str, *, db_name: str, base: Branch, branch: Branch) -> str:
    """The unified diff from the base's schema to the branch's; empty when they are the same
    (pg_dump's ``\restrict`` lines are no part of either)."""
    before, after = _schema_lines(base_sql), _schema_lines(sql)
    if before == after:
        return ""
    lines = difflib.unified_diff(
        before,
        after,
        fromfile=f"{db_name}-schema.sql (branch {base.id})",
        tofile=f"{db_name}-schema.sql (branch {branch.id})",
    )
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)

"""Operations as clients see them: started with the change that needs them, listed, polled."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pgplane.core import clock, ids
from pgplane.core.models import Operation
from pgplane.core.operations import Action, Scope, Status
from pgplane.errors import BadRequest, NotFound
from pgplane.services import access, nodes
from pgplane.store import Tx

DEFAULT_LIMIT = 10
MAX_LIMIT = 1000


@dataclass(frozen=True, slots=True)
class Start:
    """One operation a change needs: what to do, and on which branch / endpoint."""

    action: Action
    branch_id: str | None = None
    endpoint_id: str | None = None
    source_branch_id: str | None = None  # create_branch: the branch it copies
    point_lsn: str | None = None  # a rebuild from history: the point, an LSN...
    point_time: int | None = None  # ...or a time (us)
    preserve_branch_id: str | None = None  # a restore: the branch keeping the old state
    snapshot_id: str | None = None  # the snapshot built, freed or restored from


@dataclass(frozen=True, slots=True)
class Page:
    operations: list[Operation]
    cursor: str | None


# Work that does not need the project's data on hand (the rest waits for a reattach).
_STORAGE_FREE = frozenset(
    {Action.DELETE_TENANT, Action.TENANT_DETACH, Action.TENANT_REATTACH, Action.TENANT_ATTACH}
)


async def start(tx: Tx, *, project_id: str, starts: Sequence[Start]) -> list[Operation]:
    """Record operations in the caller's transaction, in order.

    One that nothing earlier blocks is created ``running`` and free to claim at once (as Neon
    shows a create request's first operation); the rest wait in ``scheduling``. Work on a detached
    project is preceded by a ``tenant_reattach`` (one, however many requests need it).
    """
    now = clock.now_us()
    # Every operation runs on the project's node: none is queued while that node is down.
    await nodes.require_up(tx, project_id, now=now)
    unsettled = await tx.list_unsettled_operations(project_id=project_id)
    pending = [Scope.of(o) for o in unsettled]
    brings_back = (Action.TENANT_REATTACH, Action.TENANT_ATTACH)
    if any(s.action not in _STORAGE_FREE for s in starts) and not any(
        s.action in brings_back for s in starts
    ):
        # The data is away, or on its way: unless a reattach is already the last word, add one.
        last = next(
            (
                o.action
                for o in reversed(unsettled)
                if o.action in (Action.TENANT_DETACH, *brings_back)
            ),
            None,
        )
        project = await tx.get_project_by_id(project_id)
        detached = project is not None and project.storage_state == "detached"
        if last is Action.TENANT_DETACH or (detached and last is None):
            starts = [Start(Action.TENANT_REATTACH), *starts]
    new = []
    for s in starts:
        scope = Scope(project_id, s.branch_id, s.endpoint_id, s.source_branch_id)
        blocked = any(scope.overlaps(p) for p in pending)
        pending.append(scope)
        new.append(
            Operation(
                id=ids.new_operation_id(),
                project_id=project_id,
                branch_id=s.branch_id,
                endpoint_id=s.endpoint_id,
                action=s.action,
                status=Status.SCHEDULING if blocked else Status.RUNNING,
                failures_count=0,
                error=None,
                retry_at=None,
                created_at=now,
                updated_at=now,
                total_duration_ms=0,
                source_branch_id=s.source_branch_id,
                point_lsn=s.point_lsn,
                point_time=s.point_time,
                preserve_branch_id=s.preserve_branch_id,
                snapshot_id=s.snapshot_id,
                # Running but unowned, with a lease that has already ended: the next worker to
                # look claims it, and no failed attempt is counted for it.
                lease_owner=None,
                lease_expires_at=None if blocked else now,
            )
        )
    return await tx.insert_operations(new)


def parse_limit(limit: int | None) -> int:
    if limit is None:
        return DEFAULT_LIMIT
    if not 1 <= limit <= MAX_LIMIT:
        raise BadRequest(f"limit must be between 1 and {MAX_LIMIT}")
    return limit


def parse_cursor(cursor: str | None) -> int | None:
    if cursor is None:
        return None
    try:
        return clock.parse_us(cursor)
    except ValueError:
        raise BadRequest(
            "cursor must be the pagination.cursor of a previous page (an ISO 8601 UTC timestamp)"
        ) from None


async def list_(
    tx: Tx, *, account_id: str, project_id: str, limit: int | None, cursor: str | None
) -> Page:
    """Newest first. Past the end: no operations, and the cursor that was sent."""
    size, before = parse_limit(limit), parse_cursor(cursor)
    ops = []
    if ids.is_valid_id(project_id):
        ops = await tx.list_operations(
            project_id=project_id, before=before, limit=size, account_id=account_id
        )
    if not ops:  # the end of the list, or no such project for this account
        await access.require_project(tx, account_id=account_id, project_id=project_id)
    next_cursor = clock.format_us(ops[-1].created_at) if ops else cursor
    return Page(operations=ops, cursor=next_cursor)


async def get(tx: Tx, *, account_id: str, project_id: str, operation_id: str) -> Operation:
    await access.require_project(tx, account_id=account_id, project_id=project_id)
    op = None
    if ids.is_valid_uuid(operation_id):
        op = await tx.get_operation(project_id=project_id, operation_id=operation_id)
    if op is None:
        raise NotFound("operation not found")
    return op

"""Operations: their pages, and the engine's leases on them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from pgplane.core.models import Operation
from pgplane.core.operations import Action, Status
from pgplane.store.sqlite.common import Statements

_NEVER = 1 << 62  # a cursor later than any timestamp: "from the newest"

OP_COLUMNS = (
    "id, project_id, branch_id, endpoint_id, action, status, failures_count, error, retry_at,"
    " created_at, updated_at, total_duration_ms, lease_owner, lease_expires_at, attempt_started_at,"
    " source_branch_id, point_lsn, point_time, preserve_branch_id, snapshot_id, started_at"
)
# The operations pages are the hottest queries: their text is built once, and they leave out the
# engine's lease bookkeeping (every column read costs, and clients never see those).
_OP_PAGE_COLUMNS = OP_COLUMNS.split(", lease_owner", 1)[0]
_LIST_OPS = (
    f"SELECT {_OP_PAGE_COLUMNS} FROM operations WHERE project_id = ?1 AND created_at < ?2"
    " ORDER BY created_at DESC LIMIT ?3"
)
_LIST_ACCOUNT_OPS = (
    f"SELECT {_OP_PAGE_COLUMNS} FROM operations WHERE project_id = ?1 AND created_at < ?2"
    " AND EXISTS (SELECT 1 FROM projects p WHERE p.id = ?1 AND p.account_id = ?4)"
    " ORDER BY created_at DESC LIMIT ?3"
)


# Dictionary lookups: calling an Enum class to look a value up costs ten times as much, and a
# page of operations does it twenty times.
_ACTIONS = {a.value: a for a in Action}
_STATUSES = {s.value: s for s in Status}


def operation_from_row(r: Sequence[Any]) -> Operation:
    """A row of ``OP_COLUMNS``."""
    lease_owner, lease_expires_at, attempt_started_at, source_branch_id, *point = r[12:]
    return Operation(
        id=r[0],
        project_id=r[1],
        branch_id=r[2],
        endpoint_id=r[3],
        action=_ACTIONS[r[4]],
        status=_STATUSES[r[5]],
        failures_count=r[6],
        error=r[7],
        retry_at=r[8],
        created_at=r[9],
        updated_at=r[10],
        total_duration_ms=r[11],
        lease_owner=lease_owner,
        lease_expires_at=lease_expires_at,
        attempt_started_at=attempt_started_at,
        source_branch_id=source_branch_id,
        point_lsn=point[0],
        point_time=point[1],
        preserve_branch_id=point[2],
        snapshot_id=point[3],
        started_at=point[4],
    )


def _page_operation(r: Sequence[Any]) -> Operation:
    """A row of ``_OP_PAGE_COLUMNS``. The fields a page leaves out are left to their defaults,
    not passed: msgspec builds the struct five times faster so (0.2 against 1 us a row)."""
    return Operation(
        id=r[0],
        project_id=r[1],
        branch_id=r[2],
        endpoint_id=r[3],
        action=_ACTIONS[r[4]],
        status=_STATUSES[r[5]],
        failures_count=r[6],
        error=r[7],
        retry_at=r[8],
        created_at=r[9],
        updated_at=r[10],
        total_duration_ms=r[11],
    )


# Compare-and-set: the row as the dispatcher saw it, and (?9 given) its project still on the
# claiming node. The only interpolation is our column list.
CLAIM = (
    "UPDATE operations SET status = 'running', lease_owner = ?1, lease_expires_at = ?2,"
    " attempt_started_at = ?3, started_at = COALESCE(started_at, ?3), updated_at = ?3,"
    " failures_count = failures_count + ?4"
    " WHERE id = ?5 AND status = ?6 AND updated_at = ?7 AND lease_owner IS ?8"
    " AND (?9 IS NULL OR EXISTS (SELECT 1 FROM projects p WHERE p.id = operations.project_id"
    "                            AND p.node = ?9))"
    f" RETURNING {OP_COLUMNS}"
)


def claim_params(
    seen: Operation, owner: str, now: int, lease_until: int, failed_attempt: bool, node: str | None
) -> tuple[Any, ...]:
    return (
        owner,
        lease_until,
        now,
        int(failed_attempt),
        seen.id,
        seen.status.value,
        seen.updated_at,
        seen.lease_owner,
        node,
    )


class OperationsMixin(Statements):
    """:class:`pgplane.store.operations.OperationsTx` (both backends)."""

    queued: list[Operation]  # what this transaction inserted (the store logs it once committed)

    async def insert_operations(self, operations: Sequence[Operation]) -> list[Operation]:
        latest: dict[str, int] = {}
        stored = []
        for given in operations:
            if given.project_id not in latest:
                r = await self._c.one(
                    "SELECT MAX(created_at) FROM operations WHERE project_id = ?",
                    (given.project_id,),
                )
                latest[given.project_id] = r[0] if r and r[0] is not None else 0
            created = max(given.created_at, latest[given.project_id] + 1)
            latest[given.project_id] = created
            op = given
            if created != given.created_at:
                op = msgspec.structs.replace(given, created_at=created, updated_at=created)
            await self._c.execute(
                f"INSERT INTO operations ({OP_COLUMNS})"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    op.id,
                    op.project_id,
                    op.branch_id,
                    op.endpoint_id,
                    op.action.value,
                    op.status.value,
                    op.failures_count,
                    op.error,
                    op.retry_at,
                    op.created_at,
                    op.updated_at,
                    op.total_duration_ms,
                    op.lease_owner,
                    op.lease_expires_at,
                    op.attempt_started_at,
                    op.source_branch_id,
                    op.point_lsn,
                    op.point_time,
                    op.preserve_branch_id,
                    op.snapshot_id,
                    op.started_at,
                ),
            )
            stored.append(op)
        self.queued.extend(stored)
        return stored

    async def get_operation(self, *, project_id: str, operation_id: str) -> Operation | None:
        r = await self._c.one(
            f"SELECT {OP_COLUMNS} FROM operations WHERE id = ? AND project_id = ?",
            (operation_id, project_id),
        )
        return operation_from_row(r) if r else None

    async def list_operations(
        self, *, project_id: str, before: int | None, limit: int, account_id: str | None = None
    ) -> list[Operation]:
        cursor = _NEVER if before is None else before
        memo = self._memo
        asked = ("operations", project_id, cursor, limit, account_id)
        if memo is not None and (kept := memo.current().get(asked)) is not None:
            return list(kept)  # a copy: what is kept is never handed out
        if account_id is None:
            rows = await self._c.all(_LIST_OPS, (project_id, cursor, limit))
        else:
            rows = await self._c.all(_LIST_ACCOUNT_OPS, (project_id, cursor, limit, account_id))
        page = [_page_operation(r) for r in rows]
        if memo is not None and page:
            memo.keep(asked, tuple(page), len(page))
        return page

    async def list_unsettled_operations(
        self, project_id: str | None = None, *, node: str | None = None
    ) -> list[Operation]:
        unsettled = "status IN ('scheduling', 'running')"
        if project_id is not None:
            rows = await self._c.all(
                f"SELECT {OP_COLUMNS} FROM operations WHERE project_id = ? AND {unsettled}"
                " ORDER BY created_at",
                (project_id,),
            )
        elif node is not None:
            rows = await self._c.all(
                f"SELECT {OP_COLUMNS} FROM operations WHERE {unsettled}"
                " AND project_id IN (SELECT id FROM projects WHERE node = ?)"
                " ORDER BY project_id, created_at",
                (node,),
            )
        else:
            rows = await self._c.all(
                f"SELECT {OP_COLUMNS} FROM operations WHERE {unsettled}"
                " ORDER BY project_id, created_at"
            )
        return [operation_from_row(r) for r in rows]

    async def claim_operation(
        self,
        *,
        seen: Operation,
        owner: str,
        now: int,
        lease_until: int,
        failed_attempt: bool,
        node: str | None = None,
    ) -> Operation | None:
        r = await self._c.one(
            CLAIM, claim_params(seen, owner, now, lease_until, failed_attempt, node)
        )
        return operation_from_row(r) if r else None

    async def expire_leases(self, *, owners: Sequence[str], now: int) -> int:
        marks = ", ".join("?" * len(owners))
        cur = await self._c.execute(
            f"UPDATE operations SET lease_expires_at = ? WHERE status = 'running'"
            f" AND lease_owner IN ({marks})",
            (now, *owners),
        )
        return cur.rowcount

    async def update_owned_operation(self, operation: Operation, *, owner: str) -> bool:
        op = operation
        cur = await self._c.execute(
            "UPDATE operations SET status = ?, failures_count = ?, error = ?, retry_at = ?,"
            " updated_at = ?, total_duration_ms = ?, lease_owner = ?, lease_expires_at = ?,"
            " attempt_started_at = ? WHERE id = ? AND lease_owner = ?",
            (
                op.status.value,
                op.failures_count,
                op.error,
                op.retry_at,
                op.updated_at,
                op.total_duration_ms,
                op.lease_owner,
                op.lease_expires_at,
                op.attempt_started_at,
                op.id,
                owner,
            ),
        )
        return cur.rowcount == 1

    async def abandon_operation(self, *, operation_id: str, error: str, now: int) -> bool:
        cur = await self._c.execute(
            "UPDATE operations SET status = 'failed', error = ?, retry_at = NULL, updated_at = ?,"
            " lease_owner = NULL, lease_expires_at = NULL"
            " WHERE id = ? AND status IN ('scheduling', 'running')",
            (error, now, operation_id),
        )
        return cur.rowcount == 1

    async def last_operation_times(self, action: Action) -> dict[str, int]:
        rows = await self._c.all(
            "SELECT branch_id, MAX(created_at) FROM operations"
            " WHERE action = ? AND branch_id IS NOT NULL GROUP BY branch_id",
            (action.value,),
        )
        return {r[0]: r[1] for r in rows}

"""The shared statements on PostgreSQL, and the few that differ on purpose: the engine's claim
skips a row another claimer holds, and operations queued or settled are announced."""

from __future__ import annotations

from collections.abc import Sequence

from pgplane.core.models import Operation
from pgplane.store.postgresql.conn import PgConn
from pgplane.store.sqlite.operations import OP_COLUMNS, claim_params, operation_from_row
from pgplane.store.sqlite.tx import SqliteTx

# The row is taken only if it is still as the dispatcher saw it and no other transaction holds
# it (another node claiming it, or its owner recording an outcome): a claimer never waits on
# another, it moves on to the next operation. No writer lock: the WHERE is the guarantee.
# The only interpolation is our column list.
_CLAIM = (
    "UPDATE operations SET status = 'running', lease_owner = $1, lease_expires_at = $2,"  # noqa: S608
    " attempt_started_at = $3, started_at = COALESCE(started_at, $3), updated_at = $3,"
    " failures_count = failures_count + $4"
    " WHERE id = (SELECT id FROM operations WHERE id = $5 AND status = $6 AND updated_at = $7"
    "             AND lease_owner IS NOT DISTINCT FROM $8"
    "             AND ($9::text IS NULL OR EXISTS (SELECT 1 FROM projects p"
    "                  WHERE p.id = operations.project_id AND p.node = $9::text))"
    "             FOR UPDATE OF operations SKIP LOCKED)"
    f" RETURNING {OP_COLUMNS}"
)


class PgTx(SqliteTx):
    def __init__(self, conn: PgConn) -> None:
        super().__init__(conn)
        self.conn = conn
        self.announce = False  # whether the commit should wake other processes' engines

    async def insert_operations(self, operations: Sequence[Operation]) -> list[Operation]:
        stored = await super().insert_operations(operations)
        self.announce = self.announce or bool(stored)
        return stored

    async def update_owned_operation(self, operation: Operation, *, owner: str) -> bool:
        done = await super().update_owned_operation(operation, owner=owner)
        # Settled: what waited behind it in its project (on any node) may run now.
        self.announce = self.announce or (done and operation.status.settled)
        return done

    async def expire_leases(self, *, owners: Sequence[str], now: int) -> int:
        count = await super().expire_leases(owners=owners, now=now)
        self.announce = self.announce or count > 0
        return count

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
        r = await self.conn.unlocked(
            _CLAIM, claim_params(seen, owner, now, lease_until, failed_attempt, node)
        )
        return operation_from_row(r) if r else None

"""Branches of a project."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pgplane.core.models import Branch
from pgplane.store.sqlite.common import Statements, _taken

_BRANCH_COLUMNS = (
    "id, project_id, parent_id, name, is_default, protected, current_state, pending_state,"
    " state_changed_at, created_at, updated_at, parent_lsn, parent_timestamp, last_reset_at,"
    " expires_at, ttl_interval_seconds, init_source, restored_from, restore_status, restored_as,"
    " anonymized"
)


def _branch(r: Sequence[Any]) -> Branch:
    return Branch(
        id=r[0],
        project_id=r[1],
        parent_id=r[2],
        name=r[3],
        default=bool(r[4]),
        protected=bool(r[5]),
        current_state=r[6],
        pending_state=r[7],
        state_changed_at=r[8],
        created_at=r[9],
        updated_at=r[10],
        parent_lsn=r[11],
        parent_timestamp=r[12],
        last_reset_at=r[13],
        expires_at=r[14],
        ttl_interval_seconds=r[15],
        init_source=r[16],
        restored_from=r[17],
        restore_status=r[18],
        restored_as=r[19],
        anonymized=bool(r[20]),
    )


class BranchesMixin(Statements):
    """The branch part of :class:`pgplane.store.base.Tx` (both backends)."""

    async def insert_branch(self, branch: Branch) -> None:
        b = branch
        await self._c.write(
            f"INSERT INTO branches ({_BRANCH_COLUMNS}) VALUES ({', '.join('?' * 21)})",
            (
                b.id,
                b.project_id,
                b.parent_id,
                b.name,
                int(b.default),
                int(b.protected),
                b.current_state,
                b.pending_state,
                b.state_changed_at,
                b.created_at,
                b.updated_at,
                b.parent_lsn,
                b.parent_timestamp,
                b.last_reset_at,
                b.expires_at,
                b.ttl_interval_seconds,
                b.init_source,
                b.restored_from,
                b.restore_status,
                b.restored_as,
                int(b.anonymized),
            ),
            _taken("branch", b.name),
        )

    async def get_branch(self, *, project_id: str, branch_id: str) -> Branch | None:
        r = await self._c.one(
            f"SELECT {_BRANCH_COLUMNS} FROM branches"
            " WHERE id = ? AND project_id = ? AND deleted_at IS NULL",
            (branch_id, project_id),
        )
        return _branch(r) if r else None

    async def list_branches(self, project_id: str) -> list[Branch]:
        rows = await self._c.all(
            f"SELECT {_BRANCH_COLUMNS} FROM branches WHERE project_id = ? AND deleted_at IS NULL"
            " ORDER BY created_at DESC, id DESC",
            (project_id,),
        )
        return [_branch(r) for r in rows]

    async def update_branch(self, branch: Branch) -> None:
        b = branch
        await self._c.write(
            "UPDATE branches SET name = ?, protected = ?, is_default = ?, updated_at = ?,"
            " parent_id = ?, parent_lsn = ?, parent_timestamp = ?, last_reset_at = ?,"
            " current_state = ?, pending_state = ?, state_changed_at = ?, expires_at = ?,"
            " ttl_interval_seconds = ?, restored_from = ?, restore_status = ?, restored_as = ?"
            " WHERE id = ? AND deleted_at IS NULL",
            (
                b.name,
                int(b.protected),
                int(b.default),
                b.updated_at,
                b.parent_id,
                b.parent_lsn,
                b.parent_timestamp,
                b.last_reset_at,
                b.current_state,
                b.pending_state,
                b.state_changed_at,
                b.expires_at,
                b.ttl_interval_seconds,
                b.restored_from,
                b.restore_status,
                b.restored_as,
                b.id,
            ),
            _taken("branch", b.name),
        )

    async def delete_branch(self, *, branch_id: str, now: int) -> None:
        await self._c.execute(
            "UPDATE branches SET deleted_at = ?, updated_at = ?, is_default = 0"
            " WHERE id = ? AND deleted_at IS NULL",
            (now, now, branch_id),
        )

    async def count_branches(self, project_id: str) -> int:
        r = await self._c.one(
            "SELECT count(*) FROM branches WHERE project_id = ? AND deleted_at IS NULL",
            (project_id,),
        )
        return int(r[0])

    async def has_child_branches(self, branch_id: str) -> bool:
        r = await self._c.one(
            "SELECT 1 FROM branches WHERE parent_id = ? AND deleted_at IS NULL LIMIT 1",
            (branch_id,),
        )
        return r is not None

    async def set_branch_state(
        self, *, branch_id: str, current_state: str, pending_state: str | None, now: int
    ) -> None:
        await self._c.execute(
            "UPDATE branches SET current_state = ?, pending_state = ?, state_changed_at = ?,"
            " updated_at = ? WHERE id = ?",
            (current_state, pending_state, now, now, branch_id),
        )

    async def expired_branches(self, *, now: int) -> list[Branch]:
        rows = await self._c.all(
            f"SELECT {_BRANCH_COLUMNS} FROM branches"
            " WHERE deleted_at IS NULL AND expires_at IS NOT NULL AND expires_at <= ?"
            " AND project_id IN (SELECT id FROM projects WHERE deleted_at IS NULL)"
            " ORDER BY expires_at, id",
            (now,),
        )
        return [_branch(r) for r in rows]

"""Snapshots of a project, its branches' backup schedules, and the checks of their backups."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from pgplane.core.models import BackupCheck, Snapshot
from pgplane.errors import Conflict
from pgplane.store.sqlite.common import Statements

_COLUMNS = (
    "id, project_id, source_branch_id, name, state, lsn, point_time, manual, full_size, roles,"
    " databases, schedule_slot, created_at, updated_at, expires_at, deleted_at, slug"
)
_roles = msgspec.json.Decoder(list[dict[str, Any]])
_databases = msgspec.json.Decoder(list[dict[str, str]])
_schedule = msgspec.json.Decoder(list[dict[str, Any]])


def _snapshot(r: Sequence[Any]) -> Snapshot:
    return Snapshot(
        id=r[0],
        project_id=r[1],
        source_branch_id=r[2],
        name=r[3],
        state=r[4],
        lsn=r[5],
        point_time=r[6],
        manual=bool(r[7]),
        full_size=r[8],
        roles=_roles.decode(r[9]),
        databases=_databases.decode(r[10]),
        schedule_slot=r[11],
        created_at=r[12],
        updated_at=r[13],
        expires_at=r[14],
        deleted_at=r[15],
        slug=r[16],
    )


def _row(s: Snapshot) -> tuple[Any, ...]:
    return (
        s.id,
        s.project_id,
        s.source_branch_id,
        s.name,
        s.state,
        s.lsn,
        s.point_time,
        int(s.manual),
        s.full_size,
        msgspec.json.encode(s.roles).decode(),
        msgspec.json.encode(s.databases).decode(),
        s.schedule_slot,
        s.created_at,
        s.updated_at,
        s.expires_at,
        s.deleted_at,
        s.slug,
    )


class SnapshotsMixin(Statements):
    """The snapshot part of :class:`pgplane.store.base.Tx` (both backends)."""

    async def insert_snapshot(self, snapshot: Snapshot) -> None:
        await self._c.write(
            f"INSERT INTO snapshots ({_COLUMNS}) VALUES ({', '.join('?' * 17)})",
            _row(snapshot),
            Conflict(
                f"slug {snapshot.slug!r} is taken by another snapshot of the project"
                if snapshot.schedule_slot is None
                else f"snapshot slot {snapshot.schedule_slot} of the branch is taken already"
            ),
        )

    async def get_snapshot(self, *, project_id: str, snapshot_id: str) -> Snapshot | None:
        r = await self._c.one(
            f"SELECT {_COLUMNS} FROM snapshots"
            " WHERE id = ? AND project_id = ? AND deleted_at IS NULL",
            (snapshot_id, project_id),
        )
        return _snapshot(r) if r else None

    async def get_snapshot_any(self, snapshot_id: str) -> Snapshot | None:
        r = await self._c.one(f"SELECT {_COLUMNS} FROM snapshots WHERE id = ?", (snapshot_id,))
        return _snapshot(r) if r else None

    async def list_snapshots(
        self, project_id: str, *, include_deleted: bool = False
    ) -> list[Snapshot]:
        live = "" if include_deleted else " AND deleted_at IS NULL"
        rows = await self._c.all(
            f"SELECT {_COLUMNS} FROM snapshots WHERE project_id = ?{live} ORDER BY created_at, id",
            (project_id,),
        )
        return [_snapshot(r) for r in rows]

    async def update_snapshot(self, snapshot: Snapshot) -> None:
        columns = _COLUMNS.split(", ")[1:]
        await self._c.execute(
            f"UPDATE snapshots SET {', '.join(f'{c} = ?' for c in columns)} WHERE id = ?",
            (*_row(snapshot)[1:], snapshot.id),
        )

    async def expired_snapshots(self, *, now: int, limit: int) -> list[Snapshot]:
        rows = await self._c.all(
            f"SELECT {_COLUMNS} FROM snapshots WHERE deleted_at IS NULL"
            " AND expires_at IS NOT NULL AND expires_at <= ? ORDER BY expires_at LIMIT ?",
            (now, limit),
        )
        return [_snapshot(r) for r in rows]

    async def snapshot_slug_taken(self, *, project_id: str, slug: str) -> bool:
        r = await self._c.one(
            "SELECT 1 FROM snapshots WHERE project_id = ? AND slug = ? AND deleted_at IS NULL",
            (project_id, slug),
        )
        return r is not None

    async def snapshot_slot_taken(self, *, branch_id: str, slot: str) -> bool:
        r = await self._c.one(
            "SELECT 1 FROM snapshots WHERE source_branch_id = ? AND schedule_slot = ?",
            (branch_id, slot),
        )
        return r is not None

    async def get_backup_schedule(self, branch_id: str) -> tuple[list[dict[str, Any]], int] | None:
        r = await self._c.one(
            "SELECT schedule, updated_at FROM backup_schedules WHERE branch_id = ?", (branch_id,)
        )
        return (_schedule.decode(r[0]), r[1]) if r else None

    async def set_backup_schedule(
        self,
        *,
        project_id: str,
        branch_id: str,
        schedule: Sequence[Mapping[str, Any]],
        now: int,
    ) -> None:
        if not schedule:
            await self._c.execute("DELETE FROM backup_schedules WHERE branch_id = ?", (branch_id,))
            return
        await self._c.execute(
            "INSERT INTO backup_schedules (branch_id, project_id, schedule, updated_at)"
            " VALUES (?1, ?2, ?3, ?4) ON CONFLICT (branch_id)"
            " DO UPDATE SET schedule = excluded.schedule, updated_at = excluded.updated_at",
            (branch_id, project_id, msgspec.json.encode([dict(e) for e in schedule]).decode(), now),
        )

    async def list_backup_schedules(self) -> list[tuple[str, str, list[dict[str, Any]], int]]:
        rows = await self._c.all(
            "SELECT s.project_id, s.branch_id, s.schedule, s.updated_at FROM backup_schedules s"
            " JOIN branches b ON b.id = s.branch_id JOIN projects p ON p.id = s.project_id"
            " WHERE b.deleted_at IS NULL AND p.deleted_at IS NULL"
        )
        return [(r[0], r[1], _schedule.decode(r[2]), r[3]) for r in rows]

    async def put_backup_check(self, check: BackupCheck) -> None:
        c = check
        await self._c.execute(
            "INSERT INTO backup_checks (branch_id, project_id, checked_at, restorable_to, error)"
            " VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (branch_id) DO UPDATE SET"
            " checked_at = excluded.checked_at, restorable_to = excluded.restorable_to,"
            " error = excluded.error",
            (c.branch_id, c.project_id, c.checked_at, c.restorable_to, c.error),
        )

    async def backup_checks(self, project_id: str | None = None) -> list[BackupCheck]:
        of = "" if project_id is None else " AND c.project_id = ?"
        rows = await self._c.all(
            "SELECT c.project_id, c.branch_id, c.checked_at, c.restorable_to, c.error"
            " FROM backup_checks c JOIN branches b ON b.id = c.branch_id"
            " JOIN projects p ON p.id = c.project_id"
            f" WHERE b.deleted_at IS NULL AND p.deleted_at IS NULL{of} ORDER BY c.branch_id",
            () if project_id is None else (project_id,),
        )
        return [
            BackupCheck(
                project_id=r[0], branch_id=r[1], checked_at=r[2], restorable_to=r[3], error=r[4]
            )
            for r in rows
        ]

"""Roles and databases of a branch (a deleted one is a tombstone until its drop is applied)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pgplane.core.models import Database, Role
from pgplane.store.sqlite.common import Statements, _taken

_ROLE_COLUMNS = "branch_id, name, password, protected, created_at, updated_at, login, deleted_at"
_DATABASE_COLUMNS = (
    "id, branch_id, name, owner_name, created_at, updated_at, applied_name, deleted_at"
)


def _role(r: Sequence[Any]) -> Role:
    return Role(
        branch_id=r[0],
        name=r[1],
        password=r[2],
        protected=bool(r[3]),
        created_at=r[4],
        updated_at=r[5],
        login=bool(r[6]),
        deleted_at=r[7],
    )


def _database(r: Sequence[Any]) -> Database:
    return Database(
        id=r[0],
        branch_id=r[1],
        name=r[2],
        owner_name=r[3],
        created_at=r[4],
        updated_at=r[5],
        applied_name=r[6],
        deleted_at=r[7],
    )


class RolesMixin(Statements):
    """The role part of :class:`pgplane.store.base.Tx` (both backends)."""

    async def insert_role(self, role: Role) -> None:
        r = role
        await self._c.write(
            "INSERT INTO roles (branch_id, name, password, protected, login, created_at,"
            " updated_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                r.branch_id,
                r.name,
                r.password,
                int(r.protected),
                int(r.login),
                r.created_at,
                r.updated_at,
            ),
            _taken("role", r.name),
        )

    async def get_role(self, *, branch_id: str, name: str) -> Role | None:
        r = await self._c.one(
            f"SELECT {_ROLE_COLUMNS} FROM roles"
            " WHERE branch_id = ? AND name = ? AND deleted_at IS NULL",
            (branch_id, name),
        )
        return _role(r) if r else None

    async def list_roles(self, branch_id: str, *, deleted: bool = False) -> list[Role]:
        state = "IS NOT NULL" if deleted else "IS NULL"
        rows = await self._c.all(
            f"SELECT {_ROLE_COLUMNS} FROM roles WHERE branch_id = ? AND deleted_at {state}"
            " ORDER BY id",
            (branch_id,),
        )
        return [_role(r) for r in rows]

    async def update_role(self, role: Role) -> None:
        await self._c.execute(
            "UPDATE roles SET password = ?, login = ?, updated_at = ?"
            " WHERE branch_id = ? AND name = ? AND deleted_at IS NULL",
            (role.password, int(role.login), role.updated_at, role.branch_id, role.name),
        )

    async def delete_role(self, *, branch_id: str, name: str, now: int) -> None:
        await self._c.execute(
            "UPDATE roles SET deleted_at = ?, updated_at = ?"
            " WHERE branch_id = ? AND name = ? AND deleted_at IS NULL",
            (now, now, branch_id, name),
        )

    async def purge_roles(self, *, branch_id: str, tombstones: Sequence[Role]) -> None:
        await self._c.executemany(
            "DELETE FROM roles WHERE branch_id = ? AND name = ? AND deleted_at = ?",
            [(branch_id, r.name, r.deleted_at) for r in tombstones if r.deleted_at is not None],
        )


class DatabasesMixin(Statements):
    """The database part of :class:`pgplane.store.base.Tx` (both backends)."""

    async def insert_database(
        self,
        *,
        branch_id: str,
        name: str,
        owner_name: str,
        now: int,
        applied_name: str | None = None,
    ) -> Database:
        row = await self._c.write_one(
            "INSERT INTO databases (branch_id, name, owner_name, applied_name, created_at,"
            " updated_at) VALUES (?, ?, ?, ?, ?, ?) RETURNING id",
            (branch_id, name, owner_name, applied_name, now, now),
            _taken("database", name),
        )
        return Database(
            id=row[0],
            branch_id=branch_id,
            name=name,
            owner_name=owner_name,
            created_at=now,
            updated_at=now,
            applied_name=applied_name,
        )

    async def get_database(self, *, branch_id: str, name: str) -> Database | None:
        r = await self._c.one(
            f"SELECT {_DATABASE_COLUMNS} FROM databases"
            " WHERE branch_id = ? AND name = ? AND deleted_at IS NULL",
            (branch_id, name),
        )
        return _database(r) if r else None

    async def list_databases(self, branch_id: str, *, deleted: bool = False) -> list[Database]:
        state = "IS NOT NULL" if deleted else "IS NULL"
        rows = await self._c.all(
            f"SELECT {_DATABASE_COLUMNS} FROM databases WHERE branch_id = ?"
            f" AND deleted_at {state} ORDER BY id",
            (branch_id,),
        )
        return [_database(r) for r in rows]

    async def update_database(self, database: Database) -> None:
        d = database
        await self._c.write(
            "UPDATE databases SET name = ?, owner_name = ?, updated_at = ?"
            " WHERE id = ? AND deleted_at IS NULL",
            (d.name, d.owner_name, d.updated_at, d.id),
            _taken("database", d.name),
        )

    async def delete_database(self, *, database_id: int, now: int) -> None:
        await self._c.execute(
            "UPDATE databases SET deleted_at = ?, updated_at = ?"
            " WHERE id = ? AND deleted_at IS NULL",
            (now, now, database_id),
        )

    async def mark_databases_applied(self, applied: Sequence[tuple[int, str]]) -> None:
        await self._c.executemany(
            "UPDATE databases SET applied_name = ?2 WHERE id = ?1", list(applied)
        )

    async def purge_databases(self, database_ids: Sequence[int]) -> None:
        await self._c.executemany(
            "DELETE FROM databases WHERE id = ? AND deleted_at IS NOT NULL",
            [(i,) for i in database_ids],
        )

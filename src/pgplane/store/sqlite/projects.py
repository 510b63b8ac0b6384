"""Projects: their settings, storage state and pages."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from pgplane.core.models import Project
from pgplane.errors import Conflict
from pgplane.store.sqlite.common import Statements, _json_decode, _json_encode

_PROJECT_COLUMNS = (
    "p.id, p.account_id, p.name, p.region_id, p.pg_version, p.provisioner, p.store_passwords,"
    " p.history_retention_seconds, p.default_endpoint_settings, p.settings, p.created_at,"
    " p.updated_at, p.deleted_at, p.storage_state,"
    " EXISTS (SELECT 1 FROM operations o WHERE o.project_id = p.id"
    "         AND o.status IN ('scheduling', 'running'))"
)


def _project(r: Sequence[Any]) -> Project:
    return Project(
        id=r[0],
        account_id=r[1],
        name=r[2],
        region_id=r[3],
        pg_version=r[4],
        provisioner=r[5],
        store_passwords=bool(r[6]),
        history_retention_seconds=r[7],
        default_endpoint_settings=_json_decode(r[8]),
        settings=_json_decode(r[9]),
        created_at=r[10],
        updated_at=r[11],
        deleted_at=r[12],
        storage_state=r[13],
        locked=bool(r[14]),
    )


class ProjectsMixin(Statements):
    """The project part of :class:`pgplane.store.base.Tx` (both backends)."""

    async def insert_project(self, project: Project) -> None:
        p = project
        await self._c.write(
            "INSERT INTO projects (id, account_id, name, region_id, pg_version, provisioner,"
            " store_passwords, history_retention_seconds, default_endpoint_settings, settings,"
            " created_at, updated_at, deleted_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                p.id,
                p.account_id,
                p.name,
                p.region_id,
                p.pg_version,
                p.provisioner,
                int(p.store_passwords),
                p.history_retention_seconds,
                _json_encode(p.default_endpoint_settings),
                _json_encode(p.settings),
                p.created_at,
                p.updated_at,
                p.deleted_at,
            ),
            Conflict("project already exists"),
        )

    async def get_project(
        self, *, account_id: str, project_id: str, include_deleted: bool = False
    ) -> Project | None:
        live = "" if include_deleted else " AND p.deleted_at IS NULL"
        r = await self._c.one(
            f"SELECT {_PROJECT_COLUMNS} FROM projects p WHERE p.id = ? AND p.account_id = ?{live}",
            (project_id, account_id),
        )
        return _project(r) if r else None

    async def get_project_by_id(self, project_id: str) -> Project | None:
        r = await self._c.one(
            f"SELECT {_PROJECT_COLUMNS} FROM projects p WHERE p.id = ?", (project_id,)
        )
        return _project(r) if r else None

    async def list_projects(
        self, *, account_id: str, after_id: str | None, limit: int, search: str | None = None
    ) -> list[Project]:
        # The same SQL for both engines: LIKE with its wildcards escaped, lower() both sides;
        # the needle is the last parameter of either query.
        def matching(n: int) -> str:
            like = f"LIKE ?{n} ESCAPE '\\'"
            return f" AND (lower(p.name) {like} OR p.id {like})" if search else ""

        needle = ("%" + re.sub(r"([\\%_])", r"\\\1", search.lower()) + "%",) if search else ()
        if after_id is None:
            rows = await self._c.all(
                f"SELECT {_PROJECT_COLUMNS} FROM projects p"
                f" WHERE p.account_id = ?1 AND p.deleted_at IS NULL{matching(3)}"
                " ORDER BY p.created_at DESC, p.id DESC LIMIT ?2",
                (account_id, limit, *needle),
            )
        else:
            rows = await self._c.all(
                f"SELECT {_PROJECT_COLUMNS} FROM projects p, projects c"
                " WHERE c.id = ?1 AND c.account_id = ?2"
                f" AND p.account_id = ?2 AND p.deleted_at IS NULL{matching(4)}"
                " AND (p.created_at < c.created_at"
                "      OR (p.created_at = c.created_at AND p.id < c.id))"
                " ORDER BY p.created_at DESC, p.id DESC LIMIT ?3",
                (after_id, account_id, limit, *needle),
            )
        return [_project(r) for r in rows]

    async def count_projects(self, account_id: str) -> int:
        r = await self._c.one(
            "SELECT count(*) FROM projects WHERE account_id = ? AND deleted_at IS NULL",
            (account_id,),
        )
        return int(r[0])

    async def project_exists(self, *, account_id: str, project_id: str) -> bool:
        r = await self._c.one(
            "SELECT 1 FROM projects WHERE id = ? AND account_id = ?", (project_id, account_id)
        )
        return r is not None

    async def update_project(self, project: Project) -> None:
        p = project
        await self._c.execute(
            "UPDATE projects SET name = ?, history_retention_seconds = ?,"
            " default_endpoint_settings = ?, settings = ?, updated_at = ?, deleted_at = ?"
            " WHERE id = ?",
            (
                p.name,
                p.history_retention_seconds,
                _json_encode(p.default_endpoint_settings),
                _json_encode(p.settings),
                p.updated_at,
                p.deleted_at,
                p.id,
            ),
        )

    async def set_project_storage(self, *, project_id: str, state: str) -> None:
        await self._c.execute(
            "UPDATE projects SET storage_state = ? WHERE id = ?", (state, project_id)
        )

    async def detach_candidates(self, *, idle_before: int) -> list[str]:
        # Idle: no compute active or changing, no endpoint used since, and no operation but the
        # platform's own checks since (they must not keep a project attached forever).
        rows = await self._c.all(
            "SELECT p.id FROM projects p WHERE p.deleted_at IS NULL"
            " AND p.storage_state = 'attached' AND p.updated_at < ?1"
            " AND NOT EXISTS (SELECT 1 FROM endpoints e WHERE e.project_id = p.id"
            "   AND e.deleted_at IS NULL AND (e.current_state = 'active'"
            "   OR e.pending_state IS NOT NULL OR COALESCE(e.last_active, 0) >= ?1"
            "   OR COALESCE(e.suspended_at, 0) >= ?1))"
            " AND NOT EXISTS (SELECT 1 FROM operations o WHERE o.project_id = p.id"
            "   AND (o.status IN ('scheduling', 'running') OR (o.updated_at >= ?1"
            "   AND o.action NOT IN ('check_availability', 'tenant_detach'))))",
            (idle_before,),
        )
        return [r[0] for r in rows]

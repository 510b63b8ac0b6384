"""Endpoints: their settings, states, ports and activity."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pgplane.core.models import Endpoint
from pgplane.errors import AlreadyExists, Conflict
from pgplane.store.sqlite.common import (
    Statements,
    _json_decode,
    _json_encode,
)

_ENDPOINT_COLUMNS = (
    "id, project_id, branch_id, type, current_state, pending_state, port,"
    " autoscaling_limit_min_cu, autoscaling_limit_max_cu, suspend_timeout_seconds, settings,"
    " disabled, created_at, updated_at, last_active, started_at, suspended_at, name"
)


def _endpoint(r: Sequence[Any]) -> Endpoint:
    return Endpoint(
        id=r[0],
        project_id=r[1],
        branch_id=r[2],
        type=r[3],
        current_state=r[4],
        pending_state=r[5],
        port=r[6],
        autoscaling_limit_min_cu=r[7],
        autoscaling_limit_max_cu=r[8],
        suspend_timeout_seconds=r[9],
        settings=_json_decode(r[10]),
        disabled=bool(r[11]),
        created_at=r[12],
        updated_at=r[13],
        last_active=r[14],
        started_at=r[15],
        suspended_at=r[16],
        name=r[17],
    )


def _endpoint_conflict(port: int) -> Callable[[str], Conflict]:
    def conflict(index: str) -> Conflict:
        # Two unique indexes: the branch's one read_write endpoint (the client's conflict) and
        # the port (allocated in this transaction: only another process could race).
        if "port" in index:
            return Conflict(f"compute port {port} is already taken; retry")
        return AlreadyExists("endpoint", "read-write endpoint already exists on this branch")

    return conflict


class EndpointsMixin(Statements):
    """The endpoint part of :class:`pgplane.store.base.Tx` (both backends)."""

    async def insert_endpoint(self, endpoint: Endpoint) -> None:
        e = endpoint
        await self._c.write(
            f"INSERT INTO endpoints ({_ENDPOINT_COLUMNS})"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                e.id,
                e.project_id,
                e.branch_id,
                e.type,
                e.current_state,
                e.pending_state,
                e.port,
                e.autoscaling_limit_min_cu,
                e.autoscaling_limit_max_cu,
                e.suspend_timeout_seconds,
                _json_encode(e.settings),
                int(e.disabled),
                e.created_at,
                e.updated_at,
                e.last_active,
                e.started_at,
                e.suspended_at,
                e.name,
            ),
            _endpoint_conflict(e.port),
        )

    async def get_endpoint(self, *, project_id: str, endpoint_id: str) -> Endpoint | None:
        r = await self._c.one(
            f"SELECT {_ENDPOINT_COLUMNS} FROM endpoints"
            " WHERE id = ? AND project_id = ? AND deleted_at IS NULL",
            (endpoint_id, project_id),
        )
        return _endpoint(r) if r else None

    async def find_endpoint(self, endpoint_id: str) -> Endpoint | None:
        r = await self._c.one(
            f"SELECT {_ENDPOINT_COLUMNS} FROM endpoints WHERE id = ? AND deleted_at IS NULL",
            (endpoint_id,),
        )
        return _endpoint(r) if r else None

    async def list_live_endpoints(self) -> list[Endpoint]:
        rows = await self._c.all(
            f"SELECT {_ENDPOINT_COLUMNS} FROM endpoints e WHERE deleted_at IS NULL"
            " AND EXISTS (SELECT 1 FROM projects p WHERE p.id = e.project_id"
            "             AND p.deleted_at IS NULL)"
            " ORDER BY created_at, id"
        )
        return [_endpoint(r) for r in rows]

    async def list_running_endpoints(self, account_id: str) -> list[Endpoint]:
        rows = await self._c.all(
            f"SELECT {_ENDPOINT_COLUMNS} FROM endpoints WHERE deleted_at IS NULL AND disabled = 0"
            " AND project_id IN (SELECT id FROM projects WHERE account_id = ?"
            "                    AND deleted_at IS NULL)"
            " AND (pending_state = 'active'"
            "      OR (current_state = 'active' AND pending_state IS NULL)"
            "      OR EXISTS (SELECT 1 FROM operations o WHERE o.project_id = endpoints.project_id"
            "                 AND o.status IN ('scheduling', 'running')"
            "                 AND o.endpoint_id = endpoints.id AND o.action = 'start_compute'))"
            " ORDER BY created_at, id",
            (account_id,),
        )
        return [_endpoint(r) for r in rows]

    async def record_endpoint_activity(self, activity: Sequence[tuple[str, int]]) -> None:
        # Forward only (SQLite's two-argument MAX() is not PostgreSQL's: the WHERE does it).
        await self._c.executemany(
            "UPDATE endpoints SET last_active = ?1 WHERE id = ?2 AND COALESCE(last_active, 0) < ?1",
            [(at, endpoint_id) for endpoint_id, at in activity],
        )

    async def list_endpoints(self, project_id: str) -> list[Endpoint]:
        rows = await self._c.all(
            f"SELECT {_ENDPOINT_COLUMNS} FROM endpoints WHERE project_id = ?"
            " AND deleted_at IS NULL ORDER BY created_at DESC, id DESC",
            (project_id,),
        )
        return [_endpoint(r) for r in rows]

    async def update_endpoint(self, endpoint: Endpoint) -> None:
        e = endpoint
        await self._c.execute(
            "UPDATE endpoints SET autoscaling_limit_min_cu = ?, autoscaling_limit_max_cu = ?,"
            " suspend_timeout_seconds = ?, settings = ?, disabled = ?, current_state = ?,"
            " pending_state = ?, updated_at = ?, name = ? WHERE id = ? AND deleted_at IS NULL",
            (
                e.autoscaling_limit_min_cu,
                e.autoscaling_limit_max_cu,
                e.suspend_timeout_seconds,
                _json_encode(e.settings),
                int(e.disabled),
                e.current_state,
                e.pending_state,
                e.updated_at,
                e.name,
                e.id,
            ),
        )

    async def set_endpoint_branch(self, *, endpoint_id: str, branch_id: str, now: int) -> None:
        await self._c.write(
            "UPDATE endpoints SET branch_id = ?, updated_at = ?"
            " WHERE id = ? AND deleted_at IS NULL",
            (branch_id, now, endpoint_id),
            _endpoint_conflict(0),
        )

    async def set_endpoint_port(self, *, endpoint_id: str, port: int, now: int) -> None:
        await self._c.execute(
            "UPDATE endpoints SET port = ?, updated_at = ? WHERE id = ? AND deleted_at IS NULL",
            (port, now, endpoint_id),
        )

    async def delete_endpoint(self, *, endpoint_id: str, now: int) -> None:
        await self._c.execute(
            "UPDATE endpoints SET deleted_at = ?, updated_at = ?"
            " WHERE id = ? AND deleted_at IS NULL",
            (now, now, endpoint_id),
        )

    async def used_ports(self, *, held_since: int) -> set[int]:
        rows = await self._c.all(
            "SELECT port FROM endpoints WHERE deleted_at IS NULL OR deleted_at > ?", (held_since,)
        )
        return {r[0] for r in rows}

    async def set_endpoint_state(
        self, *, endpoint_id: str, current_state: str, pending_state: str | None, now: int
    ) -> None:
        started = now if current_state == "active" else None
        suspended = now if current_state == "idle" else None
        await self._c.execute(
            "UPDATE endpoints SET current_state = ?, pending_state = ?, updated_at = ?,"
            " started_at = COALESCE(?, started_at), suspended_at = COALESCE(?, suspended_at),"
            " last_active = COALESCE(?, last_active) WHERE id = ?",
            (current_state, pending_state, now, started, suspended, started, endpoint_id),
        )

    async def delete_project_endpoints(self, *, project_id: str, now: int) -> None:
        await self._c.execute(
            "UPDATE endpoints SET deleted_at = ?, updated_at = ?"
            " WHERE project_id = ? AND deleted_at IS NULL",
            (now, now, project_id),
        )

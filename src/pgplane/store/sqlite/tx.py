"""Statements of the SQLite store, one method of the contract each."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any

import msgspec

from pgplane.core.models import (
    Account,
    ApiKey,
    Branch,
    Database,
    Endpoint,
    Operation,
    Project,
    Role,
)
from pgplane.core.operations import Action, Status
from pgplane.errors import AlreadyExists, Conflict
from pgplane.store.base import Tx
from pgplane.store.sqlite.verifiers import RoleVerifiersMixin

_json_encode = msgspec.json.encode
_NEVER = 1 << 62  # a cursor later than any timestamp: "from the newest"
_json_decode = msgspec.json.decode

_OP_COLUMNS = (
    "id, project_id, branch_id, endpoint_id, action, status, failures_count, error, retry_at,"
    " created_at, updated_at, total_duration_ms, lease_owner, lease_expires_at, attempt_started_at,"
    " source_branch_id"
)
# The operations pages are the hottest queries: their text is built once, and they leave out the
# engine's lease bookkeeping (every column read costs, and clients never see those).
_OP_PAGE_COLUMNS = _OP_COLUMNS.split(", lease_owner", 1)[0]
_LIST_OPS = (
    f"SELECT {_OP_PAGE_COLUMNS} FROM operations WHERE project_id = ?1 AND created_at < ?2"
    " ORDER BY created_at DESC LIMIT ?3"
)
_LIST_ACCOUNT_OPS = (
    f"SELECT {_OP_PAGE_COLUMNS} FROM operations WHERE project_id = ?1 AND created_at < ?2"
    " AND EXISTS (SELECT 1 FROM projects p WHERE p.id = ?1 AND p.account_id = ?4)"
    " ORDER BY created_at DESC LIMIT ?3"
)
_PROJECT_COLUMNS = (
    "p.id, p.account_id, p.name, p.region_id, p.pg_version, p.provisioner, p.store_passwords,"
    " p.history_retention_seconds, p.default_endpoint_settings, p.settings, p.created_at,"
    " p.updated_at, p.deleted_at, p.storage_state,"
    " EXISTS (SELECT 1 FROM operations o WHERE o.project_id = p.id"
    "         AND o.status IN ('scheduling', 'running'))"
)
_BRANCH_COLUMNS = (
    "id, project_id, parent_id, name, is_default, protected, current_state, pending_state,"
    " state_changed_at, created_at, updated_at"
)
_ENDPOINT_COLUMNS = (
    "id, project_id, branch_id, type, current_state, pending_state, port,"
    " autoscaling_limit_min_cu, autoscaling_limit_max_cu, suspend_timeout_seconds, settings,"
    " disabled, created_at, updated_at, last_active, started_at, suspended_at"
)
_KEY_COLUMNS = (
    "id, account_id, name, digest, created_at, created_by, last_used_at, last_used_from_addr,"
    " revoked_at"
)


# Dictionary lookups: calling an Enum class to look a value up costs ten times as much, and a
# page of operations does it twenty times.
_ACTIONS = {a.value: a for a in Action}
_STATUSES = {s.value: s for s in Status}


_NO_LEASE = (None, None, None, None)


def _operation(r: Sequence[Any]) -> Operation:
    """A row of ``_OP_COLUMNS``, or of ``_OP_PAGE_COLUMNS`` (without the lease)."""
    lease_owner, lease_expires_at, attempt_started_at, source_branch_id = (
        r[12:] if len(r) > 12 else _NO_LEASE
    )
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
    )


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


def _api_key(r: Sequence[Any]) -> ApiKey:
    return ApiKey(
        id=r[0],
        account_id=r[1],
        name=r[2],
        digest=r[3],
        created_at=r[4],
        created_by=r[5],
        last_used_at=r[6],
        last_used_from_addr=r[7],
        revoked_at=r[8],
    )


def _unique_violation(exc: sqlite3.IntegrityError) -> bool:
    """A unique index or primary key broken (not a foreign key or NOT NULL: those are bugs)."""
    return exc.sqlite_errorcode in (
        sqlite3.SQLITE_CONSTRAINT_UNIQUE,
        sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY,
    )


def _taken(kind: str, name: str) -> AlreadyExists:
    """Neon's message, the name quoted as Go's %q does: ``role already exists; role_name:"x"``."""
    quoted = json.dumps(name, ensure_ascii=False)
    return AlreadyExists(kind, f"{kind} already exists; {kind}_name:{quoted}")


class SqliteTx(RoleVerifiersMixin, Tx):
    def __init__(self, conn: sqlite3.Connection) -> None:
        self._c = conn

    def _write(self, sql: str, params: Sequence[Any], conflict: Conflict) -> sqlite3.Cursor:
        """Execute an INSERT or UPDATE; a unique index it breaks raises ``conflict``.

        The indexes are the guarantee (two requests racing for one name both pass any check made
        before): whatever the services checked, a duplicate ends here as a 409, never a 500.
        """
        try:
            return self._c.execute(sql, params)
        except sqlite3.IntegrityError as exc:
            if _unique_violation(exc):
                raise conflict from exc
            raise

    # -- accounts -------------------------------------------------------------------------------

    async def get_account(self, account_id: str) -> Account | None:
        r = self._c.execute(
            "SELECT id, email, name, created_at FROM accounts WHERE id = ?", (account_id,)
        ).fetchone()
        return Account(id=r[0], email=r[1], name=r[2], created_at=r[3]) if r else None

    async def get_account_by_email(self, email: str) -> Account | None:
        r = self._c.execute(
            "SELECT id, email, name, created_at FROM accounts WHERE email = ?", (email,)
        ).fetchone()
        return Account(id=r[0], email=r[1], name=r[2], created_at=r[3]) if r else None

    async def insert_account(self, account: Account) -> None:
        self._write(
            "INSERT INTO accounts (id, email, name, created_at) VALUES (?, ?, ?, ?)",
            (account.id, account.email, account.name, account.created_at),
            AlreadyExists("account", "account already exists"),
        )

    # -- API keys -------------------------------------------------------------------------------

    async def insert_api_key(
        self, *, account_id: str, name: str, digest: str, created_at: int, created_by: str
    ) -> ApiKey:
        cur = self._write(
            "INSERT INTO api_keys (account_id, name, digest, created_at, created_by)"
            " VALUES (?, ?, ?, ?, ?)",
            (account_id, name, digest, created_at, created_by),
            Conflict("API key already exists"),
        )
        assert cur.lastrowid is not None  # noqa: S101 - sqlite always sets it after an INSERT
        return ApiKey(
            id=cur.lastrowid,
            account_id=account_id,
            name=name,
            digest=digest,
            created_at=created_at,
            created_by=created_by,
            last_used_at=None,
            last_used_from_addr="",
            revoked_at=None,
        )

    async def get_api_key_by_digest(self, digest: str) -> ApiKey | None:
        r = self._c.execute(
            f"SELECT {_KEY_COLUMNS} FROM api_keys WHERE digest = ?", (digest,)
        ).fetchone()
        return _api_key(r) if r else None

    async def list_api_keys(self, account_id: str) -> list[ApiKey]:
        rows = self._c.execute(
            f"SELECT {_KEY_COLUMNS} FROM api_keys WHERE account_id = ? AND revoked_at IS NULL"
            " ORDER BY id DESC",
            (account_id,),
        ).fetchall()
        return [_api_key(r) for r in rows]

    async def revoke_api_key(self, *, account_id: str, key_id: int, now: int) -> ApiKey | None:
        r = self._c.execute(
            f"UPDATE api_keys SET revoked_at = ? WHERE id = ? AND account_id = ?"
            f" AND revoked_at IS NULL RETURNING {_KEY_COLUMNS}",
            (now, key_id, account_id),
        ).fetchone()
        return _api_key(r) if r else None

    async def record_api_key_use(self, uses: Sequence[tuple[int, int, str]]) -> None:
        self._c.executemany(
            "UPDATE api_keys SET last_used_at = ?2, last_used_from_addr = ?3"
            " WHERE id = ?1 AND (last_used_at IS NULL OR last_used_at < ?2)",
            uses,
        )

    # -- projects -------------------------------------------------------------------------------

    async def insert_project(self, project: Project) -> None:
        p = project
        self._write(
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
        r = self._c.execute(
            f"SELECT {_PROJECT_COLUMNS} FROM projects p WHERE p.id = ? AND p.account_id = ?{live}",
            (project_id, account_id),
        ).fetchone()
        return _project(r) if r else None

    async def get_project_by_id(self, project_id: str) -> Project | None:
        r = self._c.execute(
            f"SELECT {_PROJECT_COLUMNS} FROM projects p WHERE p.id = ?", (project_id,)
        ).fetchone()
        return _project(r) if r else None

    async def list_projects(
        self, *, account_id: str, after_id: str | None, limit: int
    ) -> list[Project]:
        if after_id is None:
            rows = self._c.execute(
                f"SELECT {_PROJECT_COLUMNS} FROM projects p"
                " WHERE p.account_id = ? AND p.deleted_at IS NULL"
                " ORDER BY p.created_at DESC, p.id DESC LIMIT ?",
                (account_id, limit),
            ).fetchall()
        else:
            rows = self._c.execute(
                f"SELECT {_PROJECT_COLUMNS} FROM projects p, projects c"
                " WHERE c.id = ?1 AND c.account_id = ?2"
                " AND p.account_id = ?2 AND p.deleted_at IS NULL"
                " AND (p.created_at < c.created_at"
                "      OR (p.created_at = c.created_at AND p.id < c.id))"
                " ORDER BY p.created_at DESC, p.id DESC LIMIT ?3",
                (after_id, account_id, limit),
            ).fetchall()
        return [_project(r) for r in rows]

    async def count_projects(self, account_id: str) -> int:
        r = self._c.execute(
            "SELECT count(*) FROM projects WHERE account_id = ? AND deleted_at IS NULL",
            (account_id,),
        ).fetchone()
        return int(r[0])

    async def project_exists(self, *, account_id: str, project_id: str) -> bool:
        r = self._c.execute(
            "SELECT 1 FROM projects WHERE id = ? AND account_id = ?", (project_id, account_id)
        ).fetchone()
        return r is not None

    async def update_project(self, project: Project) -> None:
        p = project
        self._c.execute(
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
        self._c.execute("UPDATE projects SET storage_state = ? WHERE id = ?", (state, project_id))

    async def detach_candidates(self, *, idle_before: int) -> list[str]:
        # Idle: no compute active or changing, no endpoint used since, and no operation but the
        # platform's own checks since (they must not keep a project attached forever).
        rows = self._c.execute(
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
        ).fetchall()
        return [r[0] for r in rows]

    async def last_operation_times(self, action: Action) -> dict[str, int]:
        rows = self._c.execute(
            "SELECT branch_id, MAX(created_at) FROM operations"
            " WHERE action = ? AND branch_id IS NOT NULL GROUP BY branch_id",
            (action.value,),
        ).fetchall()
        return {r[0]: r[1] for r in rows}

    # -- branches, endpoints, roles, databases --------------------------------------------------

    async def insert_branch(self, branch: Branch) -> None:
        b = branch
        self._write(
            f"INSERT INTO branches ({_BRANCH_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
            ),
            _taken("branch", b.name),
        )

    async def get_branch(self, *, project_id: str, branch_id: str) -> Branch | None:
        r = self._c.execute(
            f"SELECT {_BRANCH_COLUMNS} FROM branches"
            " WHERE id = ? AND project_id = ? AND deleted_at IS NULL",
            (branch_id, project_id),
        ).fetchone()
        return _branch(r) if r else None

    async def list_branches(self, project_id: str) -> list[Branch]:
        rows = self._c.execute(
            f"SELECT {_BRANCH_COLUMNS} FROM branches WHERE project_id = ? AND deleted_at IS NULL"
            " ORDER BY created_at DESC, id DESC",
            (project_id,),
        ).fetchall()
        return [_branch(r) for r in rows]

    async def update_branch(self, branch: Branch) -> None:
        b = branch
        self._write(
            "UPDATE branches SET name = ?, protected = ?, is_default = ?, updated_at = ?"
            " WHERE id = ? AND deleted_at IS NULL",
            (b.name, int(b.protected), int(b.default), b.updated_at, b.id),
            _taken("branch", b.name),
        )

    async def delete_branch(self, *, branch_id: str, now: int) -> None:
        self._c.execute(
            "UPDATE branches SET deleted_at = ?, updated_at = ?, is_default = 0"
            " WHERE id = ? AND deleted_at IS NULL",
            (now, now, branch_id),
        )

    async def count_branches(self, project_id: str) -> int:
        r = self._c.execute(
            "SELECT count(*) FROM branches WHERE project_id = ? AND deleted_at IS NULL",
            (project_id,),
        ).fetchone()
        return int(r[0])

    async def has_child_branches(self, branch_id: str) -> bool:
        r = self._c.execute(
            "SELECT 1 FROM branches WHERE parent_id = ? AND deleted_at IS NULL LIMIT 1",
            (branch_id,),
        ).fetchone()
        return r is not None

    async def set_branch_state(
        self, *, branch_id: str, current_state: str, pending_state: str | None, now: int
    ) -> None:
        self._c.execute(
            "UPDATE branches SET current_state = ?, pending_state = ?, state_changed_at = ?,"
            " updated_at = ? WHERE id = ?",
            (current_state, pending_state, now, now, branch_id),
        )

    async def insert_endpoint(self, endpoint: Endpoint) -> None:
        e = endpoint
        try:
            self._c.execute(
                f"INSERT INTO endpoints ({_ENDPOINT_COLUMNS})"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
                ),
            )
        except sqlite3.IntegrityError as exc:
            if not _unique_violation(exc):
                raise
            # Two unique indexes: the branch's one read_write endpoint (the client's conflict)
            # and the port (allocated in this transaction: only another process could race).
            if "endpoints.port" in str(exc):
                raise Conflict(f"compute port {e.port} is already taken; retry") from exc
            raise AlreadyExists(
                "endpoint", "read-write endpoint already exists on this branch"
            ) from exc

    async def get_endpoint(self, *, project_id: str, endpoint_id: str) -> Endpoint | None:
        r = self._c.execute(
            f"SELECT {_ENDPOINT_COLUMNS} FROM endpoints"
            " WHERE id = ? AND project_id = ? AND deleted_at IS NULL",
            (endpoint_id, project_id),
        ).fetchone()
        return _endpoint(r) if r else None

    async def find_endpoint(self, endpoint_id: str) -> Endpoint | None:
        r = self._c.execute(
            f"SELECT {_ENDPOINT_COLUMNS} FROM endpoints WHERE id = ? AND deleted_at IS NULL",
            (endpoint_id,),
        ).fetchone()
        return _endpoint(r) if r else None

    async def list_live_endpoints(self) -> list[Endpoint]:
        rows = self._c.execute(
            f"SELECT {_ENDPOINT_COLUMNS} FROM endpoints e WHERE deleted_at IS NULL"
            " AND EXISTS (SELECT 1 FROM projects p WHERE p.id = e.project_id"
            "             AND p.deleted_at IS NULL)"
            " ORDER BY created_at, id"
        ).fetchall()
        return [_endpoint(r) for r in rows]

    async def record_endpoint_activity(self, activity: Sequence[tuple[str, int]]) -> None:
        self._c.executemany(
            "UPDATE endpoints SET last_active = MAX(COALESCE(last_active, 0), ?) WHERE id = ?",
            [(at, endpoint_id) for endpoint_id, at in activity],
        )

    async def list_endpoints(self, project_id: str) -> list[Endpoint]:
        rows = self._c.execute(
            f"SELECT {_ENDPOINT_COLUMNS} FROM endpoints WHERE project_id = ?"
            " AND deleted_at IS NULL ORDER BY created_at DESC, id DESC",
            (project_id,),
        ).fetchall()
        return [_endpoint(r) for r in rows]

    async def update_endpoint(self, endpoint: Endpoint) -> None:
        e = endpoint
        self._c.execute(
            "UPDATE endpoints SET autoscaling_limit_min_cu = ?, autoscaling_limit_max_cu = ?,"
            " suspend_timeout_seconds = ?, settings = ?, disabled = ?, current_state = ?,"
            " pending_state = ?, updated_at = ? WHERE id = ? AND deleted_at IS NULL",
            (
                e.autoscaling_limit_min_cu,
                e.autoscaling_limit_max_cu,
                e.suspend_timeout_seconds,
                _json_encode(e.settings),
                int(e.disabled),
                e.current_state,
                e.pending_state,
                e.updated_at,
                e.id,
            ),
        )

    async def set_endpoint_port(self, *, endpoint_id: str, port: int, now: int) -> None:
        self._c.execute(
            "UPDATE endpoints SET port = ?, updated_at = ? WHERE id = ? AND deleted_at IS NULL",
            (port, now, endpoint_id),
        )

    async def delete_endpoint(self, *, endpoint_id: str, now: int) -> None:
        self._c.execute(
            "UPDATE endpoints SET deleted_at = ?, updated_at = ?"
            " WHERE id = ? AND deleted_at IS NULL",
            (now, now, endpoint_id),
        )

    async def used_ports(self, *, held_since: int) -> set[int]:
        rows = self._c.execute(
            "SELECT port FROM endpoints WHERE deleted_at IS NULL OR deleted_at > ?", (held_since,)
        ).fetchall()
        return {r[0] for r in rows}

    async def set_endpoint_state(
        self, *, endpoint_id: str, current_state: str, pending_state: str | None, now: int
    ) -> None:
        started = now if current_state == "active" else None
        suspended = now if current_state == "idle" else None
        self._c.execute(
            "UPDATE endpoints SET current_state = ?, pending_state = ?, updated_at = ?,"
            " started_at = COALESCE(?, started_at), suspended_at = COALESCE(?, suspended_at),"
            " last_active = COALESCE(?, last_active) WHERE id = ?",
            (current_state, pending_state, now, started, suspended, started, endpoint_id),
        )

    async def delete_project_endpoints(self, *, project_id: str, now: int) -> None:
        self._c.execute(
            "UPDATE endpoints SET deleted_at = ?, updated_at = ?"
            " WHERE project_id = ? AND deleted_at IS NULL",
            (now, now, project_id),
        )

    async def insert_role(self, role: Role) -> None:
        r = role
        self._write(
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
        r = self._c.execute(
            f"SELECT {_ROLE_COLUMNS} FROM roles"
            " WHERE branch_id = ? AND name = ? AND deleted_at IS NULL",
            (branch_id, name),
        ).fetchone()
        return _role(r) if r else None

    async def list_roles(self, branch_id: str, *, deleted: bool = False) -> list[Role]:
        state = "IS NOT NULL" if deleted else "IS NULL"
        rows = self._c.execute(
            f"SELECT {_ROLE_COLUMNS} FROM roles WHERE branch_id = ? AND deleted_at {state}"
            " ORDER BY id",
            (branch_id,),
        ).fetchall()
        return [_role(r) for r in rows]

    async def update_role(self, role: Role) -> None:
        self._c.execute(
            "UPDATE roles SET password = ?, login = ?, updated_at = ?"
            " WHERE branch_id = ? AND name = ? AND deleted_at IS NULL",
            (role.password, int(role.login), role.updated_at, role.branch_id, role.name),
        )

    async def delete_role(self, *, branch_id: str, name: str, now: int) -> None:
        self._c.execute(
            "UPDATE roles SET deleted_at = ?, updated_at = ?"
            " WHERE branch_id = ? AND name = ? AND deleted_at IS NULL",
            (now, now, branch_id, name),
        )

    async def purge_roles(self, *, branch_id: str, tombstones: Sequence[Role]) -> None:
        self._c.executemany(
            "DELETE FROM roles WHERE branch_id = ? AND name = ? AND deleted_at = ?",
            [(branch_id, r.name, r.deleted_at) for r in tombstones if r.deleted_at is not None],
        )

    async def insert_database(
        self,
        *,
        branch_id: str,
        name: str,
        owner_name: str,
        now: int,
        applied_name: str | None = None,
    ) -> Database:
        cur = self._write(
            "INSERT INTO databases (branch_id, name, owner_name, applied_name, created_at,"
            " updated_at) VALUES (?, ?, ?, ?, ?, ?)",
            (branch_id, name, owner_name, applied_name, now, now),
            _taken("database", name),
        )
        assert cur.lastrowid is not None  # noqa: S101 - sqlite always sets it after an INSERT
        return Database(
            id=cur.lastrowid,
            branch_id=branch_id,
            name=name,
            owner_name=owner_name,
            created_at=now,
            updated_at=now,
            applied_name=applied_name,
        )

    async def get_database(self, *, branch_id: str, name: str) -> Database | None:
        r = self._c.execute(
            f"SELECT {_DATABASE_COLUMNS} FROM databases"
            " WHERE branch_id = ? AND name = ? AND deleted_at IS NULL",
            (branch_id, name),
        ).fetchone()
        return _database(r) if r else None

    async def list_databases(self, branch_id: str, *, deleted: bool = False) -> list[Database]:
        state = "IS NOT NULL" if deleted else "IS NULL"
        rows = self._c.execute(
            f"SELECT {_DATABASE_COLUMNS} FROM databases WHERE branch_id = ?"
            f" AND deleted_at {state} ORDER BY id",
            (branch_id,),
        ).fetchall()
        return [_database(r) for r in rows]

    async def update_database(self, database: Database) -> None:
        d = database
        self._write(
            "UPDATE databases SET name = ?, owner_name = ?, updated_at = ?"
            " WHERE id = ? AND deleted_at IS NULL",
            (d.name, d.owner_name, d.updated_at, d.id),
            _taken("database", d.name),
        )

    async def delete_database(self, *, database_id: int, now: int) -> None:
        self._c.execute(
            "UPDATE databases SET deleted_at = ?, updated_at = ?"
            " WHERE id = ? AND deleted_at IS NULL",
            (now, now, database_id),
        )

    async def mark_databases_applied(self, applied: Sequence[tuple[int, str]]) -> None:
        self._c.executemany("UPDATE databases SET applied_name = ?2 WHERE id = ?1", list(applied))

    async def purge_databases(self, database_ids: Sequence[int]) -> None:
        self._c.executemany(
            "DELETE FROM databases WHERE id = ? AND deleted_at IS NOT NULL",
            [(i,) for i in database_ids],
        )

    # -- operations -----------------------------------------------------------------------------

    async def insert_operations(self, operations: Sequence[Operation]) -> list[Operation]:
        latest: dict[str, int] = {}
        stored = []
        for given in operations:
            if given.project_id not in latest:
                r = self._c.execute(
                    "SELECT MAX(created_at) FROM operations WHERE project_id = ?",
                    (given.project_id,),
                ).fetchone()
                latest[given.project_id] = r[0] if r and r[0] is not None else 0
            created = max(given.created_at, latest[given.project_id] + 1)
            latest[given.project_id] = created
            op = given
            if created != given.created_at:
                op = msgspec.structs.replace(given, created_at=created, updated_at=created)
            self._c.execute(
                f"INSERT INTO operations ({_OP_COLUMNS})"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
                ),
            )
            stored.append(op)
        return stored

    async def get_operation(self, *, project_id: str, operation_id: str) -> Operation | None:
        r = self._c.execute(
            f"SELECT {_OP_COLUMNS} FROM operations WHERE id = ? AND project_id = ?",
            (operation_id, project_id),
        ).fetchone()
        return _operation(r) if r else None

    async def list_operations(
        self, *, project_id: str, before: int | None, limit: int, account_id: str | None = None
    ) -> list[Operation]:
        cursor = _NEVER if before is None else before
        if account_id is None:
            rows = self._c.execute(_LIST_OPS, (project_id, cursor, limit)).fetchall()
        else:
            rows = self._c.execute(
                _LIST_ACCOUNT_OPS, (project_id, cursor, limit, account_id)
            ).fetchall()
        return [_operation(r) for r in rows]

    async def list_unsettled_operations(self, project_id: str | None = None) -> list[Operation]:
        unsettled = "status IN ('scheduling', 'running')"
        if project_id is None:
            rows = self._c.execute(
                f"SELECT {_OP_COLUMNS} FROM operations WHERE {unsettled}"
                " ORDER BY project_id, created_at"
            ).fetchall()
        else:
            rows = self._c.execute(
                f"SELECT {_OP_COLUMNS} FROM operations WHERE project_id = ? AND {unsettled}"
                " ORDER BY created_at",
                (project_id,),
            ).fetchall()
        return [_operation(r) for r in rows]

    async def claim_operation(
        self, *, seen: Operation, owner: str, now: int, lease_until: int, failed_attempt: bool
    ) -> Operation | None:
        r = self._c.execute(
            f"UPDATE operations SET status = 'running', lease_owner = ?, lease_expires_at = ?,"
            f" attempt_started_at = ?, updated_at = ?, failures_count = failures_count + ?"
            f" WHERE id = ? AND status = ? AND updated_at = ? AND lease_owner IS ?"
            f" RETURNING {_OP_COLUMNS}",
            (
                owner,
                lease_until,
                now,
                now,
                int(failed_attempt),
                seen.id,
                seen.status.value,
                seen.updated_at,
                seen.lease_owner,
            ),
        ).fetchone()
        return _operation(r) if r else None

    async def expire_leases(self, *, owners: Sequence[str], now: int) -> int:
        marks = ", ".join("?" * len(owners))
        cur = self._c.execute(
            f"UPDATE operations SET lease_expires_at = ? WHERE status = 'running'"
            f" AND lease_owner IN ({marks})",
            (now, *owners),
        )
        return cur.rowcount

    async def update_owned_operation(self, operation: Operation, *, owner: str) -> bool:
        op = operation
        cur = self._c.execute(
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

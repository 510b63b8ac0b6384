"""Neon's snapshot API: ``POST …/branches/{branch_id}/snapshot`` (query parameters, no body),
``GET /projects/{project_id}/snapshots``, ``PATCH``/``DELETE …/snapshots/{snapshot_id}``,
``POST …/snapshots/{snapshot_id}/restore``, and ``GET``/``PUT …/branches/{branch_id}/
backup_schedule``. services/snapshots.py and services/backups.py say what each does."""

from __future__ import annotations

import msgspec
from litestar import Controller, delete, get, patch, post, put
from litestar.params import FromPath, JSONBody, Parameter

from pgplane.api import presenters
from pgplane.api.auth import AnyRequest, authorized
from pgplane.api.responses import OptionalBody, error_responses
from pgplane.api.schemas.snapshots import (
    BackupSchedule,
    DailyBackup,
    Empty,
    FinalizeRestoreRequest,
    MonthlyBackup,
    OperationsOnly,
    SnapshotCreated,
    SnapshotOut,
    SnapshotResponse,
    SnapshotRestored,
    SnapshotRestoreRequest,
    SnapshotsResponse,
    SnapshotUpdateRequest,
    WeeklyBackup,
)
from pgplane.core import clock
from pgplane.core.models import Snapshot
from pgplane.services import access, backups, finalize, history, snapshots

_FREQUENCY: dict[type, str] = {
    DailyBackup: "daily",
    WeeklyBackup: "weekly",
    MonthlyBackup: "monthly",
}
_TEXT = Parameter(default=None, max_length=256)
# A point of the branch's history: services/history.py checks it with messages that name the
# parameter; the patterns only document the same.
_LSN = Parameter(default=None, max_length=64, schema_extra={"pattern": history.LSN_PATTERN})
_TIME = Parameter(
    default=None,
    max_length=64,
    schema_extra={"format": "date-time", "pattern": history.TIME_PATTERN},
)


# Checked in the service (a 400 naming it); the pattern is Neon's, for clients that read it.
_SLUG = Parameter(
    default=None,
    max_length=63,
    description="Unique among the project's snapshots; the snapshot's id when omitted.",
    schema_extra={"pattern": "^[a-z]([a-z0-9-]{0,61}[a-z0-9])?$"},
)


def snapshot_out(s: Snapshot) -> SnapshotOut:
    return SnapshotOut(
        id=s.id,
        name=s.name,
        created_at=clock.format_s(s.created_at),
        manual=s.manual,
        source_branch_id=s.source_branch_id,
        lsn=s.lsn,
        timestamp=clock.format_s(s.point_time) if s.point_time is not None else None,
        expires_at=clock.format_s(s.expires_at) if s.expires_at is not None else None,
        full_size=s.full_size,
        slug=s.slug,
    )


class Snapshots(Controller):
    path = "/projects/{project_id:str}"
    tags = ["Snapshot"]  # noqa: RUF012 - Litestar reads it as an instance attribute

    @post(
        "/branches/{branch_id:str}/snapshot",
        status_code=200,
        operation_id="createSnapshot",
        responses=error_responses(409),
        operation_class=OptionalBody,
    )
    async def create(
        self,
        request: AnyRequest,
        project_id: FromPath[str],
        branch_id: FromPath[str],
        lsn: str | None = _LSN,
        timestamp: str | None = _TIME,
        name: str | None = _TEXT,
        expires_at: str | None = _TIME,
        slug: str | None = _SLUG,
    ) -> SnapshotCreated:
        """Keep the branch's data at its head, or at ``lsn`` or ``timestamp`` of its history."""
        ctx = authorized(request)
        point = history.parse_point(
            lsn=lsn, timestamp=timestamp, lsn_field="lsn", time_field="timestamp"
        )
        spec = snapshots.NewSnapshot(
            point=point,
            name=name,
            expires_at=snapshots.parse_expiry(expires_at) if expires_at is not None else None,
            slug=slug,
        )
        bounds = None
        if point is not None:
            async with ctx.store.read() as tx:
                project = await access.live_project(
                    tx, account_id=ctx.account_id, project_id=project_id
                )
                branch = await access.branch(tx, project_id=project.id, branch_id=branch_id)
            bounds = await ctx.history(
                project_id=project.id, branch_id=branch.id, pg_version=project.pg_version
            )
        async with ctx.store.write() as tx:
            made, ops = await snapshots.create(
                tx,
                account_id=ctx.account_id,
                project_id=project_id,
                branch_id=branch_id,
                spec=spec,
                bounds=bounds,
            )
        ctx.notify()
        return SnapshotCreated(snapshot=snapshot_out(made), operations=presenters.operations(ops))

    @get("/snapshots", operation_id="listSnapshots", responses=error_responses())
    async def list_(self, request: AnyRequest, project_id: FromPath[str]) -> SnapshotsResponse:
        ctx = authorized(request)
        async with ctx.store.read() as tx:
            found = await snapshots.list_(tx, account_id=ctx.account_id, project_id=project_id)
        return SnapshotsResponse(snapshots=[snapshot_out(s) for s in found])

    @patch(
        "/snapshots/{snapshot_id:str}", operation_id="updateSnapshot", responses=error_responses()
    )
    async def update(
        self,
        request: AnyRequest,
        project_id: FromPath[str],
        snapshot_id: FromPath[str],
        data: JSONBody[SnapshotUpdateRequest],
    ) -> SnapshotResponse:
        """Rename it, or set or clear (null) when it expires."""
        ctx = authorized(request)
        given = data.snapshot.expires_at
        changes = snapshots.SnapshotChanges(
            name=data.snapshot.name,
            expires_at=snapshots.parse_expiry(given, "snapshot.expires_at")
            if isinstance(given, str)
            else given,
        )
        async with ctx.store.write() as tx:
            updated = await snapshots.update(
                tx,
                account_id=ctx.account_id,
                project_id=project_id,
                snapshot_id=snapshot_id,
                changes=changes,
            )
        return SnapshotResponse(snapshot=snapshot_out(updated))

    @delete(
        "/snapshots/{snapshot_id:str}",
        status_code=202,
        operation_id="deleteSnapshot",
        responses=error_responses(),
    )
    async def delete_(
        self, request: AnyRequest, project_id: FromPath[str], snapshot_id: FromPath[str]
    ) -> OperationsOnly:
        """Delete it; ``delete_snapshot`` frees its copy."""
        ctx = authorized(request)
        async with ctx.store.write() as tx:
            ops = await snapshots.delete(
                tx, account_id=ctx.account_id, project_id=project_id, snapshot_id=snapshot_id
            )
        ctx.notify()
        return OperationsOnly(operations=presenters.operations(ops))

    @post(
        "/snapshots/{snapshot_id:str}/restore",
        status_code=200,
        operation_id="restoreSnapshot",
        responses=error_responses(409, 422, body=True),  # 422: the branch quota
        operation_class=OptionalBody,
    )
    async def restore(
        self,
        request: AnyRequest,
        project_id: FromPath[str],
        snapshot_id: FromPath[str],
        data: JSONBody[SnapshotRestoreRequest | None] = None,
        name: str | None = Parameter(default=None, max_length=256, include_in_schema=False),
    ) -> SnapshotRestored:
        """Into a new branch; in ``target_branch_id``'s place at once with ``finalize_restore``."""
        ctx = authorized(request)
        body = data or SnapshotRestoreRequest()
        spec = snapshots.RestoreSpec(
            name=body.name if body.name is not None else name,  # the query's: deprecated
            target_branch_id=body.target_branch_id,
            finalize_restore=body.finalize_restore,
        )
        async with ctx.store.write() as tx:
            branch, ops = await snapshots.restore(
                tx,
                account_id=ctx.account_id,
                project_id=project_id,
                snapshot_id=snapshot_id,
                spec=spec,
                settings=ctx.settings,
            )
        ctx.notify()
        return SnapshotRestored(
            branch=presenters.branch(branch), operations=presenters.operations(ops)
        )

    @post(
        "/branches/{branch_id:str}/finalize_restore",
        status_code=200,
        operation_id="finalizeRestoreBranch",
        tags=["Branch"],
        responses=error_responses(409, 423, body=True),  # 423: still being restored
        operation_class=OptionalBody,
    )
    async def finalize_restore(
        self,
        request: AnyRequest,
        project_id: FromPath[str],
        branch_id: FromPath[str],
        data: JSONBody[FinalizeRestoreRequest | None] = None,
    ) -> OperationsOnly:
        """The branch a snapshot was restored into takes the place of the branch it replaces:
        that branch's computes move to it, and it takes its name (the old one: ``name``)."""
        ctx = authorized(request)
        body = data or FinalizeRestoreRequest()
        async with ctx.store.write() as tx:
            ops = await finalize.finalize(
                tx,
                account_id=ctx.account_id,
                project_id=project_id,
                branch_id=branch_id,
                name=body.name,
            )
        ctx.notify()
        return OperationsOnly(operations=presenters.operations(ops))

    @get(
        "/branches/{branch_id:str}/backup_schedule",
        operation_id="getSnapshotSchedule",
        responses=error_responses(),
    )
    async def schedule(
        self, request: AnyRequest, project_id: FromPath[str], branch_id: FromPath[str]
    ) -> BackupSchedule:
        ctx = authorized(request)
        async with ctx.store.read() as tx:
            entries = await backups.get(
                tx, account_id=ctx.account_id, project_id=project_id, branch_id=branch_id
            )
        return msgspec.convert({"schedule": entries}, BackupSchedule)

    @put(
        "/branches/{branch_id:str}/backup_schedule",
        operation_id="setSnapshotSchedule",
        responses=error_responses(body=True),
    )
    async def set_schedule(
        self,
        request: AnyRequest,
        project_id: FromPath[str],
        branch_id: FromPath[str],
        data: JSONBody[BackupSchedule],
    ) -> Empty:
        """Replace the branch's schedule (an empty one stops it)."""
        ctx = authorized(request)
        entries = [
            backups.entry(
                _FREQUENCY[type(e)],
                e.hour,
                None if isinstance(e, DailyBackup) else e.day,
                e.retention_seconds,
            )
            for e in data.schedule
        ]
        async with ctx.store.write() as tx:
            await backups.set_(
                tx,
                account_id=ctx.account_id,
                project_id=project_id,
                branch_id=branch_id,
                entries=entries,
            )
        return Empty()

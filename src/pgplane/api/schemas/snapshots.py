"""Snapshots and backup schedules, in Neon's shapes (``Snapshot``, ``BackupSchedule``)."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import UNSET, Meta, Struct, UnsetType

from pgplane.api.schemas.common import Name256
from pgplane.api.schemas.objects import BranchOut
from pgplane.api.schemas.operations import OperationOut

# Neon's: a scheduled snapshot is kept at most 35 days (the default); at least an hour.
MAX_RETENTION_SECONDS = 3_024_000
MIN_RETENTION_SECONDS = 3_600


SnapshotExpiry = Annotated[
    str,
    Meta(
        max_length=40,
        description="an RFC 3339 time in the future, when the platform deletes the snapshot",
    ),
]


class SnapshotOut(Struct, kw_only=True, omit_defaults=True):
    id: str
    name: str
    created_at: str
    manual: bool
    source_branch_id: str | None = None
    lsn: str | None = None
    timestamp: str | None = None
    expires_at: str | None = None
    full_size: int | None = None


class SnapshotCreated(Struct, kw_only=True):
    snapshot: SnapshotOut
    operations: list[OperationOut]


class SnapshotsResponse(Struct, kw_only=True):
    snapshots: list[SnapshotOut]


class SnapshotResponse(Struct, kw_only=True):
    snapshot: SnapshotOut


class SnapshotUpdateSpec(Struct, kw_only=True, forbid_unknown_fields=True):
    name: Name256 | None = None
    # Absent keeps it; null clears it (the snapshot is kept until deleted).
    expires_at: SnapshotExpiry | UnsetType | None = UNSET


class SnapshotUpdateRequest(Struct, kw_only=True, forbid_unknown_fields=True):
    snapshot: SnapshotUpdateSpec


class SnapshotRestoreRequest(Struct, kw_only=True, forbid_unknown_fields=True):
    name: Name256 | None = None
    target_branch_id: Annotated[str, Meta(min_length=1, max_length=60)] | None = None
    finalize_restore: bool = False


class SnapshotRestored(Struct, kw_only=True):
    branch: BranchOut
    operations: list[OperationOut]


class OperationsOnly(Struct, kw_only=True):
    operations: list[OperationOut]


class BackupScheduleItem(Struct, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    frequency: Literal["daily", "weekly", "monthly"]
    hour: Annotated[int, Meta(ge=0, le=23)] | None = None
    day: Annotated[int, Meta(ge=1, le=31)] | None = None
    month: Annotated[int, Meta(ge=1, le=12)] | None = None
    retention_seconds: (
        Annotated[int, Meta(ge=MIN_RETENTION_SECONDS, le=MAX_RETENTION_SECONDS)] | None
    ) = None


class BackupSchedule(Struct, kw_only=True, forbid_unknown_fields=True):
    schedule: Annotated[list[BackupScheduleItem], Meta(max_length=16)]


class Empty(Struct, kw_only=True):
    pass

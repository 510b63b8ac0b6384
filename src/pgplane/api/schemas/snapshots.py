"""Snapshots and backup schedules, in Neon's shapes (``Snapshot``, ``BackupSchedule``)."""

from __future__ import annotations

from typing import Annotated

from msgspec import UNSET, Meta, Struct, UnsetType

from pgplane.api.schemas.common import Name256, documented
from pgplane.api.schemas.objects import BranchOut
from pgplane.api.schemas.operations import OperationOut
from pgplane.services import history

# Neon's: a scheduled snapshot is kept at most 35 days (the default); at least an hour.
MAX_RETENTION_SECONDS = 3_024_000
MIN_RETENTION_SECONDS = 3_600


SnapshotExpiry = Annotated[
    str,
    Meta(
        max_length=40,
        description="an RFC 3339 time in the future, when the platform deletes the snapshot",
        extra_json_schema=documented(format="date-time", pattern=history.TIME_PATTERN),
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
    slug: str | None = None  # absent for a snapshot taken before slugs existed


class SnapshotCreated(Struct, kw_only=True):
    snapshot: SnapshotOut
    operations: list[OperationOut]


class SnapshotsResponse(Struct, kw_only=True):
    snapshots: list[SnapshotOut]


class SnapshotResponse(Struct, kw_only=True):
    snapshot: SnapshotOut


class SnapshotUpdateSpec(Struct, kw_only=True):
    name: Name256 | None = None
    # Absent keeps it; null clears it (the snapshot is kept until deleted).
    expires_at: SnapshotExpiry | UnsetType | None = UNSET


class SnapshotUpdateRequest(Struct, kw_only=True):
    snapshot: SnapshotUpdateSpec


class SnapshotRestoreRequest(Struct, kw_only=True):
    """Always into a new branch, to replace ``target_branch_id`` (the snapshot's source branch
    unless named). ``name`` names it; with ``finalize_restore`` it takes the target's place and
    name at once, and ``name`` is the name the replaced branch takes (absent: ``<name> (old)``),
    as ``finalize_restore``'s own body says."""

    name: Name256 | None = None
    target_branch_id: Annotated[str, Meta(min_length=1, max_length=60)] | None = None
    finalize_restore: bool = False


class FinalizeRestoreRequest(Struct, kw_only=True):
    """Neon's: the name the replaced branch takes (absent: ``<its name> (old)``)."""

    name: Name256 | None = None


class SnapshotRestored(Struct, kw_only=True):
    branch: BranchOut
    operations: list[OperationOut]


class OperationsOnly(Struct, kw_only=True):
    operations: list[OperationOut]


# minimum 0 stated for the document too: Litestar leaves out a minimum of 0.
Hour = Annotated[
    int,
    Meta(
        ge=0,
        le=23,
        description="the hour of the day (UTC); 0 when absent",
        extra_json_schema=documented(minimum=0),
    ),
]
Retention = Annotated[
    int,
    Meta(
        ge=MIN_RETENTION_SECONDS,
        le=MAX_RETENTION_SECONDS,
        description="how long each snapshot is kept; 35 days (the maximum) when absent",
    ),
]
# No frequency served here takes a month: only null is accepted, so a month is refused (400).
NoMonth = Annotated[None, Meta(description="not used by any frequency served here")]
NoDay = Annotated[None, Meta(description="a daily snapshot takes no day")]


class DailyBackup(Struct, kw_only=True, omit_defaults=True, tag_field="frequency", tag="daily"):
    day: NoDay = None
    hour: Hour | None = None
    retention_seconds: Retention | None = None
    month: NoMonth = None


class WeeklyBackup(Struct, kw_only=True, omit_defaults=True, tag_field="frequency", tag="weekly"):
    day: Annotated[int, Meta(ge=1, le=7, description="1 (Monday) to 7; 1 when absent")] | None = (
        None
    )
    hour: Hour | None = None
    retention_seconds: Retention | None = None
    month: NoMonth = None


class MonthlyBackup(Struct, kw_only=True, omit_defaults=True, tag_field="frequency", tag="monthly"):
    day: (
        Annotated[int, Meta(ge=1, le=31, description="1 to 31 (a shorter month's last day)")] | None
    ) = None
    hour: Hour | None = None
    retention_seconds: Retention | None = None
    month: NoMonth = None


BackupScheduleItem = DailyBackup | WeeklyBackup | MonthlyBackup


class BackupSchedule(Struct, kw_only=True):
    schedule: Annotated[list[BackupScheduleItem], Meta(max_length=16)]


class Empty(Struct, kw_only=True):
    pass

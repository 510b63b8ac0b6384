"""Backup schedules: a branch's snapshots taken by the platform, on time, and kept a while.

A schedule (Neon's ``BackupSchedule``) is a list of entries: ``daily`` at ``hour`` (UTC, 0 when
absent), ``weekly`` on ``day`` (1 Monday .. 7 Sunday, 1 when absent) at ``hour``, ``monthly`` on
``day`` (1..31, the month's last day when it is shorter; 1 when absent) at ``hour``; each
snapshot it takes is kept ``retention_seconds`` (Neon's default and maximum: 35 days). A
``month`` is refused (the API's types take only null): no frequency here uses one, and a field
the platform accepts must do what it says.

Each entry's slots are moments; the scheduler takes the latest slot that is due and came after
the schedule was set (so setting one never takes a snapshot for a slot already past). A slot is
named (``daily:2026-11-25T03:00:00Z``) and stored with the snapshot it took, unique per branch:
it is taken once, never twice, however many ticks, processes or restarts race; a ``serve`` that was
down at that moment takes it at its first tick after (only the latest: a week away takes one
snapshot, not seven).
"""

from __future__ import annotations

import calendar
import datetime
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pgplane.core import clock
from pgplane.core.models import Operation
from pgplane.errors import BadRequest
from pgplane.services import access, anonymized, snapshots
from pgplane.store import Tx

FREQUENCIES = ("daily", "weekly", "monthly")
DEFAULT_RETENTION_SECONDS = 3_024_000  # 35 days, Neon's default and maximum
_US = 1_000_000


@dataclass(frozen=True, slots=True)
class Entry:
    frequency: str
    hour: int = 0
    day: int | None = None
    retention_seconds: int = DEFAULT_RETENTION_SECONDS

    def stored(self) -> dict[str, Any]:
        out: dict[str, Any] = {"frequency": self.frequency, "hour": self.hour}
        if self.day is not None:
            out["day"] = self.day
        out["retention_seconds"] = self.retention_seconds
        return out


def entry(
    frequency: str, hour: int | None, day: int | None, retention_seconds: int | None
) -> Entry:
    """One entry, its defaults filled in (the API's types have checked each field's range)."""
    if frequency not in FREQUENCIES:
        raise BadRequest(f"schedule.frequency must be one of {', '.join(FREQUENCIES)}")
    if frequency == "daily" and day is not None:
        raise BadRequest("schedule.day: a daily snapshot takes no day")
    return Entry(
        frequency=frequency,
        hour=hour or 0,
        day=(day or 1) if frequency != "daily" else None,
        retention_seconds=retention_seconds or DEFAULT_RETENTION_SECONDS,
    )


def _entry(stored: dict[str, Any]) -> Entry:
    return Entry(
        frequency=str(stored["frequency"]),
        hour=int(stored.get("hour", 0)),
        day=stored.get("day"),
        retention_seconds=int(stored.get("retention_seconds", DEFAULT_RETENTION_SECONDS)),
    )


async def get(tx: Tx, *, account_id: str, project_id: str, branch_id: str) -> list[dict[str, Any]]:
    project = await access.live_project(tx, account_id=account_id, project_id=project_id)
    branch = await access.branch(tx, project_id=project.id, branch_id=branch_id)
    found = await tx.get_backup_schedule(branch.id)
    return found[0] if found else []


async def set_(
    tx: Tx, *, account_id: str, project_id: str, branch_id: str, entries: Sequence[Entry]
) -> None:
    project = await access.live_project(tx, account_id=account_id, project_id=project_id)
    branch = await access.branch(tx, project_id=project.id, branch_id=branch_id)
    await tx.set_backup_schedule(
        project_id=project.id,
        branch_id=branch.id,
        schedule=[e.stored() for e in entries],
        now=clock.now_us(),
    )


def latest_slot(e: Entry, now: int) -> tuple[str, int]:
    """The entry's latest slot at or before ``now``: its name and its moment (us)."""
    t = datetime.datetime.fromtimestamp(now // _US, tz=datetime.UTC)
    at = t.replace(hour=e.hour, minute=0, second=0, microsecond=0)
    if e.frequency == "daily":
        if at > t:
            at -= datetime.timedelta(days=1)
        return _named(e, at)
    if e.frequency == "weekly":
        at -= datetime.timedelta(days=(at.isoweekday() - (e.day or 1)) % 7)
        if at > t:
            at -= datetime.timedelta(days=7)
        return _named(e, at)
    at = _monthly(t.year, t.month, e.day or 1, e.hour)
    if at > t:
        year, month = (t.year, t.month - 1) if t.month > 1 else (t.year - 1, 12)
        at = _monthly(year, month, e.day or 1, e.hour)
    return _named(e, at)


def _named(e: Entry, at: datetime.datetime) -> tuple[str, int]:
    us = _us(at)
    return f"{e.frequency}:{clock.format_s(us)}", us


def _monthly(year: int, month: int, day: int, hour: int) -> datetime.datetime:
    last = calendar.monthrange(year, month)[1]
    return datetime.datetime(year, month, min(day, last), hour, tzinfo=datetime.UTC)


def _us(t: datetime.datetime) -> int:
    return int(t.timestamp()) * _US


async def take_due(tx: Tx, *, project_id: str, branch_id: str, now: int) -> list[Operation]:
    """The snapshots the branch's schedule has due now (re-read in the caller's transaction)."""
    found = await tx.get_backup_schedule(branch_id)
    project = await tx.get_project_by_id(project_id)
    branch = await tx.get_branch(project_id=project_id, branch_id=branch_id)
    if found is None or project is None or project.deleted_at is not None or branch is None:
        return []
    if branch.anonymized and not anonymized.served(await tx.get_masking(branch.id)):
        return []  # its data is its parent's until masked: its slots are taken once it is
    stored, set_at = found
    started: list[Operation] = []
    for e in (_entry(s) for s in stored):
        slot, at = latest_slot(e, now)
        if at < set_at or await tx.snapshot_slot_taken(branch_id=branch.id, slot=slot):
            continue
        # The slot is unique in the store too: a race this check missed ends the transaction
        # with a Conflict, and nothing is taken twice.
        _, ops = await snapshots.take(
            tx,
            project=project,
            branch=branch,
            point=None,
            name=f"{branch.name} {e.frequency} {clock.format_s(at)}",
            expires_at=now // _US * _US + e.retention_seconds * _US,
            manual=False,
            slot=slot,
            now=now,
        )
        started += ops
    return started


async def due_slots(tx: Tx, *, now: int) -> list[tuple[str, str]]:
    """(project, branch) whose schedule has a slot due that no snapshot was taken for."""
    due = []
    for project_id, branch_id, stored, set_at in await tx.list_backup_schedules():
        for e in (_entry(s) for s in stored):
            slot, at = latest_slot(e, now)
            if at >= set_at and not await tx.snapshot_slot_taken(branch_id=branch_id, slot=slot):
                due.append((project_id, branch_id))
                break
    return due

"""The project page's usage: what its computes used and what its branches take, as read from
the same records the API shows (core/usage.py), in units people read."""

from __future__ import annotations

from dataclasses import dataclass

from pgplane.console.pages import when
from pgplane.core import clock
from pgplane.core.models import Branch
from pgplane.core.usage import BranchSizes, StorageTotals, Totals
from pgplane.store import Tx

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")
# WAL waiting this long for the object store is said on the project's page (shipping runs
# every second: a minute is an outage, not a round).
_WAITING_TOLD_US = 60 * 1_000_000
UNKNOWN = "not known yet"


def size(value: int | None) -> str:
    if value is None:
        return UNKNOWN
    amount, unit = float(value), 0
    while amount >= 1024 and unit < len(_UNITS) - 1:
        amount, unit = amount / 1024, unit + 1
    return f"{amount:.0f} {_UNITS[unit]}" if unit == 0 else f"{amount:.1f} {_UNITS[unit]}"


def duration(seconds: int) -> str:
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes:02d} min"
    return f"{minutes} min {secs:02d} s" if minutes else f"{secs} s"


@dataclass(frozen=True, slots=True)
class UsageRow:
    name: str
    active: str
    compute: str
    cpu: str
    logical: str
    on_disk: str
    history: str
    written: str


def _row(name: str, used: Totals, stored: StorageTotals | BranchSizes | None) -> UsageRow:
    return UsageRow(
        name=name,
        active=duration(used.active_time_seconds),
        compute=f"{used.compute_us_hours:.2f} CU-h",
        cpu=duration(used.cpu_used_sec),
        logical=size(None if stored is None else stored.logical),
        on_disk=size(None if stored is None else stored.data),
        history=size(None if stored is None else stored.history),
        written=size(None if stored is None else stored.written),
    )


async def usage_view(tx: Tx, project_id: str, branches: list[Branch]) -> dict[str, object]:
    """``usage_total`` (the project, its deleted computes' use included) and ``usage_rows``
    (each branch), for project.html."""
    used = await tx.branch_usage(project_id)
    sizes = await tx.list_branch_sizes(project_id)
    total = (await tx.project_usage([project_id])).get(project_id, Totals())
    stored = (await tx.project_storage([project_id])).get(project_id)
    return {
        "usage_total": _row("Project", total, stored),
        "usage_rows": [
            _row(b.name, used.get(b.id, Totals()), sizes.get(b.id))
            for b in sorted(branches, key=lambda b: b.created_at)
        ],
    }


@dataclass(frozen=True, slots=True)
class BackupRow:
    name: str
    archived: str  # when its newest WAL in the object store was written
    stored: str  # what its history's objects take there
    checked: str  # when it was last proven to restore, or why it did not


@dataclass(frozen=True, slots=True)
class Backups:
    rows: list[BackupRow]
    # Said when WAL has waited for the object store past a minute: how much, since when, and
    # how full the project's disk share is (where it waits; writes stop when it is full).
    waiting: str | None


async def backups_view(
    tx: Tx, project_id: str, branches: list[Branch], *, share_bytes: int
) -> Backups:
    """Each branch's archive in the object store, for project_backups.html."""
    sizes = await tx.list_branch_sizes(project_id)
    rows = await _backup_rows(tx, project_id, branches, sizes)
    live = {b.id for b in branches}
    kept = [s for s in sizes.values() if s.branch_id in live]
    waiting = sum(s.unarchived or 0 for s in kept)
    since = min((s.unarchived_since for s in kept if s.unarchived_since), default=None)
    if not waiting or since is None or clock.now_us() - since < _WAITING_TOLD_US:
        return Backups(rows, None)
    said = (
        f"The object store has not taken this project's WAL since {when(since)}:"
        f" {size(waiting)} waits on its disk"
    )
    if share_bytes:
        used = sum((s.data or 0) + (s.history or 0) for s in kept)
        said += f" share ({used * 100 // share_bytes}% of {size(share_bytes)} used)"
    said += (
        ". Shipping resumes by itself when the store answers; if the share fills first,"
        " writes stop."
    )
    return Backups(rows, said)


async def _backup_rows(
    tx: Tx, project_id: str, branches: list[Branch], sizes: dict[str, BranchSizes]
) -> list[BackupRow]:
    checks = {c.branch_id: c for c in await tx.backup_checks(project_id)}
    rows = []
    for b in sorted(branches, key=lambda b: b.created_at):
        kept, check = sizes.get(b.id), checks.get(b.id)
        at = None if kept is None else kept.archived_at
        if check is None:
            checked = "not yet"
        elif check.error:
            checked = f"{when(check.checked_at)}: did not restore ({check.error[:200]})"
        else:
            checked = f"{when(check.checked_at)}: restored to {when(check.restorable_to)}"
        rows.append(
            BackupRow(
                name=b.name,
                archived=UNKNOWN if at is None else when(at),
                stored=size(None if kept is None else kept.archived),
                checked=checked,
            )
        )
    return rows

"""The project page's usage: what its computes used and what its branches take, as read from
the same records the API shows (core/usage.py), in units people read."""

from __future__ import annotations

from dataclasses import dataclass

from pgplane.core.models import Branch
from pgplane.core.usage import BranchSizes, StorageTotals, Totals
from pgplane.store import Tx

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")
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

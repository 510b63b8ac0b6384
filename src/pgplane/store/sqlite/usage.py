"""Compute usage: per endpoint (its runs' totals), summed per branch and project, and per hour."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from pgplane.core.usage import BranchSizes, EndpointUsage, HourUsage, StorageTotals, Totals
from pgplane.store.sqlite.common import Statements

_HOUR_COLUMNS = (
    "project_id, branch_id, hour, cpu_us, active_us, cu_us, logical_byte_s, data_byte_s,"
    " history_byte_s, archived_byte_s, written_bytes"
)
_ADDED = (
    "cpu_us",
    "active_us",
    "cu_us",
    "logical_byte_s",
    "data_byte_s",
    "history_byte_s",
    "archived_byte_s",
    "written_bytes",
)
_SIZES = (
    "project_id, branch_id, logical_bytes, data_bytes, history_bytes, sampled_us, wal_lsn,"
    " written_bytes, archived_at, archived_bytes, unarchived_bytes, unarchived_since"
)
_COLUMNS = (
    "endpoint_id, project_id, branch_id, run, run_started_us, run_cpu_us, run_seen_us,"
    " cpu_us, active_us, cu_us"
)


def _replace_all(columns: str, key: str) -> str:
    """An upsert's SET writing every column but the key: what INSERT OR REPLACE did, in the SQL
    both backends accept."""
    names = [c.strip() for c in columns.split(",") if c.strip() != key]
    return ", ".join(f"{c} = excluded.{c}" for c in names)


_REPLACE_USAGE = _replace_all(_COLUMNS, "endpoint_id")
_REPLACE_SIZES = _replace_all(_SIZES, "branch_id")


class UsageMixin(Statements):
    """:class:`pgplane.store.usage.UsageTx` (both backends)."""

    async def get_endpoint_usage(self, endpoint_id: str) -> EndpointUsage | None:
        r = await self._c.one(
            f"SELECT {_COLUMNS} FROM endpoint_usage WHERE endpoint_id = ?", (endpoint_id,)
        )
        return EndpointUsage(*r) if r else None

    async def list_endpoint_usage(self, project_id: str) -> dict[str, EndpointUsage]:
        rows = await self._c.all(
            f"SELECT {_COLUMNS} FROM endpoint_usage WHERE project_id = ?", (project_id,)
        )
        return {r[0]: EndpointUsage(*r) for r in rows}

    async def put_endpoint_usage(self, usage: EndpointUsage, hours: Sequence[HourUsage]) -> None:
        u = usage
        await self._c.execute(
            f"INSERT INTO endpoint_usage ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?)"
            f" ON CONFLICT (endpoint_id) DO UPDATE SET {_REPLACE_USAGE}",
            (
                u.endpoint_id,
                u.project_id,
                u.branch_id,
                u.run,
                u.run_started_us,
                u.run_cpu_us,
                u.run_seen_us,
                u.cpu_us,
                u.active_us,
                u.cu_us,
            ),
        )
        await self._add_hours(hours)

    async def _add_hours(self, hours: Sequence[HourUsage]) -> None:
        added = ", ".join(f"{c} = usage_hours.{c} + excluded.{c}" for c in _ADDED)
        await self._c.executemany(
            f"INSERT INTO usage_hours ({_HOUR_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?)"
            f" ON CONFLICT (project_id, hour, branch_id) DO UPDATE SET {added}",
            [
                (
                    h.project_id,
                    h.branch_id,
                    h.hour,
                    h.cpu_us,
                    h.active_us,
                    h.cu_us,
                    h.logical_byte_s,
                    h.data_byte_s,
                    h.history_byte_s,
                    h.archived_byte_s,
                    h.written_bytes,
                )
                for h in hours
            ],
        )

    async def get_branch_sizes(self, branch_id: str) -> BranchSizes | None:
        r = await self._c.one(
            f"SELECT {_SIZES} FROM branch_storage WHERE branch_id = ?", (branch_id,)
        )
        return BranchSizes(*r) if r else None

    async def put_branch_sizes(self, sizes: BranchSizes, hours: Sequence[HourUsage]) -> None:
        s = sizes
        await self._c.execute(
            f"INSERT INTO branch_storage ({_SIZES}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)"
            f" ON CONFLICT (branch_id) DO UPDATE SET {_REPLACE_SIZES}",
            (
                s.project_id,
                s.branch_id,
                s.logical,
                s.data,
                s.history,
                s.sampled_us,
                s.wal_lsn,
                s.written,
                s.archived_at,
                s.archived,
                s.unarchived,
                s.unarchived_since,
            ),
        )
        await self._add_hours(hours)

    async def list_branch_sizes(self, project_id: str) -> dict[str, BranchSizes]:
        """The sizes of the project's branches that are not deleted."""
        rows = await self._c.all(
            f"SELECT {', '.join('s.' + c.strip() for c in _SIZES.split(','))}"
            " FROM branch_storage s JOIN branches b ON b.id = s.branch_id"
            " WHERE s.project_id = ? AND b.deleted_at IS NULL",
            (project_id,),
        )
        return {r[1]: BranchSizes(*r) for r in rows}

    async def project_storage(self, project_ids: Sequence[str]) -> dict[str, StorageTotals]:
        found: dict[str, StorageTotals] = {}
        for start in range(0, len(project_ids), 500):  # SQLite's bound on parameters
            chunk = project_ids[start : start + 500]
            rows = await self._c.all(
                "SELECT s.project_id, coalesce(sum(s.logical_bytes), 0),"
                " coalesce(sum(s.data_bytes), 0), coalesce(sum(s.history_bytes), 0),"
                " sum(s.written_bytes), coalesce(sum(s.archived_bytes), 0),"
                " coalesce(sum(CASE WHEN s.archived_bytes IS NULL THEN 0"
                "              ELSE coalesce(s.history_bytes, 0) END), 0)"
                " FROM branch_storage s JOIN branches b ON b.id = s.branch_id"
                f" WHERE s.project_id IN ({','.join('?' * len(chunk))})"
                " AND b.deleted_at IS NULL GROUP BY s.project_id",
                tuple(chunk),
            )
            found |= {
                r[0]: StorageTotals(
                    r[1], r[2], r[3], written=r[4], archived=r[5], archived_history=r[6]
                )
                for r in rows
            }
            # Snapshots are kept copies of a branch's data: counted with the history.
            kept = await self._c.all(
                "SELECT project_id, sum(full_size) FROM snapshots"
                f" WHERE project_id IN ({','.join('?' * len(chunk))}) AND deleted_at IS NULL"
                " AND full_size IS NOT NULL GROUP BY project_id",
                tuple(chunk),
            )
            for project_id, snapshot_bytes in kept:
                totals = found.get(project_id, StorageTotals())
                found[project_id] = replace(totals, history=totals.history + int(snapshot_bytes))
            hours = await self._c.all(
                "SELECT project_id, sum(logical_byte_s + history_byte_s) / 3600 FROM usage_hours"
                f" WHERE project_id IN ({','.join('?' * len(chunk))}) GROUP BY project_id",
                tuple(chunk),
            )
            for project_id, byte_hours in hours:
                if project_id in found:
                    found[project_id] = replace(found[project_id], byte_hours=int(byte_hours))
        return found

    async def storage_targets(self) -> list[tuple[str, str]]:
        """(project, branch) of every branch whose data is on this machine's disks now."""
        rows = await self._c.all(
            "SELECT b.project_id, b.id FROM branches b JOIN projects p ON p.id = b.project_id"
            " WHERE b.deleted_at IS NULL AND p.deleted_at IS NULL"
            " AND p.storage_state = 'attached' AND b.current_state = 'ready'"
            " ORDER BY b.project_id, b.id"
        )
        return [(r[0], r[1]) for r in rows]

    async def branch_usage(self, project_id: str) -> dict[str, Totals]:
        rows = await self._c.all(
            "SELECT branch_id, sum(cpu_us), sum(active_us), sum(cu_us) FROM endpoint_usage"
            " WHERE project_id = ? GROUP BY branch_id",
            (project_id,),
        )
        return {r[0]: Totals(r[1], r[2], r[3]) for r in rows}

    async def project_usage(self, project_ids: Sequence[str]) -> dict[str, Totals]:
        found: dict[str, Totals] = {}
        for start in range(0, len(project_ids), 500):  # SQLite's bound on parameters
            chunk = project_ids[start : start + 500]
            rows = await self._c.all(
                "SELECT project_id, sum(cpu_us), sum(active_us), sum(cu_us) FROM endpoint_usage"
                f" WHERE project_id IN ({','.join('?' * len(chunk))}) GROUP BY project_id",
                tuple(chunk),
            )
            found |= {r[0]: Totals(r[1], r[2], r[3]) for r in rows}
        return found

    async def prune_usage_hours(self, *, before_hour: int) -> int:
        return (
            await self._c.execute("DELETE FROM usage_hours WHERE hour < ?", (before_hour,))
        ).rowcount

    async def usage_hours(
        self, project_id: str, *, from_hour: int, to_hour: int
    ) -> list[tuple[HourUsage, bool]]:
        cols = ", ".join("h." + c.strip() for c in _HOUR_COLUMNS.split(","))
        rows = await self._c.all(
            f"SELECT {cols}, b.parent_id IS NULL AND b.id IS NOT NULL FROM usage_hours h"
            " LEFT JOIN branches b ON b.id = h.branch_id"
            " WHERE h.project_id = ? AND h.hour >= ? AND h.hour < ? ORDER BY h.hour, h.branch_id",
            (project_id, from_hour, to_hour),
        )
        return [(HourUsage(*r[:-1]), bool(r[-1])) for r in rows]

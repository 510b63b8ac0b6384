"""Compute usage: per endpoint (its runs' totals), summed per branch and project, and per hour."""

from __future__ import annotations

from collections.abc import Sequence

from pgplane.core.usage import EndpointUsage, HourUsage, Totals
from pgplane.store.sqlite.common import Statements

_COLUMNS = (
    "endpoint_id, project_id, branch_id, run, run_started_us, run_cpu_us, run_seen_us,"
    " cpu_us, active_us, cu_us"
)


class UsageMixin(Statements):
    """The usage part of :class:`pgplane.store.base.Tx` for SQLite."""

    async def get_endpoint_usage(self, endpoint_id: str) -> EndpointUsage | None:
        r = self._c.execute(
            f"SELECT {_COLUMNS} FROM endpoint_usage WHERE endpoint_id = ?", (endpoint_id,)
        ).fetchone()
        return EndpointUsage(*r) if r else None

    async def put_endpoint_usage(self, usage: EndpointUsage, hours: Sequence[HourUsage]) -> None:
        u = usage
        self._c.execute(
            f"INSERT OR REPLACE INTO endpoint_usage ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?)",
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
        self._c.executemany(
            "INSERT INTO usage_hours (project_id, branch_id, hour, cpu_us, active_us, cu_us)"
            " VALUES (?,?,?,?,?,?) ON CONFLICT (project_id, hour, branch_id) DO UPDATE SET"
            " cpu_us = cpu_us + excluded.cpu_us, active_us = active_us + excluded.active_us,"
            " cu_us = cu_us + excluded.cu_us",
            [(h.project_id, h.branch_id, h.hour, h.cpu_us, h.active_us, h.cu_us) for h in hours],
        )

    async def branch_usage(self, project_id: str) -> dict[str, Totals]:
        rows = self._c.execute(
            "SELECT branch_id, sum(cpu_us), sum(active_us), sum(cu_us) FROM endpoint_usage"
            " WHERE project_id = ? GROUP BY branch_id",
            (project_id,),
        ).fetchall()
        return {r[0]: Totals(r[1], r[2], r[3]) for r in rows}

    async def project_usage(self, project_ids: Sequence[str]) -> dict[str, Totals]:
        found: dict[str, Totals] = {}
        for start in range(0, len(project_ids), 500):  # SQLite's bound on parameters
            chunk = project_ids[start : start + 500]
            rows = self._c.execute(
                "SELECT project_id, sum(cpu_us), sum(active_us), sum(cu_us) FROM endpoint_usage"
                f" WHERE project_id IN ({','.join('?' * len(chunk))}) GROUP BY project_id",
                tuple(chunk),
            ).fetchall()
            found |= {r[0]: Totals(r[1], r[2], r[3]) for r in rows}
        return found

    async def usage_hours(
        self, project_id: str, *, from_hour: int, to_hour: int
    ) -> list[HourUsage]:
        """The project's hourly records with ``from_hour <= hour < to_hour``, oldest first."""
        rows = self._c.execute(
            "SELECT project_id, branch_id, hour, cpu_us, active_us, cu_us FROM usage_hours"
            " WHERE project_id = ? AND hour >= ? AND hour < ? ORDER BY hour, branch_id",
            (project_id, from_hour, to_hour),
        ).fetchall()
        return [HourUsage(*r) for r in rows]

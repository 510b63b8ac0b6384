"""Neon's consumption history, v2: per project, its periods, their timeframes and metrics."""

from __future__ import annotations

from msgspec import Struct

from pgplane.api.schemas.operations import Pagination


class ConsumptionMetricValue(Struct, kw_only=True):
    metric_name: str
    value: int


class ConsumptionTimeframe(Struct, kw_only=True):
    timeframe_start: str
    timeframe_end: str
    metrics: list[ConsumptionMetricValue]


class ConsumptionPeriod(Struct, kw_only=True, omit_defaults=True):
    period_id: str
    period_plan: str
    period_start: str
    consumption: list[ConsumptionTimeframe]
    period_end: str | None = None


class ProjectConsumption(Struct, kw_only=True):
    project_id: str
    periods: list[ConsumptionPeriod]


class ProjectsConsumption(Struct, kw_only=True, omit_defaults=True):
    projects: list[ProjectConsumption]
    pagination: Pagination | None = None


class BranchConsumption(Struct, kw_only=True):
    project_id: str
    branch_id: str
    periods: list[ConsumptionPeriod]


class BranchesConsumption(Struct, kw_only=True, omit_defaults=True):
    branches: list[BranchConsumption]
    pagination: Pagination | None = None

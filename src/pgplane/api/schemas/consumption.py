"""Neon's consumption history (v2, and v1 below): per project, its periods, their timeframes
and metrics."""

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


# -- v1 (GET /consumption_history/projects): a timeframe's figures are its fields ----------------


class ConsumptionTimeframeV1(Struct, kw_only=True, omit_defaults=True):
    timeframe_start: str
    timeframe_end: str
    active_time_seconds: int
    compute_time_seconds: int
    written_data_bytes: int
    synthetic_storage_size_bytes: int  # 0, as Neon answers it now (deprecated)
    data_storage_bytes_hour: int | None = None
    logical_size_bytes: int | None = None
    logical_size_bytes_hour: int | None = None


class ConsumptionPeriodV1(Struct, kw_only=True, omit_defaults=True):
    period_id: str
    period_plan: str
    period_start: str
    consumption: list[ConsumptionTimeframeV1]
    period_end: str | None = None


class ProjectConsumptionV1(Struct, kw_only=True):
    project_id: str
    periods: list[ConsumptionPeriodV1]


class ProjectsConsumptionV1(Struct, kw_only=True, omit_defaults=True):
    projects: list[ProjectConsumptionV1]
    pagination: Pagination | None = None

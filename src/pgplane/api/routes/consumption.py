"""Neon's consumption history: what each project's computes and storage used, by timeframe."""

from __future__ import annotations

from typing import Annotated, Literal

from litestar import Controller, get
from litestar.params import Parameter, QueryParameter

from pgplane.api.auth import AnyRequest, authorized
from pgplane.api.responses import error_responses
from pgplane.api.schemas.consumption import (
    BranchConsumption,
    BranchesConsumption,
    ConsumptionMetricValue,
    ConsumptionPeriod,
    ConsumptionPeriodV1,
    ConsumptionTimeframe,
    ConsumptionTimeframeV1,
    ProjectConsumption,
    ProjectConsumptionV1,
    ProjectsConsumption,
    ProjectsConsumptionV1,
)
from pgplane.api.schemas.operations import Pagination
from pgplane.core.clock import format_s
from pgplane.services import consumption

_ONE = "|".join(consumption.METRICS)
# What a query may name, stated as the document can: a list of names, each item one or several
# comma-separated (the service checks the same, with reasons).
_METRIC = Annotated[str, Parameter(pattern=f"^({_ONE})(,({_ONE}))*$")]
_METRICS = QueryParameter(min_items=1, max_items=100, description="repeated, or comma-separated")
_ONE_V1_METRIC = "|".join(consumption.V1_METRICS)
_V1_METRIC = Annotated[str, Parameter(pattern=f"^({_ONE_V1_METRIC})(,({_ONE_V1_METRIC}))*$")]
_ONE_BRANCH_METRIC = "|".join(consumption.BRANCH_METRICS)
_BRANCH_METRIC = Annotated[
    str, Parameter(pattern=f"^({_ONE_BRANCH_METRIC})(,({_ONE_BRANCH_METRIC}))*$")
]
_ID = Annotated[str, Parameter(pattern=consumption.PROJECT_IDS_PATTERN)]
_IDS = QueryParameter(max_items=100, description="repeated, or comma-separated")
_BRANCH_IDS = QueryParameter(
    min_items=1, max_items=100, description="required: repeated, or comma-separated"
)


class Consumption(Controller):
    path = "/consumption_history"
    tags = ["Consumption"]  # noqa: RUF012 - Litestar reads it as an instance attribute

    @get(
        "/v2/projects",
        operation_id="getConsumptionHistoryPerProjectV2",
        responses=error_responses(406),
    )
    async def per_project(
        self,
        request: AnyRequest,
        metrics: Annotated[list[_METRIC], _METRICS],
        granularity: Annotated[Literal["hourly", "daily", "monthly"], QueryParameter()],
        from_: Annotated[str, QueryParameter(name="from", max_length=64, format="date-time")],
        to: Annotated[str, QueryParameter(max_length=64, format="date-time")],
        project_ids: Annotated[list[_ID] | None, _IDS] = None,
        limit: int | None = Parameter(default=None, ge=1, le=100, description="10 when absent"),
        cursor: str | None = Parameter(default=None, max_length=60),
        org_id: str | None = Parameter(default=None, max_length=60),
    ) -> ProjectsConsumption:
        """Each project's usage per timeframe, from the hourly records the platform keeps."""
        ctx = authorized(request)
        query = consumption.parse(
            from_=from_,
            to=to,
            granularity=granularity,
            metrics=metrics,
            project_ids=project_ids,
            limit=limit,
            cursor=cursor,
            org_id=org_id,
        )
        async with ctx.store.read() as tx:
            found, next_cursor = await consumption.per_project(
                tx, account_id=ctx.account_id, query=query
            )
        return ProjectsConsumption(
            projects=[
                ProjectConsumption(
                    project_id=p.project_id,
                    periods=[_period(p.period_id, p.period_start_us, p.frames)],
                )
                for p in found
            ],
            pagination=None if next_cursor is None else Pagination(cursor=next_cursor),
        )

    @get(
        "/projects",
        operation_id="getConsumptionHistoryPerProject",
        responses=error_responses(406),
    )
    async def per_project_v1(
        self,
        request: AnyRequest,
        granularity: Annotated[Literal["hourly", "daily", "monthly"], QueryParameter()],
        from_: Annotated[str, QueryParameter(name="from", max_length=64, format="date-time")],
        to: Annotated[str, QueryParameter(max_length=64, format="date-time")],
        metrics: Annotated[list[_V1_METRIC] | None, _IDS] = None,
        project_ids: Annotated[list[_ID] | None, _IDS] = None,
        limit: int | None = Parameter(default=None, ge=1, le=100, description="10 when absent"),
        cursor: str | None = Parameter(default=None, max_length=60),
        org_id: str | None = Parameter(default=None, max_length=60),
        include_v1_metrics: Annotated[bool, QueryParameter()] = False,
    ) -> ProjectsConsumptionV1:
        """Neon's older form of the same history: each timeframe's figures as its fields."""
        ctx = authorized(request)
        query = consumption.parse(
            from_=from_,
            to=to,
            granularity=granularity,
            metrics=consumption.v1_metrics(metrics, include_v1_metrics=include_v1_metrics),
            project_ids=project_ids,
            limit=limit,
            cursor=cursor,
            org_id=org_id,
            allowed=consumption.V1_METRICS,
        )
        async with ctx.store.read() as tx:
            found, next_cursor = await consumption.per_project(
                tx, account_id=ctx.account_id, query=query
            )
        return ProjectsConsumptionV1(
            projects=[
                ProjectConsumptionV1(
                    project_id=p.project_id,
                    periods=[
                        ConsumptionPeriodV1(
                            period_id=p.period_id,
                            period_plan=consumption.PERIOD_PLAN,
                            period_start=format_s(p.period_start_us),
                            consumption=[_timeframe_v1(f) for f in p.frames],
                        )
                    ],
                )
                for p in found
            ],
            pagination=None if next_cursor is None else Pagination(cursor=next_cursor),
        )

    @get(
        "/v2/branches",
        operation_id="getConsumptionHistoryPerBranchV2",
        responses=error_responses(406),
    )
    async def per_branch(
        self,
        request: AnyRequest,
        metrics: Annotated[list[_BRANCH_METRIC], _METRICS],
        granularity: Annotated[Literal["hourly", "daily", "monthly"], QueryParameter()],
        from_: Annotated[str, QueryParameter(name="from", max_length=64, format="date-time")],
        to: Annotated[str, QueryParameter(max_length=64, format="date-time")],
        project_ids: Annotated[list[_ID], _BRANCH_IDS],
        limit: int | None = Parameter(default=None, ge=1, le=1000, description="100 when absent"),
        cursor: str | None = Parameter(default=None, max_length=130),
    ) -> BranchesConsumption:
        """Each branch's usage per timeframe, for the projects named (1 to 100)."""
        ctx = authorized(request)
        query = consumption.parse(
            from_=from_,
            to=to,
            granularity=granularity,
            metrics=metrics,
            project_ids=project_ids,
            limit=limit,
            cursor=cursor,
            org_id=None,
            allowed=consumption.BRANCH_METRICS,
            default_limit=consumption.BRANCH_DEFAULT_LIMIT,
            max_limit=consumption.BRANCH_MAX_LIMIT,
        )
        async with ctx.store.read() as tx:
            found, next_cursor = await consumption.per_branch(
                tx, account_id=ctx.account_id, query=query
            )
        return BranchesConsumption(
            branches=[
                BranchConsumption(
                    project_id=b.project_id,
                    branch_id=b.branch_id,
                    periods=[_period(b.period_id, b.period_start_us, b.frames)],
                )
                for b in found
            ],
            pagination=None if next_cursor is None else Pagination(cursor=next_cursor),
        )


def _period(period_id: str, start_us: int, frames: list[consumption.Frame]) -> ConsumptionPeriod:
    return ConsumptionPeriod(
        period_id=period_id,
        period_plan=consumption.PERIOD_PLAN,
        period_start=format_s(start_us),
        consumption=[
            ConsumptionTimeframe(
                timeframe_start=format_s(f.start_us),
                timeframe_end=format_s(f.end_us),
                metrics=[
                    ConsumptionMetricValue(metric_name=k, value=v) for k, v in f.values.items()
                ],
            )
            for f in frames
        ],
    )


def _timeframe_v1(f: consumption.Frame) -> ConsumptionTimeframeV1:
    v = f.values
    return ConsumptionTimeframeV1(
        timeframe_start=format_s(f.start_us),
        timeframe_end=format_s(f.end_us),
        active_time_seconds=v["active_time_seconds"],
        compute_time_seconds=v["compute_time_seconds"],
        written_data_bytes=v["written_data_bytes"],
        synthetic_storage_size_bytes=v["synthetic_storage_size_bytes"],
        data_storage_bytes_hour=v.get("data_storage_bytes_hour"),
        logical_size_bytes=v.get("logical_size_bytes"),
        logical_size_bytes_hour=v.get("logical_size_bytes_hour"),
    )

"""Neon's consumption history: what each project's computes and storage used, by timeframe."""

from __future__ import annotations

from typing import Annotated, Literal

from litestar import Controller, get
from litestar.params import Parameter, QueryParameter

from pgplane.api.auth import AnyRequest, authorized
from pgplane.api.responses import error_responses
from pgplane.api.schemas.consumption import (
    ConsumptionMetricValue,
    ConsumptionPeriod,
    ConsumptionTimeframe,
    ProjectConsumption,
    ProjectsConsumption,
)
from pgplane.api.schemas.operations import Pagination
from pgplane.core.clock import format_s
from pgplane.services import consumption

_ONE = "|".join(consumption.METRICS)
# What a query may name, stated as the document can: a list of names, each item one or several
# comma-separated (the service checks the same, with reasons).
_METRIC = Annotated[str, Parameter(pattern=f"^({_ONE})(,({_ONE}))*$")]
_METRICS = QueryParameter(min_items=1, max_items=100, description="repeated, or comma-separated")
_ID = Annotated[str, Parameter(pattern=consumption.PROJECT_IDS_PATTERN)]
_IDS = QueryParameter(max_items=100, description="repeated, or comma-separated")


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
                    periods=[
                        ConsumptionPeriod(
                            period_id=p.period_id,
                            period_plan=consumption.PERIOD_PLAN,
                            period_start=format_s(p.period_start_us),
                            consumption=[
                                ConsumptionTimeframe(
                                    timeframe_start=format_s(f.start_us),
                                    timeframe_end=format_s(f.end_us),
                                    metrics=[
                                        ConsumptionMetricValue(metric_name=k, value=v)
                                        for k, v in f.values.items()
                                    ],
                                )
                                for f in p.frames
                            ],
                        )
                    ],
                )
                for p in found
            ],
            pagination=None if next_cursor is None else Pagination(cursor=next_cursor),
        )

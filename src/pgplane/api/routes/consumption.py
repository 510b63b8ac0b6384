"""Neon's consumption history: what each project's computes and storage used, by timeframe."""

from __future__ import annotations

from typing import Annotated

from litestar import Controller, get
from litestar.params import Parameter

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

_LIST = Parameter(max_items=100, description="repeated, or comma-separated")


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
        metrics: Annotated[list[str], _LIST],
        from_: str = Parameter(query="from", max_length=64, description="RFC 3339 date-time"),
        to: str = Parameter(max_length=64, description="RFC 3339 date-time"),
        granularity: str = Parameter(max_length=16, description="hourly, daily or monthly"),
        project_ids: Annotated[list[str] | None, _LIST] = None,
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

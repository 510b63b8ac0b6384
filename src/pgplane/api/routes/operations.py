"""``/projects/{project_id}/operations``: list page by page, get one to poll it."""

from __future__ import annotations

from litestar import Controller, get
from litestar.params import FromPath, Parameter

from pgplane.api import presenters
from pgplane.api.auth import AnyRequest, authorized
from pgplane.api.responses import error_responses
from pgplane.api.schemas import OperationResponse, OperationsPage, Pagination
from pgplane.services import operations


class Operations(Controller):
    path = "/projects/{project_id:str}/operations"
    tags = ["Operation"]  # noqa: RUF012 - Litestar reads it as an instance attribute

    @get(operation_id="listProjectOperations", responses=error_responses())
    async def list_(
        self,
        request: AnyRequest,
        project_id: FromPath[str],
        limit: int | None = Parameter(
            default=None, ge=1, le=1000, description="1 to 1000; 10 when absent"
        ),
        cursor: str | None = Parameter(
            default=None,
            max_length=64,
            schema_extra={"format": "date-time"},
            description="pagination.cursor of the previous page (a timestamp with microseconds);"
            " any RFC 3339 time pages from there",
        ),
    ) -> OperationsPage:
        """The project's operations, newest first."""
        ctx = authorized(request)
        async with ctx.store.read() as tx:
            page = await operations.list_(
                tx, account_id=ctx.account_id, project_id=project_id, limit=limit, cursor=cursor
            )
        return OperationsPage(
            operations=presenters.operations(page.operations),
            pagination=Pagination(cursor=page.cursor) if page.cursor else None,
        )

    @get("/{operation_id:str}", operation_id="getProjectOperation", responses=error_responses())
    async def get_(
        self, request: AnyRequest, project_id: FromPath[str], operation_id: FromPath[str]
    ) -> OperationResponse:
        """One operation, for polling until it is finished."""
        ctx = authorized(request)
        async with ctx.store.read() as tx:
            op = await operations.get(
                tx, account_id=ctx.account_id, project_id=project_id, operation_id=operation_id
            )
        return OperationResponse(operation=presenters.operation(op))

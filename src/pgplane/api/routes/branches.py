"""``/projects/{project_id}/branches``: list, count, create (at a point too), get, update,
delete, set default, restore."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Literal

from litestar import Controller, delete, get, patch, post
from litestar.params import FromPath, JSONBody, Parameter

from pgplane.api import presenters
from pgplane.api.auth import AnyRequest, Authorized, authorized
from pgplane.api.responses import OptionalBody, error_responses
from pgplane.api.schemas import (
    BranchCount,
    BranchCreated,
    BranchCreateRequest,
    BranchEndpointSpec,
    BranchesPage,
    BranchOperations,
    BranchPagination,
    BranchResponse,
    BranchRestoreRequest,
    BranchUpdateRequest,
    EndpointsResponse,
)
from pgplane.core.models import Branch
from pgplane.errors import BadRequest
from pgplane.services import access, branches, endpoints, expiry, history, names, restores
from pgplane.services.connections import connection
from pgplane.store import Tx


def _endpoint_spec(e: BranchEndpointSpec) -> endpoints.EndpointSpec:
    return endpoints.EndpointSpec(
        type=e.type,
        autoscaling_limit_min_cu=e.autoscaling_limit_min_cu,
        autoscaling_limit_max_cu=e.autoscaling_limit_max_cu,
        suspend_timeout_seconds=e.suspend_timeout_seconds,
        pg_settings=e.settings.pg_settings if e.settings else None,
    )


class Branches(Controller):
    path = "/projects/{project_id:str}/branches"
    tags = ["Branch"]  # noqa: RUF012 - Litestar reads it as an instance attribute

    @get(operation_id="listProjectBranches", responses=error_responses())
    async def list_(
        self,
        request: AnyRequest,
        project_id: FromPath[str],
        limit: int | None = Parameter(
            default=None, ge=1, le=10000, description="absent: every branch in one response"
        ),
        cursor: str | None = Parameter(default=None, max_length=1024),
        sort_by: Literal["updated_at", "created_at", "name"] | None = Parameter(
            default=None, description="updated_at when absent"
        ),
        sort_order: str | None = Parameter(
            default=None,
            max_length=4,
            pattern=f"^({names.any_case('asc')}|{names.any_case('desc')})$",
            description="asc or desc, in any case; desc when absent",
        ),
        search: str | None = Parameter(default=None, max_length=256),
    ) -> BranchesPage:
        """The project's branches."""
        ctx = authorized(request)
        async with ctx.store.read() as tx:
            page = await branches.list_(
                tx,
                account_id=ctx.account_id,
                project_id=project_id,
                limit=limit,
                cursor=cursor,
                sort_by=sort_by,
                sort_order=sort_order,
                search=search,
            )
            used = await tx.branch_usage(project_id)
            sizes = await tx.list_branch_sizes(project_id)
        return BranchesPage(
            branches=[presenters.branch(b, used.get(b.id), sizes.get(b.id)) for b in page.branches],
            annotations={k: presenters.annotation(k, a) for k, a in page.annotations.items()},
            pagination=BranchPagination(
                next=page.next, sort_by=page.sort_by, sort_order=page.sort_order.upper()
            )
            if limit is not None
            else None,
        )

    @get("/count", operation_id="countProjectBranches", responses=error_responses())
    async def count(
        self,
        request: AnyRequest,
        project_id: FromPath[str],
        search: str | None = Parameter(default=None, max_length=256),
    ) -> BranchCount:
        ctx = authorized(request)
        async with ctx.store.read() as tx:
            n = await branches.count(
                tx, account_id=ctx.account_id, project_id=project_id, search=search
            )
        return BranchCount(count=n)

    @post(
        status_code=201,
        operation_id="createProjectBranch",
        responses=error_responses(409, 422, body=True),  # 422: the branch and compute quotas
        operation_class=OptionalBody,  # no body: a branch of the default branch, no compute
    )
    async def create(
        self,
        request: AnyRequest,
        project_id: FromPath[str],
        data: JSONBody[BranchCreateRequest | None] = None,
    ) -> BranchCreated:
        """Branch from the default branch (or ``parent_id``) at its head; computes on request."""
        return await create_branch(authorized(request), project_id, data)

    @get("/{branch_id:str}", operation_id="getProjectBranch", responses=error_responses())
    async def get_(
        self, request: AnyRequest, project_id: FromPath[str], branch_id: FromPath[str]
    ) -> BranchResponse:
        ctx = authorized(request)
        async with ctx.store.read() as tx:
            branch, annotation = await branches.get_annotated(
                tx, account_id=ctx.account_id, project_id=project_id, branch_id=branch_id
            )
            used = await tx.branch_usage(project_id)
            sizes = await tx.get_branch_sizes(branch.id)
        return BranchResponse(
            branch=presenters.branch(branch, used.get(branch.id), sizes),
            annotation=presenters.annotation(branch.id, annotation),
        )

    @patch(
        "/{branch_id:str}",
        operation_id="updateProjectBranch",
        responses=error_responses(409, body=True),
    )
    async def update(
        self,
        request: AnyRequest,
        project_id: FromPath[str],
        branch_id: FromPath[str],
        data: JSONBody[BranchUpdateRequest],
    ) -> BranchOperations:
        """Rename, (un)protect, set or clear its expiry, replace its annotation."""
        ctx = authorized(request)
        given = data.branch.expires_at
        changes = branches.BranchChanges(
            name=data.branch.name,
            protected=data.branch.protected,
            expires_at=expiry.parse(given) if isinstance(given, str) else given,
            annotation=data.annotation_value,
        )
        async with ctx.store.write() as tx:
            branch = await branches.update(
                tx,
                account_id=ctx.account_id,
                project_id=project_id,
                branch_id=branch_id,
                changes=changes,
            )
        return BranchOperations(branch=presenters.branch(branch), operations=[])

    @post(
        "/{branch_id:str}/restore",
        status_code=200,
        operation_id="restoreProjectBranch",
        responses=error_responses(409, 422, body=True),  # 422: preserve_under_name's branch
    )
    async def restore(
        self,
        request: AnyRequest,
        project_id: FromPath[str],
        branch_id: FromPath[str],
        data: JSONBody[BranchRestoreRequest],
    ) -> BranchOperations:
        """Replace the branch's data with its parent's, another branch's or its own past."""
        ctx = authorized(request)
        point = history.parse_point(
            lsn=data.source_lsn,
            timestamp=data.source_timestamp,
            lsn_field="source_lsn",
            time_field="source_timestamp",
        )
        spec = restores.RestoreSpec(
            source_branch_id=data.source_branch_id,
            point=point,
            preserve_under_name=data.preserve_under_name,
        )
        bounds = None
        if point is not None:
            bounds = await _bounds(
                ctx,
                project_id,
                lambda tx: restores.source_of(
                    tx,
                    account_id=ctx.account_id,
                    project_id=project_id,
                    branch_id=branch_id,
                    source_branch_id=data.source_branch_id,
                ),
            )
        async with ctx.store.write() as tx:
            branch, ops = await restores.restore(
                tx,
                account_id=ctx.account_id,
                project_id=project_id,
                branch_id=branch_id,
                spec=spec,
                settings=ctx.settings,
                bounds=bounds,
            )
        ctx.notify()
        return BranchOperations(
            branch=presenters.branch(branch), operations=presenters.operations(ops)
        )

    @delete(
        "/{branch_id:str}",
        status_code=200,
        operation_id="deleteProjectBranch",
        responses=error_responses(409),
    )
    async def delete_(
        self, request: AnyRequest, project_id: FromPath[str], branch_id: FromPath[str]
    ) -> BranchOperations:
        """Delete (``delete_timeline``); not the default, a protected or a parent branch."""
        ctx = authorized(request)
        async with ctx.store.write() as tx:
            branch, ops = await branches.delete(
                tx, account_id=ctx.account_id, project_id=project_id, branch_id=branch_id
            )
        ctx.notify()
        return BranchOperations(
            branch=presenters.branch(branch), operations=presenters.operations(ops)
        )

    @post(
        "/{branch_id:str}/set_as_default",
        status_code=200,
        operation_id="setDefaultProjectBranch",
        responses=error_responses(),
    )
    async def set_as_default(
        self, request: AnyRequest, project_id: FromPath[str], branch_id: FromPath[str]
    ) -> BranchOperations:
        return await self._set_default(request, project_id, branch_id)

    @post(
        "/{branch_id:str}/set_as_primary",
        status_code=200,
        operation_id="setPrimaryProjectBranch",
        responses=error_responses(),
        deprecated=True,
    )
    async def set_as_primary(
        self, request: AnyRequest, project_id: FromPath[str], branch_id: FromPath[str]
    ) -> BranchOperations:
        """The legacy name of set_as_default (the Python SDK still calls it)."""
        return await self._set_default(request, project_id, branch_id)

    async def _set_default(
        self, request: AnyRequest, project_id: FromPath[str], branch_id: FromPath[str]
    ) -> BranchOperations:
        ctx = authorized(request)
        async with ctx.store.write() as tx:
            branch = await branches.set_default(
                tx, account_id=ctx.account_id, project_id=project_id, branch_id=branch_id
            )
        return BranchOperations(branch=presenters.branch(branch), operations=[])

    @get(
        "/{branch_id:str}/endpoints",
        operation_id="listProjectBranchEndpoints",
        responses=error_responses(),
    )
    async def endpoints(
        self, request: AnyRequest, project_id: FromPath[str], branch_id: FromPath[str]
    ) -> EndpointsResponse:
        ctx = authorized(request)
        async with ctx.store.read() as tx:
            found = await endpoints.list_(
                tx, account_id=ctx.account_id, project_id=project_id, branch_id=branch_id
            )
        return EndpointsResponse(endpoints=[presenters.endpoint(e, ctx.settings) for e in found])


async def _bounds(
    ctx: Authorized, project_id: str, find: Callable[[Tx], Awaitable[Branch]]
) -> history.HistoryBounds:
    """What the history of the branch ``find`` names holds now: asked of the data plane
    outside any store transaction (it may ask the branch's compute)."""
    async with ctx.store.read() as tx:
        project = await access.live_project(tx, account_id=ctx.account_id, project_id=project_id)
        branch = await find(tx)
    return await ctx.history(
        project_id=project.id, branch_id=branch.id, pg_version=project.pg_version
    )


async def create_branch(
    ctx: Authorized,
    project_id: str,
    data: BranchCreateRequest | None,
    *,
    masking: list[dict[str, str]] | None = None,
    anonymize: bool = False,
) -> BranchCreated:
    """A branch as ``POST …/branches`` (and, with ``masking``, ``…/branch_anonymized``)
    makes it."""
    req = data.branch if data and data.branch else None
    # init_source takes only what the platform does (its type says so): schema-only copies
    # the source's schema (at parent_lsn/parent_timestamp, if given); archived is a boolean
    # in Neon's shape.
    if req is not None and req.archived:
        raise BadRequest("archived: archiving branches is not supported")
    point = history.parse_point(
        lsn=req.parent_lsn if req else None,
        timestamp=req.parent_timestamp if req else None,
        lsn_field="parent_lsn",
        time_field="parent_timestamp",
    )
    spec = branches.NewBranch(
        name=req.name if req else None,
        parent_id=req.parent_id if req else None,
        protected=bool(req.protected) if req else False,
        endpoints=[_endpoint_spec(e) for e in (data.endpoints or [])] if data else [],
        point=point,
        expires_at=expiry.parse(req.expires_at) if req and req.expires_at else None,
        annotation=data.annotation_value or {} if data else {},
        schema_only=req is not None and req.init_source == "schema-only",
        masking=masking,
        anonymize=anonymize,
    )
    bounds = None
    if point is not None:
        bounds = await _bounds(
            ctx,
            project_id,
            lambda tx: branches.parent_of(tx, project_id=project_id, parent_id=spec.parent_id),
        )
    async with ctx.store.write() as tx:
        created = await branches.create(
            tx,
            account_id=ctx.account_id,
            project_id=project_id,
            spec=spec,
            settings=ctx.settings,
            check_settings=ctx.check_settings,
            bounds=bounds,
        )
    ctx.notify()
    uris = [
        presenters.connection(connection(ctx.settings, endpoint=e, role=r, database=d))
        for e in created.endpoints
        for r in created.roles
        for d in created.databases
        if d.owner_name == r.name
    ]
    return BranchCreated(
        branch=presenters.branch(created.branch),
        endpoints=[presenters.endpoint(e, ctx.settings) for e in created.endpoints],
        operations=presenters.operations(created.operations),
        roles=[presenters.role(r, with_password=True) for r in created.roles],
        databases=[presenters.database(d) for d in created.databases],
        connection_uris=uris or None,
    )

"""``/projects/{project_id}/endpoints``: computes listed, created, changed, started, suspended."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from litestar import Controller, delete, get, patch, post
from litestar.params import FromPath, JSONBody

from pgplane.api import presenters
from pgplane.api.auth import AnyRequest, Authorized, authorized
from pgplane.api.responses import error_responses
from pgplane.api.schemas import (
    EndpointCreateRequest,
    EndpointOperations,
    EndpointResponse,
    EndpointsResponse,
    EndpointUpdateRequest,
)
from pgplane.api.unserved import refuse_switches
from pgplane.core.models import Endpoint, Operation
from pgplane.core.usage import EndpointUsage, Totals
from pgplane.errors import BadRequest
from pgplane.services import endpoints


def _answer(ctx: Authorized, endpoint: Endpoint, ops: list[Operation]) -> EndpointOperations:
    if ops:
        ctx.notify()
    return EndpointOperations(
        endpoint=presenters.endpoint(endpoint, ctx.settings),
        operations=presenters.operations(ops),
    )


EndpointAction = Callable[..., Awaitable[tuple[Endpoint, list[Operation]]]]


async def _act(
    request: AnyRequest,
    project_id: str,
    endpoint_id: str,
    action: EndpointAction,
    *,
    starts: bool = False,
) -> EndpointOperations:
    """Delete, start, suspend or restart: one service call in a write transaction. An action
    that ``starts`` a compute gets the settings holding the account's quotas."""
    ctx = authorized(request)
    quota = {"settings": ctx.settings} if starts else {}
    async with ctx.store.write() as tx:
        endpoint, ops = await action(
            tx, account_id=ctx.account_id, project_id=project_id, endpoint_id=endpoint_id, **quota
        )
    return _answer(ctx, endpoint, ops)


def _totals(used: EndpointUsage | None) -> Totals | None:
    return None if used is None else Totals.of(used)


class Endpoints(Controller):
    path = "/projects/{project_id:str}/endpoints"
    tags = ["Endpoint"]  # noqa: RUF012 - Litestar reads it as an instance attribute

    @get(operation_id="listProjectEndpoints", responses=error_responses())
    async def list_(self, request: AnyRequest, project_id: FromPath[str]) -> EndpointsResponse:
        ctx = authorized(request)
        async with ctx.store.read() as tx:
            found = await endpoints.list_(tx, account_id=ctx.account_id, project_id=project_id)
            used = await tx.list_endpoint_usage(project_id)
        return EndpointsResponse(
            endpoints=[presenters.endpoint(e, ctx.settings, _totals(used.get(e.id))) for e in found]
        )

    @post(
        status_code=201,
        operation_id="createProjectEndpoint",
        responses=error_responses(409, 422, body=True),  # 422: the account's compute quotas
    )
    async def create(
        self, request: AnyRequest, project_id: FromPath[str], data: JSONBody[EndpointCreateRequest]
    ) -> EndpointOperations:
        """A compute for a branch (one read_write per branch); starts it."""
        ctx = authorized(request)
        req = data.endpoint
        refuse_switches(req, "endpoint")
        if req.region_id is not None and req.region_id != ctx.settings.region_id:
            raise BadRequest(f"region_id must be the project's region, {ctx.settings.region_id!r}")
        spec = endpoints.EndpointSpec(
            type=req.type,
            autoscaling_limit_min_cu=req.autoscaling_limit_min_cu,
            autoscaling_limit_max_cu=req.autoscaling_limit_max_cu,
            suspend_timeout_seconds=req.suspend_timeout_seconds,
            pg_settings=req.settings.pg_settings if req.settings else None,
            disabled=bool(req.disabled),
            name=req.name,
        )
        async with ctx.store.write() as tx:
            endpoint, ops = await endpoints.create(
                tx,
                account_id=ctx.account_id,
                project_id=project_id,
                branch_id=req.branch_id,
                spec=spec,
                settings=ctx.settings,
                check_settings=ctx.check_settings,
            )
        return _answer(ctx, endpoint, ops)

    @get("/{endpoint_id:str}", operation_id="getProjectEndpoint", responses=error_responses())
    async def get_(
        self, request: AnyRequest, project_id: FromPath[str], endpoint_id: FromPath[str]
    ) -> EndpointResponse:
        ctx = authorized(request)
        async with ctx.store.read() as tx:
            endpoint = await endpoints.get(
                tx, account_id=ctx.account_id, project_id=project_id, endpoint_id=endpoint_id
            )
            used = await tx.get_endpoint_usage(endpoint.id)
        return EndpointResponse(endpoint=presenters.endpoint(endpoint, ctx.settings, _totals(used)))

    @patch(
        "/{endpoint_id:str}",
        operation_id="updateProjectEndpoint",
        responses=error_responses(422, body=True),  # 422: a running compute grown past them
    )
    async def update(
        self,
        request: AnyRequest,
        project_id: FromPath[str],
        endpoint_id: FromPath[str],
        data: JSONBody[EndpointUpdateRequest],
    ) -> EndpointOperations:
        """Resize, retune (``apply_config``), change the suspend timeout, disable or enable."""
        ctx = authorized(request)
        req = data.endpoint
        refuse_switches(req, "endpoint")
        changes = endpoints.EndpointChanges(
            autoscaling_limit_min_cu=req.autoscaling_limit_min_cu,
            autoscaling_limit_max_cu=req.autoscaling_limit_max_cu,
            suspend_timeout_seconds=req.suspend_timeout_seconds,
            pg_settings=req.settings.pg_settings if req.settings else None,
            disabled=req.disabled,
            branch_id=req.branch_id,
            name=req.name,
        )
        async with ctx.store.write() as tx:
            endpoint, ops = await endpoints.update(
                tx,
                account_id=ctx.account_id,
                project_id=project_id,
                endpoint_id=endpoint_id,
                changes=changes,
                settings=ctx.settings,
                check_settings=ctx.check_settings,
            )
        return _answer(ctx, endpoint, ops)

    @delete(
        "/{endpoint_id:str}",
        status_code=200,
        operation_id="deleteProjectEndpoint",
        responses=error_responses(),
    )
    async def delete_(
        self, request: AnyRequest, project_id: FromPath[str], endpoint_id: FromPath[str]
    ) -> EndpointOperations:
        return await _act(request, project_id, endpoint_id, endpoints.delete)

    @post(
        "/{endpoint_id:str}/start",
        status_code=200,
        operation_id="startProjectEndpoint",
        responses=error_responses(409, 422),  # a disabled endpoint; the account's quotas
    )
    async def start(
        self, request: AnyRequest, project_id: FromPath[str], endpoint_id: FromPath[str]
    ) -> EndpointOperations:
        return await _act(request, project_id, endpoint_id, endpoints.start, starts=True)

    @post(
        "/{endpoint_id:str}/suspend",
        status_code=200,
        operation_id="suspendProjectEndpoint",
        responses=error_responses(),
    )
    async def suspend(
        self, request: AnyRequest, project_id: FromPath[str], endpoint_id: FromPath[str]
    ) -> EndpointOperations:
        return await _act(request, project_id, endpoint_id, endpoints.suspend)

    @post(
        "/{endpoint_id:str}/restart",
        status_code=200,
        operation_id="restartProjectEndpoint",
        responses=error_responses(409, 422),  # a disabled endpoint; the account's quotas
    )
    async def restart(
        self, request: AnyRequest, project_id: FromPath[str], endpoint_id: FromPath[str]
    ) -> EndpointOperations:
        return await _act(request, project_id, endpoint_id, endpoints.restart, starts=True)

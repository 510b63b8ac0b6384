"""``/projects``: list, create, get, update, delete."""

from __future__ import annotations

from litestar import Controller, delete, get, patch, post
from litestar.params import FromPath, JSONBody, Parameter

from pgplane.api import presenters
from pgplane.api.auth import AnyRequest, authorized
from pgplane.api.responses import error_responses
from pgplane.api.schemas import (
    Pagination,
    ProjectCreated,
    ProjectCreateRequest,
    ProjectOperations,
    ProjectOut,
    ProjectResponse,
    ProjectsPage,
    ProjectUpdateRequest,
    ProjectWarning,
    to_builtins,
)
from pgplane.config import Settings
from pgplane.core.models import Project
from pgplane.services import projects
from pgplane.services.connections import connection
from pgplane.store import Tx


async def _with_usage(tx: Tx, project: Project, settings: Settings, email: str) -> ProjectOut:
    """The project as shown, with its usage and storage figures."""
    used = await tx.project_usage([project.id])
    stored = await tx.project_storage([project.id])
    return presenters.project(
        project,
        settings,
        owner_email=email,
        used=used.get(project.id),
        stored=stored.get(project.id),
    )


async def _owner_email(tx: Tx, account_id: str) -> str:
    account = await tx.get_account(account_id)
    return account.email if account else ""


class Projects(Controller):
    path = "/projects"
    tags = ["Project"]  # noqa: RUF012 - Litestar reads it as an instance attribute

    @get(operation_id="listProjects", responses=error_responses())
    async def list_(
        self,
        request: AnyRequest,
        limit: int | None = Parameter(
            default=None, ge=1, le=400, description="1 to 400; 10 when absent"
        ),
        cursor: str | None = Parameter(
            default=None,
            max_length=60,
            description="pagination.cursor of the previous page (a project id)",
        ),
        search: str | None = Parameter(
            default=None,
            max_length=256,
            description="only the projects whose name (in any case) or id holds it",
        ),
        recoverable: bool | None = Parameter(
            default=None,
            description="true: the deleted projects that can still be recovered (none here: a"
            " deleted project's data is removed at once)",
        ),
    ) -> ProjectsPage:
        """The account's projects, newest first."""
        ctx = authorized(request)
        store, settings = ctx.store, ctx.settings
        async with store.read() as tx:
            found = await projects.list_(
                tx,
                account_id=ctx.account_id,
                limit=limit,
                cursor=cursor,
                search=search,
                recoverable=bool(recoverable),
            )
            ids = [p.id for p in found]
            used, stored = await tx.project_usage(ids), await tx.project_storage(ids)
        return ProjectsPage(
            projects=[
                presenters.project_item(p, settings, used.get(p.id), stored.get(p.id))
                for p in found
            ],
            applications={},
            integrations={},
            pagination=Pagination(cursor=found[-1].id) if found else None,
        )

    @post(
        status_code=201,
        operation_id="createProject",
        responses=error_responses(409, 422, body=True),  # 422: the account's project quota
    )
    async def create(
        self, request: AnyRequest, data: JSONBody[ProjectCreateRequest]
    ) -> ProjectCreated:
        """Create a project with its default branch, compute, role and database.

        Postgres 15 and older come with ``warnings`` (CREATEROLE reaches the compute's OS user);
        an operator may offer only newer majors (``PGPLANE_MIN_PG_VERSION``): a 400 naming
        ``pg_version``."""
        ctx = authorized(request)
        store, settings = ctx.store, ctx.settings
        req = data.project
        branch = req.branch
        endpoint_settings = (
            to_builtins(req.default_endpoint_settings) if req.default_endpoint_settings else {}
        )
        for key in ("autoscaling_limit_min_cu", "autoscaling_limit_max_cu"):
            value = getattr(req, key)
            if value is not None:
                endpoint_settings.setdefault(key, value)
        spec = projects.NewProject(
            name=req.name,
            region_id=req.region_id,
            pg_version=req.pg_version,
            branch_name=branch.name if branch else None,
            role_name=branch.role_name if branch else None,
            database_name=branch.database_name if branch else None,
            history_retention_seconds=req.history_retention_seconds,
            store_passwords=req.store_passwords,
            default_endpoint_settings=endpoint_settings,
            settings=req.settings or {},
        )
        async with store.write() as tx:
            created = await projects.create(
                tx,
                account_id=ctx.account_id,
                spec=spec,
                settings=settings,
                check_settings=ctx.check_settings,
            )
            email = await _owner_email(tx, ctx.account_id)
        ctx.notify()
        return ProjectCreated(
            project=presenters.project(created.project, settings, owner_email=email),
            connection_uris=[
                presenters.connection(
                    connection(settings, endpoint=created.endpoint, role=role, database=db)
                )
                for role in created.roles
                for db in created.databases
                if db.owner_name == role.name
            ],
            roles=[presenters.role(r, with_password=True) for r in created.roles],
            databases=[presenters.database(d) for d in created.databases],
            operations=presenters.operations(created.operations),
            branch=presenters.branch(created.branch),
            endpoints=[presenters.endpoint(created.endpoint, settings)],
            warnings=[ProjectWarning(code=w.code, message=w.message) for w in created.warnings]
            or None,
        )

    @get("/{project_id:str}", operation_id="getProject", responses=error_responses())
    async def get_(self, request: AnyRequest, project_id: FromPath[str]) -> ProjectResponse:
        ctx = authorized(request)
        store, settings = ctx.store, ctx.settings
        async with store.read() as tx:
            project = await projects.get(tx, account_id=ctx.account_id, project_id=project_id)
            shown = await _with_usage(tx, project, settings, await _owner_email(tx, ctx.account_id))
        return ProjectResponse(project=shown)

    @patch("/{project_id:str}", operation_id="updateProject", responses=error_responses(body=True))
    async def update(
        self, request: AnyRequest, project_id: FromPath[str], data: JSONBody[ProjectUpdateRequest]
    ) -> ProjectOperations:
        """Rename; change history retention (starts ``apply_storage_config``)."""
        ctx = authorized(request)
        store, settings = ctx.store, ctx.settings
        req = data.project
        changes = projects.ProjectChanges(
            name=req.name,
            history_retention_seconds=req.history_retention_seconds,
            default_endpoint_settings=(
                to_builtins(req.default_endpoint_settings)
                if req.default_endpoint_settings
                else None
            ),
            settings=req.settings,
        )
        async with store.write() as tx:
            project, ops = await projects.update(
                tx,
                account_id=ctx.account_id,
                project_id=project_id,
                changes=changes,
                check_settings=ctx.check_settings,
            )
            shown = await _with_usage(tx, project, settings, await _owner_email(tx, ctx.account_id))
        if ops:
            ctx.notify()
        return ProjectOperations(
            project=shown,
            operations=presenters.operations(ops),
        )

    @delete(
        "/{project_id:str}",
        status_code=200,
        operation_id="deleteProject",
        responses=error_responses(),
    )
    async def delete_(self, request: AnyRequest, project_id: FromPath[str]) -> ProjectOperations:
        """Delete: computes stop and ``delete_tenant`` removes the data; poll its operation."""
        ctx = authorized(request)
        store, settings = ctx.store, ctx.settings
        async with store.write() as tx:
            project, ops = await projects.delete(
                tx, account_id=ctx.account_id, project_id=project_id
            )
            email = await _owner_email(tx, ctx.account_id)
        ctx.notify()
        return ProjectOperations(
            project=presenters.project(project, settings, owner_email=email),
            operations=presenters.operations(ops),
        )

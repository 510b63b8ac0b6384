"""``…/branches/{branch_id}/roles`` and ``…/databases``: each change is an ``apply_config``."""

from __future__ import annotations

from litestar import Controller, delete, get, patch, post
from litestar.params import FromPath, JSONBody

from pgplane.api import presenters
from pgplane.api.auth import AnyRequest, authorized
from pgplane.api.responses import error_responses
from pgplane.api.schemas import (
    DatabaseCreateRequest,
    DatabaseOperations,
    DatabaseResponse,
    DatabasesResponse,
    DatabaseUpdateRequest,
    RoleCreateRequest,
    RoleOperations,
    RolePassword,
    RoleResponse,
    RolesResponse,
)
from pgplane.services import roles

BRANCH_PATH = "/projects/{project_id:str}/branches/{branch_id:str}"


class Roles(Controller):
    path = f"{BRANCH_PATH}/roles"
    tags = ["Role"]  # noqa: RUF012 - Litestar reads it as an instance attribute

    @get(operation_id="listProjectBranchRoles", responses=error_responses())
    async def list_(
        self, request: AnyRequest, project_id: FromPath[str], branch_id: FromPath[str]
    ) -> RolesResponse:
        ctx = authorized(request)
        async with ctx.store.read() as tx:
            found = await roles.list_roles(
                tx, account_id=ctx.account_id, project_id=project_id, branch_id=branch_id
            )
        return RolesResponse(roles=[presenters.role(r, with_password=False) for r in found])

    @post(
        status_code=201,
        operation_id="createProjectBranchRole",
        responses=error_responses(409, body=True),
    )
    async def create(
        self,
        request: AnyRequest,
        project_id: FromPath[str],
        branch_id: FromPath[str],
        data: JSONBody[RoleCreateRequest],
    ) -> RoleOperations:
        """A login role with a generated password (shown here and by reveal_password)."""
        ctx = authorized(request)
        async with ctx.store.write() as tx:
            role, ops = await roles.create_role(
                tx,
                account_id=ctx.account_id,
                project_id=project_id,
                branch_id=branch_id,
                name=data.role.name,
                login=not data.role.no_login,
            )
        ctx.notify()
        return RoleOperations(
            role=presenters.role(role, with_password=True), operations=presenters.operations(ops)
        )

    @get("/{role_name:str}", operation_id="getProjectBranchRole", responses=error_responses())
    async def get_(
        self,
        request: AnyRequest,
        project_id: FromPath[str],
        branch_id: FromPath[str],
        role_name: FromPath[str],
    ) -> RoleResponse:
        ctx = authorized(request)
        async with ctx.store.read() as tx:
            role = await roles.get_role(
                tx,
                account_id=ctx.account_id,
                project_id=project_id,
                branch_id=branch_id,
                role_name=role_name,
            )
        return RoleResponse(role=presenters.role(role, with_password=False))

    @delete(
        "/{role_name:str}",
        status_code=200,
        operation_id="deleteProjectBranchRole",
        responses=error_responses(409),
    )
    async def delete_(
        self,
        request: AnyRequest,
        project_id: FromPath[str],
        branch_id: FromPath[str],
        role_name: FromPath[str],
    ) -> RoleOperations:
        ctx = authorized(request)
        async with ctx.store.write() as tx:
            role, ops = await roles.delete_role(
                tx,
                account_id=ctx.account_id,
                project_id=project_id,
                branch_id=branch_id,
                role_name=role_name,
            )
        ctx.notify()
        return RoleOperations(
            role=presenters.role(role, with_password=False), operations=presenters.operations(ops)
        )

    @get(
        "/{role_name:str}/reveal_password",
        operation_id="getProjectBranchRolePassword",
        responses=error_responses(412),
    )
    async def reveal_password(
        self,
        request: AnyRequest,
        project_id: FromPath[str],
        branch_id: FromPath[str],
        role_name: FromPath[str],
    ) -> RolePassword:
        return await self._reveal(request, project_id, branch_id, role_name)

    @post(
        "/{role_name:str}/reveal_password",
        status_code=200,
        operation_id="postProjectBranchRolePassword",
        responses=error_responses(412),
        deprecated=True,
    )
    async def reveal_password_post(
        self,
        request: AnyRequest,
        project_id: FromPath[str],
        branch_id: FromPath[str],
        role_name: FromPath[str],
    ) -> RolePassword:
        """The same as GET: the Python SDK sends a POST."""
        return await self._reveal(request, project_id, branch_id, role_name)

    async def _reveal(
        self,
        request: AnyRequest,
        project_id: FromPath[str],
        branch_id: FromPath[str],
        role_name: FromPath[str],
    ) -> RolePassword:
        ctx = authorized(request)
        async with ctx.store.read() as tx:
            password = await roles.reveal_password(
                tx,
                account_id=ctx.account_id,
                project_id=project_id,
                branch_id=branch_id,
                role_name=role_name,
            )
        return RolePassword(password=password)

    @post(
        "/{role_name:str}/reset_password",
        status_code=200,
        operation_id="resetProjectBranchRolePassword",
        responses=error_responses(),
    )
    async def reset_password(
        self,
        request: AnyRequest,
        project_id: FromPath[str],
        branch_id: FromPath[str],
        role_name: FromPath[str],
    ) -> RoleOperations:
        """A new password; the old one works until the operation finishes."""
        ctx = authorized(request)
        async with ctx.store.write() as tx:
            role, ops = await roles.reset_password(
                tx,
                account_id=ctx.account_id,
                project_id=project_id,
                branch_id=branch_id,
                role_name=role_name,
            )
        ctx.notify()
        return RoleOperations(
            role=presenters.role(role, with_password=True), operations=presenters.operations(ops)
        )


class Databases(Controller):
    path = f"{BRANCH_PATH}/databases"
    tags = ["Database"]  # noqa: RUF012 - Litestar reads it as an instance attribute

    @get(operation_id="listProjectBranchDatabases", responses=error_responses())
    async def list_(
        self, request: AnyRequest, project_id: FromPath[str], branch_id: FromPath[str]
    ) -> DatabasesResponse:
        ctx = authorized(request)
        async with ctx.store.read() as tx:
            found = await roles.list_databases(
                tx, account_id=ctx.account_id, project_id=project_id, branch_id=branch_id
            )
        return DatabasesResponse(databases=[presenters.database(d) for d in found])

    @post(
        status_code=201,
        operation_id="createProjectBranchDatabase",
        responses=error_responses(409, body=True),
    )
    async def create(
        self,
        request: AnyRequest,
        project_id: FromPath[str],
        branch_id: FromPath[str],
        data: JSONBody[DatabaseCreateRequest],
    ) -> DatabaseOperations:
        ctx = authorized(request)
        async with ctx.store.write() as tx:
            database, ops = await roles.create_database(
                tx,
                account_id=ctx.account_id,
                project_id=project_id,
                branch_id=branch_id,
                name=data.database.name,
                owner_name=data.database.owner_name,
            )
        ctx.notify()
        return DatabaseOperations(
            database=presenters.database(database), operations=presenters.operations(ops)
        )

    @get(
        "/{database_name:str}", operation_id="getProjectBranchDatabase", responses=error_responses()
    )
    async def get_(
        self,
        request: AnyRequest,
        project_id: FromPath[str],
        branch_id: FromPath[str],
        database_name: FromPath[str],
    ) -> DatabaseResponse:
        ctx = authorized(request)
        async with ctx.store.read() as tx:
            database = await roles.get_database(
                tx,
                account_id=ctx.account_id,
                project_id=project_id,
                branch_id=branch_id,
                database_name=database_name,
            )
        return DatabaseResponse(database=presenters.database(database))

    @patch(
        "/{database_name:str}",
        operation_id="updateProjectBranchDatabase",
        responses=error_responses(409, body=True),
    )
    async def update(
        self,
        request: AnyRequest,
        project_id: FromPath[str],
        branch_id: FromPath[str],
        database_name: FromPath[str],
        data: JSONBody[DatabaseUpdateRequest],
    ) -> DatabaseOperations:
        """Rename or change the owner."""
        ctx = authorized(request)
        async with ctx.store.write() as tx:
            database, ops = await roles.update_database(
                tx,
                account_id=ctx.account_id,
                project_id=project_id,
                branch_id=branch_id,
                database_name=database_name,
                name=data.database.name,
                owner_name=data.database.owner_name,
            )
        if ops:
            ctx.notify()
        return DatabaseOperations(
            database=presenters.database(database), operations=presenters.operations(ops)
        )

    @delete(
        "/{database_name:str}",
        status_code=200,
        operation_id="deleteProjectBranchDatabase",
        responses=error_responses(),
    )
    async def delete_(
        self,
        request: AnyRequest,
        project_id: FromPath[str],
        branch_id: FromPath[str],
        database_name: FromPath[str],
    ) -> DatabaseOperations:
        ctx = authorized(request)
        async with ctx.store.write() as tx:
            database, ops = await roles.delete_database(
                tx,
                account_id=ctx.account_id,
                project_id=project_id,
                branch_id=branch_id,
                database_name=database_name,
            )
        ctx.notify()
        return DatabaseOperations(
            database=presenters.database(database), operations=presenters.operations(ops)
        )

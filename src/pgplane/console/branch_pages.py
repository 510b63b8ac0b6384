"""A branch's computes (a read-only one added, or its read-write one), roles and databases
(create, delete, reveal and reset a password), and when the branch is deleted by itself (its
expiry).

As every console action, each calls the service the API route calls, scoped to the signed-in
account, in one write transaction; the project's page it redirects to shows the operations.
"""

from __future__ import annotations

from typing import Any

from litestar import Controller, post
from litestar.params import FromPath
from litestar.response import Redirect

from pgplane.console.pages import expires_at, form, page
from pgplane.console.project_pages import changed, project_context
from pgplane.console.session import PREFIX, AnyRequest, signed_in
from pgplane.errors import BadRequest, NotFound
from pgplane.services import branches, endpoints, roles


class BranchObjectsPage(Controller):
    path = f"{PREFIX}/projects/{{project_id:str}}/branches/{{branch_id:str}}"

    @post("/expiry")
    async def set_expiry(
        self, request: AnyRequest, project_id: FromPath[str], branch_id: FromPath[str]
    ) -> Redirect:
        me = signed_in(request)
        fields = await form(request)
        changes = branches.BranchChanges(expires_at=expires_at(fields.get("expires_in", "")))
        async with me.console.store.write() as tx:
            await branches.update(
                tx,
                account_id=me.account_id,
                project_id=project_id,
                branch_id=branch_id,
                changes=changes,
            )
        return changed(me, project_id, branch_id)

    @post("/endpoints")
    async def create_endpoint(
        self, request: AnyRequest, project_id: FromPath[str], branch_id: FromPath[str]
    ) -> Redirect:
        """A compute of the branch: a read-only one (a hot standby of its data), or its one
        read-write compute."""
        me = signed_in(request)
        kind = (await form(request)).get("type", "")
        if kind not in ("read_only", "read_write"):
            raise BadRequest(f"type must be read_only or read_write, not {kind[:40]!r}")
        async with me.console.store.write() as tx:
            await endpoints.create(
                tx,
                account_id=me.account_id,
                project_id=project_id,
                branch_id=branch_id,
                spec=endpoints.EndpointSpec(type=kind),
                settings=me.console.settings,
                check_settings=me.console.check_settings,
            )
        return changed(me, project_id, branch_id)

    @post("/roles")
    async def create_role(
        self, request: AnyRequest, project_id: FromPath[str], branch_id: FromPath[str]
    ) -> Redirect:
        me = signed_in(request)
        fields = await form(request)
        async with me.console.store.write() as tx:
            await roles.create_role(
                tx,
                account_id=me.account_id,
                project_id=project_id,
                branch_id=branch_id,
                name=fields.get("name", ""),
            )
        return changed(me, project_id, branch_id)

    @post("/roles/{role_name:str}/{action:str}")
    async def role_action(
        self,
        request: AnyRequest,
        project_id: FromPath[str],
        branch_id: FromPath[str],
        role_name: FromPath[str],
        action: FromPath[str],
    ) -> Any:
        me = signed_in(request)
        where = {"account_id": me.account_id, "project_id": project_id, "branch_id": branch_id}
        if action == "reveal":
            async with me.console.store.read() as tx:
                password = await roles.reveal_password(tx, role_name=role_name, **where)
            context = await project_context(request, project_id, branch_id, role_name, "")
            return page(request, "project.html", revealed=(role_name, password), **context)
        async with me.console.store.write() as tx:
            if action == "reset_password":
                await roles.reset_password(tx, role_name=role_name, **where)
            elif action == "delete":
                await roles.delete_role(tx, role_name=role_name, **where)
            else:
                raise NotFound("not found")
        return changed(me, project_id, branch_id)

    @post("/databases")
    async def create_database(
        self, request: AnyRequest, project_id: FromPath[str], branch_id: FromPath[str]
    ) -> Redirect:
        me = signed_in(request)
        fields = await form(request)
        where = {"account_id": me.account_id, "project_id": project_id, "branch_id": branch_id}
        async with me.console.store.write() as tx:
            await roles.create_database(
                tx, name=fields.get("name", ""), owner_name=fields.get("owner_name", ""), **where
            )
        return changed(me, project_id, branch_id)

    @post("/databases/{database_name:str}/delete")
    async def delete_database(
        self,
        request: AnyRequest,
        project_id: FromPath[str],
        branch_id: FromPath[str],
        database_name: FromPath[str],
    ) -> Redirect:
        me = signed_in(request)
        where = {"account_id": me.account_id, "project_id": project_id, "branch_id": branch_id}
        async with me.console.store.write() as tx:
            await roles.delete_database(tx, database_name=database_name, **where)
        return changed(me, project_id, branch_id)

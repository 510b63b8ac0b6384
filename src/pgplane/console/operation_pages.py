"""A project's operations, newest first, paged with the contract's cursor, with the contract's
display labels; the first page refreshes itself while anything on it is unsettled."""

from __future__ import annotations

from litestar import Controller, get
from litestar.params import FromPath, FromQuery
from litestar.response import Template

from pgplane.console.pages import page, unsettled
from pgplane.console.session import PREFIX, AnyRequest, signed_in
from pgplane.services import operations, projects

PAGE_SIZE = 20


class OperationsPage(Controller):
    path = f"{PREFIX}/projects/{{project_id:str}}/operations"

    @get("/")
    async def list_(
        self, request: AnyRequest, project_id: FromPath[str], cursor: FromQuery[str] = ""
    ) -> Template:
        me = signed_in(request)
        scope = {"account_id": me.account_id, "project_id": project_id}
        async with me.console.store.read() as tx:
            project = await projects.get(tx, **scope)
            found = await operations.list_(tx, **scope, limit=PAGE_SIZE, cursor=cursor or None)
        name = (
            "operations_live.html"
            if request.headers.get("x-pgplane-fragment")
            else "operations.html"
        )
        return page(
            request,
            name,
            project=project,
            operations=found.operations,
            cursor=cursor,
            next_cursor=found.cursor if len(found.operations) == PAGE_SIZE else None,
            # Only the first page changes by itself (new operations come first).
            live=not cursor and unsettled(found.operations),
        )

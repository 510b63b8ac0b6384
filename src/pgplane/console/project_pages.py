"""Projects: the list, and a project's page (branch tree, computes, roles, databases,
connection string, its latest operations), with the forms that change them.

Every action calls the same service as the API route that does it, in one write transaction,
and then tells the engine; the page it redirects to shows the operations it started.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from litestar import Controller, get, post
from litestar.params import FromPath, FromQuery
from litestar.response import Redirect, Template

from pgplane.console.pages import (
    DEFAULT_EXPIRY,
    EXPIRY_CHOICES,
    expires_at,
    form,
    history_bounds,
    page,
    point_at,
    unsettled,
)
from pgplane.console.session import PREFIX, AnyRequest, SignedIn, signed_in
from pgplane.console.usage_view import backups_view, usage_view
from pgplane.core.models import Branch, Endpoint, Operation, Project
from pgplane.core.operations import Action, Status
from pgplane.errors import BadRequest, LimitExceeded, NotFound, PgplaneError
from pgplane.services import branches, endpoints, expiry, operations, projects, roles
from pgplane.services.connections import find as find_connection

RECENT_OPERATIONS = 10
# The data a new branch starts with (the API's init_source): its parent's, or its schema alone.
INIT_SOURCES = {
    "parent-data": "the parent's data",
    "schema-only": "the parent's schema only, no rows",
}
_ENDPOINT_ACTIONS: dict[str, Callable[..., Awaitable[tuple[Endpoint, list[Operation]]]]] = {
    "start": endpoints.start,
    "suspend": endpoints.suspend,
    "restart": endpoints.restart,
    "delete": endpoints.delete,
}
# The operations that bring a compute up: the latest of them, failed, is why it is not.
_STARTS = frozenset({Action.START_COMPUTE, Action.APPLY_CONFIG})


@dataclass
class TreeNode:
    branch: Branch
    computes: list[Endpoint]
    pending: list[Operation]
    children: list[TreeNode] = field(default_factory=list)


def _tree(
    all_branches: list[Branch], computes: list[Endpoint], ops: list[Operation]
) -> list[TreeNode]:
    """The branches as a tree, parents before children, each with its computes and unsettled
    operations."""
    open_ops = [o for o in ops if o.status in ("scheduling", "running")]
    nodes = {
        b.id: TreeNode(
            branch=b,
            computes=[e for e in computes if e.branch_id == b.id],
            pending=[o for o in open_ops if o.branch_id == b.id],
        )
        for b in sorted(all_branches, key=lambda b: b.created_at)
    }
    roots: list[TreeNode] = []
    for node in nodes.values():
        parent = nodes.get(node.branch.parent_id or "")
        (parent.children if parent else roots).append(node)
    return roots


def _project_path(project_id: str) -> str:
    return f"{PREFIX}/projects/{project_id}"


class ProjectsPage(Controller):
    path = f"{PREFIX}/projects"

    @get("/")
    async def list_(self, request: AnyRequest) -> Template:
        return await _projects_page(request)

    @post("/")
    async def create(self, request: AnyRequest) -> Any:
        me = signed_in(request)
        fields = await form(request)
        console = me.console
        try:
            version = int(fields["pg_version"]) if fields.get("pg_version") else None
        except ValueError:
            return await _projects_page(request, 400, error="choose a Postgres version")
        spec = projects.NewProject(name=fields.get("name") or None, pg_version=version)
        try:
            async with console.store.write() as tx:
                created = await projects.create(
                    tx,
                    account_id=me.account_id,
                    spec=spec,
                    settings=console.settings,
                    check_settings=console.check_settings,
                )
        except (BadRequest, LimitExceeded) as exc:  # shown beside the form, to try again
            return await _projects_page(request, exc.status, error=exc.message)
        console.notify()
        return Redirect(path=_project_path(created.project.id), status_code=303)

    @get("/{project_id:str}")
    async def show(
        self,
        request: AnyRequest,
        project_id: FromPath[str],
        branch: FromQuery[str] = "",
        role: FromQuery[str] = "",
        database: FromQuery[str] = "",
    ) -> Template:
        context = await project_context(request, project_id, branch, role, database)
        name = "project_live.html" if request.headers.get("x-pgplane-fragment") else "project.html"
        return page(request, name, **context)

    @post("/{project_id:str}/rename")
    async def rename(self, request: AnyRequest, project_id: FromPath[str]) -> Redirect:
        me = signed_in(request)
        fields = await form(request)
        async with me.console.store.write() as tx:
            await projects.update(
                tx,
                account_id=me.account_id,
                project_id=project_id,
                changes=projects.ProjectChanges(name=fields.get("name", "")),
                check_settings=me.console.check_settings,
            )
        return Redirect(path=_project_path(project_id), status_code=303)

    @post("/{project_id:str}/delete")
    async def delete(self, request: AnyRequest, project_id: FromPath[str]) -> Redirect:
        me = signed_in(request)
        fields = await form(request)
        async with me.console.store.write() as tx:
            project = await projects.get(tx, account_id=me.account_id, project_id=project_id)
            if fields.get("confirm_name") != project.name:
                raise BadRequest("type the project's name to delete it")
            await projects.delete(tx, account_id=me.account_id, project_id=project_id)
        me.console.notify()
        return Redirect(path=f"{PREFIX}/projects", status_code=303)

    @post("/{project_id:str}/branches")
    async def create_branch(self, request: AnyRequest, project_id: FromPath[str]) -> Redirect:
        me = signed_in(request)
        fields = await form(request)
        source = fields.get("init_source", "parent-data")
        if source not in INIT_SOURCES:
            raise BadRequest(f"init_source must be parent-data or schema-only, not {source[:40]!r}")
        spec = branches.NewBranch(
            name=fields.get("name") or None,
            parent_id=fields.get("parent_id") or None,
            endpoints=[endpoints.EndpointSpec()] if fields.get("with_compute") else [],
            point=point_at(fields, "parent_timestamp"),
            expires_at=expires_at(fields.get("expires_in", "")),
            schema_only=source == "schema-only",
        )
        bounds = None
        if spec.point is not None:
            bounds = await history_bounds(
                me,
                project_id,
                lambda tx: branches.parent_of(tx, project_id=project_id, parent_id=spec.parent_id),
            )
        async with me.console.store.write() as tx:
            created = await branches.create(
                tx,
                account_id=me.account_id,
                project_id=project_id,
                spec=spec,
                settings=me.console.settings,
                check_settings=me.console.check_settings,
                bounds=bounds,
            )
        me.console.notify()
        return Redirect(
            path=f"{_project_path(project_id)}?branch={created.branch.id}", status_code=303
        )

    @post("/{project_id:str}/endpoints/{endpoint_id:str}/{action:str}")
    async def endpoint_action(
        self,
        request: AnyRequest,
        project_id: FromPath[str],
        endpoint_id: FromPath[str],
        action: FromPath[str],
    ) -> Redirect:
        me = signed_in(request)
        if action == "settings":
            return await _endpoint_settings(request, me, project_id, endpoint_id)
        change = _ENDPOINT_ACTIONS.get(action)
        if change is None:
            raise NotFound("not found")
        # A start is checked against the account's quotas, which the settings hold.
        quota = {} if action in ("suspend", "delete") else {"settings": me.console.settings}
        async with me.console.store.write() as tx:
            endpoint, _ = await change(
                tx,
                account_id=me.account_id,
                project_id=project_id,
                endpoint_id=endpoint_id,
                **quota,
            )
        me.console.notify()
        return Redirect(
            path=f"{_project_path(project_id)}?branch={endpoint.branch_id}", status_code=303
        )


async def _endpoint_settings(
    request: AnyRequest, me: SignedIn, project_id: str, endpoint_id: str
) -> Redirect:
    """A compute's Postgres settings, one ``name = value`` a line, as the API's PATCH takes
    them (checked by its Postgres; a running compute restarts with them)."""
    text = (await form(request)).get("pg_settings", "")
    pg_settings: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        name, equals, value = line.partition("=")
        if not equals or not name.strip():
            raise BadRequest(f"settings line {number}: write it as name = value")
        pg_settings[name.strip()] = value.strip()
    async with me.console.store.write() as tx:
        endpoint, _ = await endpoints.update(
            tx,
            account_id=me.account_id,
            project_id=project_id,
            endpoint_id=endpoint_id,
            changes=endpoints.EndpointChanges(pg_settings=pg_settings),
            settings=me.console.settings,
            check_settings=me.console.check_settings,
        )
    return changed(me, project_id, endpoint.branch_id)


def _start_failures(computes: list[Endpoint], ops: list[Operation]) -> dict[str, str]:
    """Each compute that is not running, nor asked to, because its latest start (or restart
    with new settings) failed for good since it last ran: why."""
    found: dict[str, str] = {}
    for e in computes:
        if e.current_state == "active" or e.pending_state is not None:
            continue
        failed = next(
            (
                op
                for op in ops  # newest first
                if op.endpoint_id == e.id and op.action in _STARTS and op.status == Status.FAILED
            ),
            None,
        )
        if failed is not None and failed.error and failed.updated_at > (e.started_at or 0):
            found[e.id] = failed.error
    return found


def changed(me: SignedIn, project_id: str, branch_id: str) -> Redirect:
    me.console.notify()
    return Redirect(path=f"{_project_path(project_id)}?branch={branch_id}", status_code=303)


async def _projects_page(request: AnyRequest, status: int = 200, **context: Any) -> Template:
    me = signed_in(request)
    async with me.console.store.read() as tx:
        found = await projects.list_(tx, account_id=me.account_id, limit=400, cursor=None)
    settings = me.console.settings
    return page(
        request,
        "projects.html",
        status_code=status,
        projects=found,
        pg_versions=sorted(projects.offered_pg_versions(settings), reverse=True),
        # Majors that hand CREATEROLE the compute's OS user are offered with the reason to avoid.
        last_risky_major=projects.LAST_CREATEROLE_OS_MAJOR,
        risky_major_hint=f"{projects.CREATEROLE_OS_ACCESS}: choose 16 or newer unless the"
        " project needs an older one.",
        region=settings.region_id,
        **context,
    )


async def project_context(
    request: AnyRequest, project_id: str, branch_id: str, role: str, database: str
) -> dict[str, Any]:
    me = signed_in(request)
    scope = {"account_id": me.account_id, "project_id": project_id}
    async with me.console.store.read() as tx:
        project: Project = await projects.get(tx, **scope)
        page_ = await operations.list_(tx, **scope, limit=RECENT_OPERATIONS, cursor=None)
        listed = await branches.list_(
            tx, **scope, limit=None, cursor=None, sort_by=None, sort_order=None, search=None
        )
        all_branches = listed.branches
        computes = await endpoints.list_(tx, **scope)
        selected = next((b for b in all_branches if b.id == branch_id), None)
        if selected is None:
            selected = next(b for b in all_branches if b.default)
        branch_roles = await roles.list_roles(tx, **scope, branch_id=selected.id)
        branch_databases = await roles.list_databases(tx, **scope, branch_id=selected.id)
        chosen_role = role or (branch_roles[0].name if branch_roles else "")
        chosen_db = database or (branch_databases[0].name if branch_databases else "")
        uri, uri_error = "", ""
        try:
            found = await find_connection(
                tx, me.console.settings, **scope, database_name=chosen_db,
                role_name=chosen_role, branch_id=selected.id, endpoint_id=None,
            )  # fmt: skip
            uri = found.uri
        except PgplaneError as exc:
            uri_error = exc.message
        usage = await usage_view(tx, project.id, all_branches)
        kept = me.console.settings.object_store is not None
        share = me.console.settings.disk_per_project << 20
        backups = (
            await backups_view(tx, project.id, all_branches, share_bytes=share) if kept else None
        )
        parents = {b.parent_id for b in all_branches}
    return {
        **usage,
        "backups": backups,
        "project": project,
        "tree": _tree(all_branches, computes, page_.operations),
        "branches": all_branches,
        "selected": selected,
        "annotations": {bid: a.value for bid, a in listed.annotations.items()},
        "keeps": expiry.why_not(selected, has_children=selected.id in parents),
        "expiry_choices": EXPIRY_CHOICES,
        "init_sources": INIT_SOURCES,
        "default_expiry": DEFAULT_EXPIRY,
        "computes": [e for e in computes if e.branch_id == selected.id],
        "roles": branch_roles,
        "databases": branch_databases,
        "chosen_role": chosen_role,
        "chosen_db": chosen_db,
        "uri": uri,
        "uri_error": uri_error,
        "operations": page_.operations,
        "next_cursor": page_.cursor,
        "live": unsettled(page_.operations),
        "start_failures": _start_failures(computes, page_.operations),
    }

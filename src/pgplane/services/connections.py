"""Connection strings that ``psql`` and drivers can use as they are."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote

from pgplane.config import Settings
from pgplane.core.models import Database, Endpoint, Role
from pgplane.errors import BadRequest, NotFound
from pgplane.services import access
from pgplane.store import Tx


@dataclass(frozen=True, slots=True)
class Connection:
    uri: str
    role: str
    password: str
    database: str
    # Apart too, for PGHOST, PGPORT and PGOPTIONS: the host alone, its port, and the options
    # that name the endpoint when the host does not (no wildcard DNS).
    host: str
    port: int
    options: str | None


def connection(
    settings: Settings, *, endpoint: Endpoint, role: Role, database: Database
) -> Connection:
    # Through the proxy. Without wildcard DNS the endpoint's own name does not resolve, so the
    # URI names the proxy and passes the endpoint in options, as Neon does for clients without SNI.
    if settings.proxy_wildcard_dns:
        host, options = f"{endpoint.id}.{settings.proxy_host}", None
    else:
        host, options = settings.proxy_host, f"endpoint={endpoint.id}"
    port = "" if settings.proxy_port == 5432 else f":{settings.proxy_port}"
    query = "sslmode=require" + ("" if options is None else f"&options={quote(options)}")
    uri = (
        f"postgresql://{quote(role.name, safe='')}:{quote(role.password, safe='')}"
        f"@{host}{port}/{quote(database.name, safe='')}?{query}"
    )
    return Connection(
        uri=uri,
        role=role.name,
        password=role.password,
        database=database.name,
        host=host,
        port=settings.proxy_port,
        options=options,
    )


async def find(
    tx: Tx,
    settings: Settings,
    *,
    account_id: str,
    project_id: str,
    database_name: str,
    role_name: str,
    branch_id: str | None,
    endpoint_id: str | None,
) -> Connection:
    """The connection for a role and database, through the branch's (or the given) compute."""
    project = await access.live_project(tx, account_id=account_id, project_id=project_id)
    if branch_id is None:
        branch = await access.default_branch(tx, project_id=project.id)
    else:
        branch = await access.branch(tx, project_id=project.id, branch_id=branch_id)
    if endpoint_id is None:
        computes = [
            e
            for e in await tx.list_endpoints(project.id)
            if e.branch_id == branch.id and e.type == "read_write"
        ]
        if not computes:
            raise NotFound("the branch has no compute; create an endpoint for it first")
        endpoint = computes[0]
    else:
        endpoint = await access.endpoint(tx, project_id=project.id, endpoint_id=endpoint_id)
        if endpoint.branch_id != branch.id:
            raise BadRequest("endpoint_id is not a compute of the branch")
    role = await access.role(tx, branch_id=branch.id, name=role_name)
    database = await access.database(tx, branch_id=branch.id, name=database_name)
    return connection(settings, endpoint=endpoint, role=role, database=database)

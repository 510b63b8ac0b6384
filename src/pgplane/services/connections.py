"""Connection strings that ``psql`` and drivers can use as they are."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote

from pgplane.config import Settings
from pgplane.core.models import Database, Endpoint, Role


@dataclass(frozen=True, slots=True)
class Connection:
    uri: str
    host: str
    role: str
    password: str
    database: str


def connection(
    settings: Settings, *, endpoint: Endpoint, role: Role, database: Database
) -> Connection:
    # Until the proxy routes by endpoint name, a compute is reached on its own port.
    host = f"{settings.compute_host}:{endpoint.port}"
    uri = (
        f"postgresql://{quote(role.name, safe='')}:{quote(role.password, safe='')}"
        f"@{host}/{quote(database.name, safe='')}"
    )
    return Connection(
        uri=uri, host=host, role=role.name, password=role.password, database=database.name
    )

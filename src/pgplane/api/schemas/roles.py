"""Roles and databases, and connection URIs."""

from __future__ import annotations

from msgspec import Struct

from pgplane.api.schemas.common import DatabaseName, Identifier, RoleName
from pgplane.api.schemas.objects import DatabaseOut, RoleOut
from pgplane.api.schemas.operations import OperationOut


class RolesResponse(Struct, kw_only=True):
    roles: list[RoleOut]


class RoleResponse(Struct, kw_only=True):
    role: RoleOut


class RoleOperations(Struct, kw_only=True):
    role: RoleOut
    operations: list[OperationOut]


class RolePassword(Struct, kw_only=True):
    password: str


class RoleCreateSpec(Struct, kw_only=True):
    name: RoleName
    no_login: bool | None = None


class RoleCreateRequest(Struct, kw_only=True):
    role: RoleCreateSpec


class DatabasesResponse(Struct, kw_only=True):
    databases: list[DatabaseOut]


class DatabaseResponse(Struct, kw_only=True):
    database: DatabaseOut


class DatabaseOperations(Struct, kw_only=True):
    database: DatabaseOut
    operations: list[OperationOut]


class DatabaseCreateSpec(Struct, kw_only=True):
    name: DatabaseName
    owner_name: Identifier


class DatabaseCreateRequest(Struct, kw_only=True):
    database: DatabaseCreateSpec


class DatabaseUpdateSpec(Struct, kw_only=True):
    name: DatabaseName | None = None
    owner_name: Identifier | None = None


class DatabaseUpdateRequest(Struct, kw_only=True):
    database: DatabaseUpdateSpec


class ConnectionURI(Struct, kw_only=True):
    uri: str

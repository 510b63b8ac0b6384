"""API keys: create, list, revoke."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta, Struct

from pgplane.api.schemas.common import documented
from pgplane.services import names


class ApiKeyCreateRequest(Struct, kw_only=True):
    key_name: Annotated[
        str,
        Meta(min_length=1, max_length=64, extra_json_schema=documented(pattern=names.NAME_PATTERN)),
    ]


class ApiKeyCreated(Struct, kw_only=True):
    id: int
    key: str
    name: str
    created_at: str
    created_by: str


class ApiKeyCreator(Struct, kw_only=True):
    id: str
    name: str
    image: str


class ApiKeyListItem(Struct, kw_only=True):
    id: int
    name: str
    created_at: str
    created_by: ApiKeyCreator
    last_used_at: str | None
    last_used_from_addr: str


class ApiKeyRevoked(Struct, kw_only=True):
    id: int
    name: str
    created_at: str
    created_by: str
    last_used_at: str | None
    last_used_from_addr: str
    revoked: bool

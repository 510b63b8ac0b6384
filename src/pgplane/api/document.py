"""The OpenAPI document as served: Litestar's, plus what only the running platform knows.

Litestar writes the document from the route types, once for every platform. Which region this
platform serves and which Postgres versions it has are settings, known at start-up; requests
naming others are refused, so the document names the ones it takes.
"""

from __future__ import annotations

import inspect
from typing import Any

import msgspec

from pgplane.api.schemas import anonymized, branches, endpoints
from pgplane.config import Settings


def _only(schema: dict[str, Any], values: list[Any]) -> None:
    """Narrow an optional property to ``values`` (or null, meaning the platform's default)."""
    schema["enum"] = [*values, None]


def _closed(schemas: dict[str, Any]) -> None:
    """The bodies that take only their own fields (``forbid_unknown_fields``: another is a 400
    naming it) say so, as Litestar does not: ``additionalProperties: false``."""
    for module in (anonymized, branches, endpoints):
        for name, cls in inspect.getmembers(module, inspect.isclass):
            if (
                issubclass(cls, msgspec.Struct)
                and cls.__struct_config__.forbid_unknown_fields
                and name in schemas
            ):
                schemas[name]["additionalProperties"] = False


def served(document: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """``document`` (Litestar's, as a dict) with this platform's region and Postgres versions,
    and the bodies that take no other fields closed."""
    schemas = document["components"]["schemas"]
    _closed(schemas)
    for name in ("ProjectCreateSpec", "EndpointCreateSpec"):
        _only(schemas[name]["properties"]["region_id"], [settings.region_id])
    _only(schemas["ProjectCreateSpec"]["properties"]["pg_version"], sorted(settings.pg_versions))
    return document

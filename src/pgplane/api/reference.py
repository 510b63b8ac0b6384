"""``GET /docs``: the API reference, rendered here from the OpenAPI document, no script at all.

An interactive renderer (Swagger UI and the like) loads its code from a CDN, and a machine
without the internet showed a blank page; the reference must work wherever the platform does.
The page lists every operation by tag: method, path, summary, parameters, request body and
responses, with the schemas they name, linked; ``/api/v2/openapi.json`` stays the machine's
version of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from litestar import Request, get
from litestar.datastructures import State
from litestar.response import Template

from pgplane.api import document
from pgplane.config import Settings

_METHODS = ("get", "post", "put", "patch", "delete")


@dataclass(frozen=True, slots=True)
class Operation:
    method: str
    path: str
    summary: str
    description: str
    operation_id: str
    parameters: list[dict[str, str]]
    body: str | None
    responses: list[tuple[str, str, str | None]]


@dataclass(slots=True)
class Reference:
    title: str
    version: str
    description: str
    tags: dict[str, list[Operation]] = field(default_factory=dict)
    schemas: dict[str, list[tuple[str, str, bool]]] = field(default_factory=dict)


def type_of(schema: dict[str, Any]) -> str:
    """A schema in a few words: a named one by name, else its type (arrays of their items)."""
    if "$ref" in schema:
        return str(schema["$ref"]).rsplit("/", 1)[-1]
    for key in ("oneOf", "anyOf"):
        if key in schema:
            return " | ".join(type_of(s) for s in schema[key])
    kind = schema.get("type", "object")
    if isinstance(kind, list):
        return " | ".join(map(str, kind))
    if kind == "array":
        return f"array of {type_of(schema.get('items', {}))}"
    return str(kind)


def build(doc: dict[str, Any]) -> Reference:
    info = doc.get("info", {})
    ref = Reference(info.get("title", ""), info.get("version", ""), info.get("description", ""))
    for path, item in sorted(doc.get("paths", {}).items()):
        for method in _METHODS:
            op = item.get(method)
            if op is None:
                continue
            parameters = [
                {
                    "name": p.get("name", ""),
                    "in": p.get("in", ""),
                    "type": type_of(p.get("schema", {})),
                    "required": "yes" if p.get("required") else "",
                    "description": p.get("description", ""),
                }
                for p in op.get("parameters", [])
            ]
            content = op.get("requestBody", {}).get("content", {})
            body = next((type_of(c.get("schema", {})) for c in content.values()), None)
            responses = [
                (
                    code,
                    r.get("description", ""),
                    next(
                        (type_of(c.get("schema", {})) for c in r.get("content", {}).values()), None
                    ),
                )
                for code, r in sorted(op.get("responses", {}).items())
            ]
            entry = Operation(
                method.upper(),
                path,
                op.get("summary", ""),
                op.get("description", ""),
                op.get("operationId", ""),
                parameters,
                body,
                responses,
            )
            for tag in op.get("tags") or ["Other"]:
                ref.tags.setdefault(tag, []).append(entry)
    for name, schema in sorted(doc.get("components", {}).get("schemas", {}).items()):
        required = set(schema.get("required", []))
        ref.schemas[name] = [
            (prop, type_of(sub), prop in required)
            for prop, sub in schema.get("properties", {}).items()
        ]
    return ref


def reference_handler(settings: Settings) -> Any:
    built: list[Reference] = []  # once per process: the document does not change

    @get("/docs", include_in_schema=False, sync_to_thread=False)
    def api_reference(request: Request[Any, Any, State]) -> Template:
        """The API reference, as a page (see the module's docstring)."""
        if not built:
            built.append(build(document.served(request.app.openapi_schema.to_schema(), settings)))
        return Template(template_name="reference.html", context={"ref": built[0]})

    return api_reference

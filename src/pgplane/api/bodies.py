"""Request bodies as the contract has them: JSON, sent as ``application/json``, taken exactly.

Left to itself Litestar reads any content type as JSON, keeps the last of duplicate keys, turns
``"17"`` into 17 and ``0`` into ``false`` (it converts with ``strict=False``), and answers a
deeply nested body with a RecursionError, a 500. Types are the document's, JSON Schema's way: an
integer may be written 3.0, never "3". The router's ``before_request`` hook calls
:func:`check` before a route's body is parsed, so a route only ever gets a body that means what it
says in the document's types.
"""

from __future__ import annotations

import json
import re
import weakref
from typing import Any

import msgspec
from litestar.handlers import HTTPRouteHandler

from pgplane.api.auth import AnyRequest
from pgplane.errors import BadRequest, UnsupportedMediaType

JSON = "application/json"
_NO_BODY = object()
# What each route handler takes as its body, found once per handler.
_body_types: weakref.WeakKeyDictionary[HTTPRouteHandler, tuple[Any, bool]] = (
    weakref.WeakKeyDictionary()
)
_AT = re.compile(r"^(.*) - at `\$\.?(.*)`$")
_AT_KEY = re.compile(r"^(.*) - at `key` in `\$\.?(.*)`$")


def _body_type(handler: HTTPRouteHandler) -> tuple[Any, bool]:
    """The handler's body type (or _NO_BODY), and whether a body must be sent."""
    found = _body_types.get(handler)
    if found is None:
        data = handler.parsed_fn_signature.parameters.get("data")
        found = (_NO_BODY, False) if data is None else (data.annotation, not data.has_default)
        _body_types[handler] = found
    return found


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # Two values for one key: parsers disagree on which counts, so neither does.
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise BadRequest(f"invalid request: duplicate key {key!r} in a JSON object")
        seen[key] = value
    return seen


def _integral(value: Any) -> Any:
    """Floats with nothing after the point as integers: JSON Schema counts 3.0 an integer, and
    msgspec's strict mode would not (its lax mode would take "3" too)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _integral(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_integral(v) for v in value]
    return value


def _where(error: msgspec.ValidationError) -> str:
    """msgspec's ``Expected … - at `$.a.b``` as the API's other messages put it: ``a.b: …``."""
    message = str(error)
    m = _AT_KEY.match(message)
    if m:  # a map's key: msgspec names the map
        return f"{m.group(2)}: a key: {m.group(1)}"
    m = _AT.match(message)
    return f"{m.group(2)}: {m.group(1)}" if m else message


async def check(request: AnyRequest) -> None:
    """Raise the 4xx a body deserves unless it is JSON of the route's body type."""
    expected, required = _body_type(request.route_handler)
    if expected is _NO_BODY:
        return
    raw = await request.body()
    if not raw:
        if required:
            raise BadRequest("invalid request: a JSON body is required")
        return
    media_type, _ = request.content_type
    if media_type != JSON:
        raise UnsupportedMediaType(f"a request body must be JSON, sent as Content-Type: {JSON}")
    try:
        json.loads(raw, object_pairs_hook=_reject_duplicates)
        msgspec.convert(_integral(msgspec.json.decode(raw)), type=expected, strict=True)
    except RecursionError:
        raise BadRequest("invalid request: JSON nested too deeply") from None
    except msgspec.ValidationError as exc:
        raise BadRequest(f"invalid request: {_where(exc)}") from None
    except (ValueError, msgspec.DecodeError) as exc:
        raise BadRequest(f"invalid request: malformed JSON: {exc}") from None

"""Request bodies as the contract has them: JSON, sent as ``application/json``, taken exactly.

Left to itself Litestar reads any content type as JSON, keeps the last of duplicate keys, turns
``"17"`` into 17 and ``0`` into ``false`` (it converts with ``strict=False``), and answers a
deeply nested body with a RecursionError, a 500. The router's ``before_request`` hook calls
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
_body_types: weakref.WeakKeyDictionary[HTTPRouteHandler, Any] = weakref.WeakKeyDictionary()
_AT = re.compile(r"^(.*) - at `\$\.?(.*)`$")


def _body_type(handler: HTTPRouteHandler) -> Any:
    found = _body_types.get(handler)
    if found is None:
        data = handler.parsed_fn_signature.parameters.get("data")
        found = _NO_BODY if data is None else data.annotation
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


def _where(error: msgspec.ValidationError) -> str:
    """msgspec's ``Expected … - at `$.a.b``` as the API's other messages put it: ``a.b: …``."""
    message = str(error)
    m = _AT.match(message)
    return f"{m.group(2)}: {m.group(1)}" if m else message


async def check(request: AnyRequest) -> None:
    """Raise the 4xx a body deserves unless it is JSON of the route's body type; no body is
    left to the route (a route that needs one says so)."""
    expected = _body_type(request.route_handler)
    if expected is _NO_BODY:
        return
    raw = await request.body()
    if not raw:
        return
    media_type, _ = request.content_type
    if media_type != JSON:
        raise UnsupportedMediaType(f"a request body must be JSON, sent as Content-Type: {JSON}")
    try:
        json.loads(raw, object_pairs_hook=_reject_duplicates)
        msgspec.json.decode(raw, type=expected, strict=True)
    except RecursionError:
        raise BadRequest("invalid request: JSON nested too deeply") from None
    except msgspec.ValidationError as exc:
        raise BadRequest(f"invalid request: {_where(exc)}") from None
    except (ValueError, msgspec.DecodeError) as exc:
        raise BadRequest(f"invalid request: malformed JSON: {exc}") from None

"""Every error, ours or the framework's, rendered as the one JSON error body."""

from __future__ import annotations

import logging
import re
import uuid
from typing import Any

from litestar import MediaType, Request, Response
from litestar.datastructures import State
from litestar.exceptions import HTTPException, ValidationException

from pgplane.api.schemas import ErrorBody
from pgplane.core import keys
from pgplane.core.scrub import scrub
from pgplane.errors import BadRequest, PgplaneError
from pgplane.telemetry import logs

log = logging.getLogger(__name__)

AnyRequest = Request[Any, Any, State]

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
# The framework's own errors (404 for no route, 405, 413, validation) take the code our error tree
# gives their status, so every body speaks one vocabulary.
_CODES = {cls.status: cls.code for cls in PgplaneError.__subclasses__()}


def request_id(request: AnyRequest) -> str:
    """The request's id as its log lines have it (api/logcontext.py); else the client's
    ``X-Request-ID`` when it is sane, else a fresh one."""
    return (
        logs.request_id.get()
        or sane_request_id(request.headers.get("x-request-id"))
        or uuid.uuid4().hex
    )


def sane_request_id(given: str | None) -> str | None:
    """A client's request id, if short and plain, and not one that looks like an API key.

    A client that put its key there by mistake would see it echoed in error bodies and written
    in the log, where a key must never appear.
    """
    if given and _REQUEST_ID.match(given) and not given.startswith(keys.PREFIX):
        return given
    return None


def _render(
    request: AnyRequest,
    status: int,
    code: str,
    message: str,
    headers: dict[str, str] | None = None,
) -> Response[ErrorBody]:
    return Response(
        ErrorBody(code=code, message=message, request_id=request_id(request)),
        status_code=status,
        media_type=MediaType.JSON,
        headers=headers,
    )


def on_platform_error(request: AnyRequest, exc: PgplaneError) -> Response[ErrorBody]:
    return _render(request, exc.status, exc.code, scrub(exc.message), exc.headers)


def _validation_message(exc: ValidationException) -> str:
    details = []
    if isinstance(exc.extra, list):
        for item in exc.extra:
            if isinstance(item, dict):
                key = item.get("key")
                text = item.get("message", "")
                details.append(f"{key}: {text}" if key else str(text))
    detail = "; ".join(details) if details else exc.detail
    return f"invalid request: {detail}"


# Litestar's word for a client gone before its whole body came (a slow body past its deadline, see
# api/http.py): the client's doing, not a server error; no one is left to read an answer.
_DISCONNECTED = "client disconnected prematurely"


def on_http_error(request: AnyRequest, exc: HTTPException) -> Response[ErrorBody]:
    status = exc.status_code
    if status >= 500 and exc.detail == _DISCONNECTED:
        log.info("client left during its request body: %s %s", request.method, request.url.path)
        return _render(request, 400, BadRequest.code, "the request body did not arrive")
    if status >= 500:
        log.error("server error on %s %s: %s", request.method, request.url.path, exc.detail)
        return _render(request, 500, "INTERNAL", "internal server error")
    message = _validation_message(exc) if isinstance(exc, ValidationException) else exc.detail
    if status == 404 and message == "Not Found":
        # No route: Neon's words for one it does not serve, which its clients read as "this
        # feature is not available here" (neon's workflow commands go on without it).
        message = "this route does not exist on this platform"
    headers = dict(exc.headers or {})
    return _render(request, status, _CODES.get(status, "BAD_REQUEST"), message, headers)


def on_unexpected(request: AnyRequest, exc: Exception) -> Response[ErrorBody]:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return _render(request, 500, "INTERNAL", "internal server error")

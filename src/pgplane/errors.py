"""The one error tree. Each error knows its HTTP status and code; one API handler renders the body.

::

    PgplaneError (500 INTERNAL)
     ├── BadRequest (400 BAD_REQUEST)
     │    └── SqlFailed (400: SQL over HTTP's refusals and Postgres' errors, with their fields)
     ├── Unauthorized (401 UNAUTHORIZED)
     ├── Forbidden (403 FORBIDDEN: the console's CSRF check)
     ├── NotFound (404 NOT_FOUND)
     ├── MethodNotAllowed (405 METHOD_NOT_ALLOWED)
     ├── Conflict (409 CONFLICT)
     │    └── AlreadyExists (409 BRANCH_ALREADY_EXISTS, ROLE_..., DATABASE_..., ENDPOINT_...)
     ├── PreconditionFailed (412 PRECONDITION_FAILED)
     ├── PayloadTooLarge (413 PAYLOAD_TOO_LARGE)
     ├── UnsupportedMediaType (415 UNSUPPORTED_MEDIA_TYPE)
     ├── LimitExceeded (422 PROJECTS_LIMIT_EXCEEDED, BRANCHES_..., ACTIVE_ENDPOINTS_...,
     │                  COMPUTE_UNITS_...)
     ├── Locked (423 LOCKED)
     ├── TooManyRequests (429 TOO_MANY_REQUESTS)
     ├── Unavailable (503 SERVICE_UNAVAILABLE)
     └── ResponseTooLarge (507 RESPONSE_TOO_LARGE: a SQL over HTTP result past its bound)

Services raise these; they never build HTTP responses.
"""

from __future__ import annotations

from typing import ClassVar


class PgplaneError(Exception):
    status: ClassVar[int] = 500
    code: str = "INTERNAL"  # the class's, unless an instance names its case more precisely

    def __init__(self, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers = headers or {}


class BadRequest(PgplaneError):
    status = 400
    code = "BAD_REQUEST"


class SqlFailed(BadRequest):
    """A SQL over HTTP request that fails as Neon reports it: ``fields`` are the error's
    ``code`` (SQLSTATE), ``severity``, ``detail``, ``hint``... the driver copies onto the error
    it throws; Postgres' own for a query's error, the proxy's for its refusals."""

    code = "SQL_FAILED"

    def __init__(self, message: str, fields: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.fields = fields or {}


class Unauthorized(PgplaneError):
    status = 401
    code = "UNAUTHORIZED"

    def __init__(self, message: str = "authentication required: a valid API key") -> None:
        super().__init__(message, headers={"WWW-Authenticate": "Bearer"})


class Forbidden(PgplaneError):
    status = 403
    code = "FORBIDDEN"


class NotFound(PgplaneError):
    status = 404
    code = "NOT_FOUND"


class MethodNotAllowed(PgplaneError):
    status = 405
    code = "METHOD_NOT_ALLOWED"


class NotAcceptable(PgplaneError):
    """Neon's answer to a consumption range its granularity does not allow."""

    status = 406
    code = "NOT_ACCEPTABLE"


class Conflict(PgplaneError):
    status = 409
    code = "CONFLICT"


class AlreadyExists(Conflict):
    """A name, or a place there is one of (a branch's read_write endpoint), is taken.

    The code names what, so a client can tell a name it may reuse from another conflict
    without reading the message: ``BRANCH_ALREADY_EXISTS``, ``ROLE_ALREADY_EXISTS``...
    The message keeps Neon's form: ``branch already exists; branch_name:"pr-1"``.
    """

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.code = f"{kind.upper()}_ALREADY_EXISTS"


class PreconditionFailed(PgplaneError):
    status = 412
    code = "PRECONDITION_FAILED"


class PayloadTooLarge(PgplaneError):
    status = 413
    code = "PAYLOAD_TOO_LARGE"


class UnsupportedMediaType(PgplaneError):
    status = 415
    code = "UNSUPPORTED_MEDIA_TYPE"


class LimitExceeded(PgplaneError):
    """A quota of the account or project is reached (services/quotas.py).

    The code names which, as Neon's do (``PROJECTS_LIMIT_EXCEEDED``, ``BRANCHES_LIMIT_EXCEEDED``,
    ``ACTIVE_ENDPOINTS_LIMIT_EXCEEDED``), so clients that act on Neon's codes (the branch
    actions prune branches on ``BRANCHES_LIMIT_EXCEEDED``) act on ours.
    """

    status = 422
    code = "LIMIT_EXCEEDED"

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.code = f"{kind.upper()}_LIMIT_EXCEEDED"


class Locked(PgplaneError):
    status = 423
    code = "LOCKED"


class TooManyRequests(PgplaneError):
    status = 429
    code = "TOO_MANY_REQUESTS"


class Unavailable(PgplaneError):
    status = 503
    code = "SERVICE_UNAVAILABLE"


class ResponseTooLarge(PgplaneError):
    """A SQL over HTTP result past the proxy's bound (Neon's status for it)."""

    status = 507
    code = "RESPONSE_TOO_LARGE"

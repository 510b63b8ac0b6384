"""What every route declares in the OpenAPI document besides its success response."""

from __future__ import annotations

from dataclasses import dataclass

from litestar.openapi.datastructures import ResponseSpec
from litestar.openapi.spec import Operation, RequestBody

from pgplane.api.schemas import ErrorBody

# Documented on every route: what a client can get besides success.
ERROR_RESPONSES = (400, 401, 404, 413, 429, 503)
# A route that reads a JSON body also refuses one of another media type (see api/bodies.py).
BODY_ERRORS = (415,)


def error_responses(*extra: int, body: bool = False) -> dict[int, ResponseSpec]:
    """OpenAPI response specs for the error statuses a route can answer with; ``body`` for a
    route that reads a request body."""
    statuses = sorted({*ERROR_RESPONSES, *(BODY_ERRORS if body else ()), *extra})
    return {
        code: ResponseSpec(data_container=ErrorBody, description="Error", generate_examples=False)
        for code in statuses
    }


@dataclass
class OptionalBody(Operation):
    """The operation of a route whose body may be left out (Litestar marks every body required)."""

    def __post_init__(self) -> None:
        if isinstance(self.request_body, RequestBody):
            self.request_body.required = False

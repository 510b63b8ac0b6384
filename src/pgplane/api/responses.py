"""What every route declares in the OpenAPI document besides its success response."""

from __future__ import annotations

from litestar.openapi.datastructures import ResponseSpec

from pgplane.api.schemas import ErrorBody

# Documented on every route: what a client can get besides success.
ERROR_RESPONSES = (400, 401, 404, 413, 429, 503)


def error_responses(*extra: int) -> dict[int, ResponseSpec]:
    """OpenAPI response specs for the error statuses a route can answer with."""
    statuses = sorted({*ERROR_RESPONSES, *extra})
    return {
        code: ResponseSpec(data_container=ErrorBody, description="Error", generate_examples=False)
        for code in statuses
    }

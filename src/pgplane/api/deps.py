"""What route handlers may ask for by name: ``caller``, ``store``, ``settings``, ``notify``."""

from __future__ import annotations

from collections.abc import Callable

from litestar.openapi.datastructures import ResponseSpec

from pgplane.api.schemas import ErrorBody
from pgplane.config import Settings
from pgplane.store import Store

Notify = Callable[[], None]

# Documented on every route: what a client can get besides success.
ERROR_RESPONSES = (400, 401, 404, 413, 429, 503)


def error_responses(*extra: int) -> dict[int, ResponseSpec]:
    """OpenAPI response specs for the error statuses a route can answer with."""
    statuses = sorted({*ERROR_RESPONSES, *extra})
    return {
        code: ResponseSpec(data_container=ErrorBody, description="Error", generate_examples=False)
        for code in statuses
    }


__all__ = ["Notify", "Settings", "Store", "error_responses"]

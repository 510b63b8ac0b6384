"""The ASGI application: routes under ``/api/v2``, its OpenAPI document, one error body."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from litestar import Litestar, MediaType, Request, Response, Router, get
from litestar.datastructures import State
from litestar.exceptions import HTTPException
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import JsonRenderPlugin
from litestar.openapi.spec import Components, SecurityScheme
from litestar.routes import HTTPRoute

from pgplane import __version__
from pgplane.api import bodies, document, health
from pgplane.api.auth import AnyRequest, Platform, key_hook
from pgplane.api.errors import on_http_error, on_platform_error, on_unexpected
from pgplane.api.logcontext import note_path_ids
from pgplane.api.metrics import scrape
from pgplane.api.ratelimit import RateLimiter
from pgplane.api.reference import reference_handler
from pgplane.api.routes.account import Account
from pgplane.api.routes.anonymized import Anonymized
from pgplane.api.routes.api_keys import ApiKeys
from pgplane.api.routes.branches import Branches
from pgplane.api.routes.consumption import Consumption
from pgplane.api.routes.endpoints import Endpoints
from pgplane.api.routes.operations import Operations
from pgplane.api.routes.projects import Projects
from pgplane.api.routes.roles import Databases, Roles
from pgplane.api.routes.schema import BranchSchemas
from pgplane.api.routes.snapshots import Snapshots
from pgplane.config import Settings
from pgplane.console.app import console
from pgplane.console.headers import console_headers
from pgplane.console.pages import templates
from pgplane.errors import NotFound, PgplaneError, Unavailable
from pgplane.services import api_keys
from pgplane.services.compute_settings import SettingsCheck
from pgplane.services.history import HistoryLookup, unknown_history
from pgplane.services.schemas import SchemaDumper, no_dumps
from pgplane.store import Store
from pgplane.telemetry.metrics import NO_METRICS, Metrics

log = logging.getLogger(__name__)

BASE_PATH = "/api/v2"
_ENCODED_SLASH = b"%2f"


def _nothing() -> None:
    return None


def _answer_options(allowed: dict[str, str]) -> Callable[[AnyRequest], Response[None]]:
    """OPTIONS with the route's real methods in ``Allow``.

    Litestar 2's own OPTIONS handler lists only the methods of the first handler registered for a
    path (litestar-org/litestar#4169, fixed in 3): ``OPTIONS /projects`` said ``POST`` alone.
    """

    def answer(request: AnyRequest) -> Response[None]:
        methods = allowed.get(request.scope.get("path_template", ""), "OPTIONS")
        return Response(None, status_code=204, headers={"Allow": methods})

    return answer


async def _flush_key_uses(store: Store, recorder: api_keys.UseRecorder) -> None:
    if recorder.has_pending():
        async with store.write() as tx:
            batch = await recorder.flush(tx)
        recorder.written(batch)


def create_app(
    *,
    store: Store,
    settings: Settings,
    check_settings: SettingsCheck,
    history: HistoryLookup = unknown_history,
    schema: SchemaDumper = no_dumps,
    notify: Callable[[], None] = _nothing,
    readiness: health.Readiness | None = None,
    metrics: Metrics = NO_METRICS,
) -> Litestar:
    """The API over ``store``; ``notify`` is called after a request starts operations,
    ``check_settings`` (the compute driver's) judges pg_settings values, ``readiness`` (by
    default the store's alone) answers ``/readyz``, and ``metrics``, when on, ``/metrics``."""
    recorder = api_keys.UseRecorder()

    @contextlib.asynccontextmanager
    async def key_use_flusher(_: Litestar) -> AsyncIterator[None]:
        async def loop() -> None:
            while True:
                await asyncio.sleep(settings.key_use_flush_seconds)
                try:
                    await _flush_key_uses(store, recorder)
                except Unavailable as exc:  # kept for the next flush
                    log.warning("API key use not recorded yet: %s", exc.message)
                except Exception:
                    log.exception("could not record API key use; will retry")

        task = asyncio.create_task(loop())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await _flush_key_uses(store, recorder)

    @get(
        f"{BASE_PATH}/openapi.json",
        include_in_schema=False,
        media_type=MediaType.JSON,
        sync_to_thread=False,
    )
    def openapi_document(request: Request[Any, Any, State]) -> dict[str, Any]:
        """The OpenAPI document of this API, public like Neon's."""
        return document.served(request.app.openapi_schema.to_schema(), settings)

    # One allowance per account, whether its requests come with a key or a console session.
    limiter = RateLimiter.from_settings(settings)
    authenticate = key_hook(
        Platform(
            store=store,
            settings=settings,
            notify=notify,
            check_settings=check_settings,
            history=history,
            schema=schema,
            key_uses=recorder,
            limiter=limiter,
        )
    )
    allowed: dict[str, str] = {}  # filled once the app has built its routes
    answer_options = _answer_options(allowed)

    async def before_request(request: AnyRequest) -> Response[None] | None:
        """Every request: the key first (a stranger learns nothing, not even a 400), then whether
        the path can name anything, then OPTIONS, then the body's form."""
        note_path_ids(request.path_params)
        await authenticate(request)
        if _ENCODED_SLASH in (request.scope.get("raw_path") or b"").lower():
            # Routing sees the decoded path, where %2F is a separator: /projects/%2F would be
            # /projects. No id or name here holds a slash, so such a path names nothing.
            raise NotFound("not found")
        if request.method == "OPTIONS":
            return answer_options(request)
        await bodies.check(request)
        return None

    api = Router(
        path=BASE_PATH,
        route_handlers=[
            Account,
            ApiKeys,
            Projects,
            Operations,
            Branches,
            Anonymized,
            BranchSchemas,
            Snapshots,
            Endpoints,
            Roles,
            Databases,
            Consumption,
        ],
        security=[{"BearerAuth": []}],
        before_request=before_request,
    )
    console_state, console_handlers = console(
        store=store,
        settings=settings,
        notify=notify,
        check_settings=check_settings,
        history=history,
        limiter=limiter,
    )
    app = Litestar(
        route_handlers=[
            api,
            openapi_document,
            reference_handler(settings),
            health.live,
            health.ready,
            *([scrape] if metrics.enabled else []),
            *console_handlers,
        ],
        state=State(
            {
                "readiness": readiness or health.Readiness(store),
                "console": console_state,
                "metrics": metrics,
            }
        ),
        template_config=templates(),
        before_send=[console_headers],
        exception_handlers={
            PgplaneError: on_platform_error,
            HTTPException: on_http_error,
            Exception: on_unexpected,
        },
        openapi_config=OpenAPIConfig(
            title="pgplane management API",
            version=__version__,
            description="A Neon-compatible management API (v2) for self-hosted Postgres.",
            # The document is served by openapi_document, the reference page by
            # api/reference.py (no renderer that loads code from a CDN); Litestar's own schema
            # routes stay out of the way, and outside /api/v2, whose unknown paths answer JSON.
            path="/schema",
            render_plugins=[JsonRenderPlugin(path="/openapi.json")],
            components=Components(
                security_schemes={"BearerAuth": SecurityScheme(type="http", scheme="bearer")}
            ),
        ),
        request_max_body_size=settings.max_body_bytes,
        lifespan=[key_use_flusher],
        debug=False,
        logging_config=None,  # the process entry point configures logging
    )
    allowed.update(
        {
            route.path_format: ", ".join(sorted(route.methods))
            for route in app.routes
            if isinstance(route, HTTPRoute)
        }
    )
    return app

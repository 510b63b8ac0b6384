"""The web console: server-rendered pages under ``/console``, served by ``pgplane serve`` itself.

Routes are thin and call the same services as the API, so the console can do nothing the API
cannot; a page of another account's object is the API's 404. Templates and the few static files
ship in the package (no build step).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from litestar import Router, get
from litestar.response import Redirect
from litestar.static_files import create_static_files_router
from litestar.types import ControllerRouterHandler

from pgplane.config import Settings
from pgplane.console.account_pages import ApiKeysPage, Auth
from pgplane.console.branch_pages import BranchObjectsPage
from pgplane.console.operation_pages import OperationsPage
from pgplane.console.pages import HERE, error_page, sign_in_first
from pgplane.console.presession import PreSessions
from pgplane.console.project_pages import ProjectsPage
from pgplane.console.session import PREFIX, Console, SignInRequired, SignInThrottle, session_hook
from pgplane.console.snapshot_pages import SnapshotsPage
from pgplane.errors import PgplaneError
from pgplane.services.compute_settings import SettingsCheck
from pgplane.services.history import HistoryLookup, unknown_history
from pgplane.store import Store

if TYPE_CHECKING:  # the api package imports the console: a type only
    from pgplane.api.ratelimit import RateLimiter


@get(["/", PREFIX], include_in_schema=False)
async def home() -> Redirect:
    return Redirect(path=f"{PREFIX}/projects")


def console(
    *,
    store: Store,
    settings: Settings,
    notify: Callable[[], None],
    check_settings: SettingsCheck,
    history: HistoryLookup = unknown_history,
    limiter: RateLimiter | None = None,
) -> tuple[Console, list[ControllerRouterHandler]]:
    """The console's state and its route handlers (pages, static files, the home redirect)."""
    state = Console(
        store=store,
        settings=settings,
        notify=notify,
        check_settings=check_settings,
        throttle=SignInThrottle(),
        pre_sessions=PreSessions(),
        history=history,
        limiter=limiter,
    )
    handlers: dict[Any, Any] = {SignInRequired: sign_in_first, PgplaneError: error_page}
    pages = Router(
        path="/",
        route_handlers=[
            Auth,
            ApiKeysPage,
            ProjectsPage,
            BranchObjectsPage,
            SnapshotsPage,
            OperationsPage,
        ],
        before_request=session_hook(state),
        exception_handlers=handlers,
        include_in_schema=False,
    )
    static = create_static_files_router(
        path=f"{PREFIX}/static", directories=[HERE / "static"], include_in_schema=False
    )
    return state, [pages, static, home]

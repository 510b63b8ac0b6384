"""Bearer authentication, and what an authorised request may use.

A router-wide ``before_request`` hook authenticates every request before its parameters or body
are looked at (a bad body from a stranger is a 401, not a 400); routes then take
``ctx = authorized(request)``. Neither a framework dependency nor a guard: on the hottest route,
dependency injection cost a tenth of the throughput, and Litestar copies the route handler for
every guard call (a sixteenth).

The hook also applies the rate limits (``ratelimit.py``): an address that failed too often is
refused before its key is looked at, and an account's limits are counted once it is known, before
anything is read or written for the request.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

from litestar import Request
from litestar.datastructures import State

from pgplane.api.ratelimit import RateLimiter
from pgplane.config import Settings
from pgplane.errors import Unauthorized
from pgplane.services import api_keys
from pgplane.services.compute_settings import SettingsCheck
from pgplane.services.history import HistoryLookup
from pgplane.services.schemas import SchemaDumper
from pgplane.store import Store

AnyRequest = Request[Any, Any, State]


@dataclass(frozen=True, slots=True)
class Platform:
    """What the API is wired to; one per app."""

    store: Store
    settings: Settings
    notify: Callable[[], None]  # tells the engine that new operations wait
    check_settings: SettingsCheck  # Postgres' verdict on pg_settings values (the driver's)
    history: HistoryLookup  # what of a branch's history the data plane holds (the driver's)
    schema: SchemaDumper  # a branch database's schema as SQL (the driver's dump_schema)
    key_uses: api_keys.UseRecorder
    limiter: RateLimiter


@dataclass(frozen=True, slots=True)
class Authorized:
    """An authenticated request: the account every lookup is scoped to, and the platform."""

    account_id: str
    key_id: int
    store: Store
    settings: Settings
    notify: Callable[[], None]
    check_settings: SettingsCheck
    history: HistoryLookup
    schema: SchemaDumper


def _authorization(scope: dict[str, Any]) -> str:
    """The request's first Authorization header, read from the ASGI scope: Litestar's
    ``request.headers`` builds a case-insensitive multi-map of every header first, a tenth of
    the hook's cost, for one header whose name the server has already lowercased."""
    for name, value in scope["headers"]:
        if name == b"authorization":
            return cast("bytes", value).decode("latin-1")
    return ""


_MADE_MAX = 4096  # keys' Authorized kept; past it, all are made again

# Where the hook leaves its result: a key of our own in the ASGI scope (Litestar's
# ``request.state`` builds a wrapper object on every access).
_AUTHORIZED = "pgplane.authorized"


def key_hook(platform: Platform) -> Callable[[AnyRequest], Awaitable[None]]:
    """The ``before_request`` hook that authenticates against ``platform``."""
    store, settings, notify, key_uses, limiter = (
        platform.store,
        platform.settings,
        platform.notify,
        platform.key_uses,
        platform.limiter,
    )

    # Each key's Authorized, made once: it holds nothing a request changes, and a frozen
    # dataclass of eight fields is slow to build (each field set through object.__setattr__).
    made: dict[int, Authorized] = {}

    async def require_key(request: AnyRequest) -> None:
        """The caller behind the request's Bearer key; anything else is the same 401."""
        scope = cast("dict[str, Any]", request.scope)
        client = scope.get("client")
        address: str = client[0] if client else ""
        limiter.check_address(address)
        scheme, _, token = _authorization(scope).partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            limiter.failed(address)
            raise Unauthorized()
        async with store.read() as tx:
            key = await api_keys.authenticate(tx, value=token)
        if key is None:
            limiter.failed(address)
            raise Unauthorized()
        # Before the use is recorded: a refused request changes nothing, not even last_used_at.
        limiter.admit(key.account_id, scope["route_handler"])
        key_uses.record(key.id, address)
        ctx = made.get(key.id)
        if ctx is None or ctx.account_id != key.account_id:
            if len(made) >= _MADE_MAX:
                made.clear()
            ctx = made[key.id] = Authorized(
                account_id=key.account_id,
                key_id=key.id,
                store=store,
                settings=settings,
                notify=notify,
                check_settings=platform.check_settings,
                history=platform.history,
                schema=platform.schema,
            )
        scope[_AUTHORIZED] = ctx

    return require_key


def authorized(request: AnyRequest) -> Authorized:
    """What the hook established for this request."""
    ctx: Authorized = cast("dict[str, Any]", request.scope)[_AUTHORIZED]
    return ctx

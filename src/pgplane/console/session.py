"""Who is signed in to the console, and the checks every request passes before its page runs.

A router-wide ``before_request`` hook (as the API's key hook, and for the same reasons: no
dependency injection, no guards) reads the session cookie, and for every request that changes
something (any method but GET and HEAD) checks where it came from and its CSRF token: a form
posted by another site, or by a sibling origin (another port or subdomain of this site, which
could also set this host's cookies), is refused by its ``Origin`` and ``Sec-Fetch-Site``
headers; the token must be the session's for a signed-in page, and for the sign-in and sign-up
forms the one the server issued to the browser's pre-session (``console.presession``), so
nobody can sign a victim in to the attacker's account either. A request that fails is refused
before it reads anything.

Cookies are HttpOnly, SameSite=Lax, scoped to ``/console``, and Secure when the console is
served over TLS.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from litestar import Request, Response
from litestar.datastructures import Cookie, State

from pgplane.config import Settings
from pgplane.console.presession import PreSessions
from pgplane.core.gcra import Limit, address_key
from pgplane.core.models import ConsoleSession
from pgplane.errors import Forbidden, TooManyRequests
from pgplane.services import signin
from pgplane.services.compute_settings import SettingsCheck
from pgplane.services.history import HistoryLookup, unknown_history
from pgplane.store import Store

if TYPE_CHECKING:  # the api package imports the console: a type only
    from pgplane.api.ratelimit import RateLimiter

AnyRequest = Request[Any, Any, State]

PREFIX = "/console"
SESSION_COOKIE = "pgplane_session"
FORM_COOKIE = "pgplane_form"  # the pre-session id of the pages before sign-in
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "x-csrf-token"
_SAFE = frozenset({"GET", "HEAD"})
# What a browser's Sec-Fetch-Site says of a request another site, or a sibling origin of this
# one, made it send; "same-origin" and "none" (typed, bookmarked) are the console's own.
_FOREIGN_SITES = frozenset({"cross-site", "same-site"})
_DEFAULT_PORTS = {"http": ":80", "https": ":443"}
# Pages open to anyone; every other page needs a session.
_PUBLIC = frozenset({f"{PREFIX}/signin", f"{PREFIX}/signup"})
_SECOND = 1_000_000_000
WRONG_PASSWORDS_PER_MINUTE = 10


class SignInRequired(Exception):
    """No session: pages redirect to the sign-in form (see ``console.app``)."""


@dataclass(frozen=True, slots=True)
class Console:
    """What the console is wired to; one per app."""

    store: Store
    settings: Settings
    notify: Callable[[], None]
    check_settings: SettingsCheck
    throttle: SignInThrottle
    pre_sessions: PreSessions
    # What of a branch's history the data plane holds (the driver's), for forms naming a time.
    history: HistoryLookup = unknown_history
    limiter: RateLimiter | None = None  # the API's: one allowance per account


@dataclass(frozen=True, slots=True)
class SignedIn:
    """A request with a live session: every lookup is scoped to ``account_id``."""

    account_id: str
    email: str
    session: ConsoleSession
    console: Console


_SCOPE_KEY = "pgplane.console"


class SignInThrottle:
    """Wrong passwords per address and per email: a minute's allowance, then refusals until it
    refills. Only failures count, as the API's and the proxy's throttles."""

    def __init__(self, per_minute: int = WRONG_PASSWORDS_PER_MINUTE) -> None:
        self._limit = Limit(per_second=per_minute / 60, burst=per_minute)

    def check(self, address: str, email: str) -> None:
        now = time.monotonic_ns()
        wait = max(
            self._limit.wait(("address", address_key(address)), now),
            self._limit.wait(("email", email), now),
        )
        if wait:
            seconds = max(1, -(-wait // _SECOND))
            raise TooManyRequests(
                f"too many wrong passwords: try again in {seconds} s",
                headers={"Retry-After": str(seconds)},
            )

    def failed(self, address: str, email: str) -> None:
        now = time.monotonic_ns()
        self._limit.take(("address", address_key(address)), now)
        self._limit.take(("email", email), now)


def client_address(request: AnyRequest) -> str:
    client = cast("dict[str, Any]", request.scope).get("client")
    return str(client[0]) if client else ""


def session_hook(console: Console) -> Callable[[AnyRequest], Awaitable[None]]:
    async def check(request: AnyRequest) -> None:
        scope = cast("dict[str, Any]", request.scope)
        if request.method not in _SAFE:
            _check_origin(request)  # before anything is read: it needs nothing but the headers
        token = request.cookies.get(SESSION_COOKIE, "")
        current = None
        email = ""
        if token:
            async with console.store.read() as tx:
                current = await signin.session(tx, token)
                account = None if current is None else await tx.get_account(current.account_id)
            email = account.email if account else ""
        public = request.url.path in _PUBLIC
        if current is None and not public:
            raise SignInRequired()
        if current is not None and console.limiter is not None:
            # The account's API allowance (every key's, every session's): pages are requests
            # too, each a few reads of the store, and a refused one changes nothing.
            console.limiter.admit(current.account_id, scope["route_handler"])
        if request.method not in _SAFE:
            sent = await _sent_token(request)
            if current is not None:
                ok = bool(sent) and signin.same(sent, current.csrf_token)
            else:
                pre_session = request.cookies.get(FORM_COOKIE, "")
                ok = console.pre_sessions.accepts(pre_session, sent)
            if not ok:
                raise Forbidden("the form has expired or did not come from this console: reload it")
        if current is not None:
            scope[_SCOPE_KEY] = SignedIn(
                account_id=current.account_id, email=email, session=current, console=console
            )

    return check


def _check_origin(request: AnyRequest) -> None:
    """Refuse a request another site or a sibling origin made the browser send.

    Browsers send ``Origin`` with every POST and ``Sec-Fetch-Site`` with every request; a client
    that sends neither (curl, an old browser) is left to the CSRF token alone.
    """
    site = request.headers.get("sec-fetch-site", "").strip().lower()
    origin = request.headers.get("origin")
    if site in _FOREIGN_SITES or (origin is not None and not _own_origin(request, origin)):
        raise Forbidden(
            "the form did not come from this console: open the console and use it there"
        )


def _own_origin(request: AnyRequest, origin: str) -> bool:
    """Whether ``origin`` is the console's: the host and port the request was sent to, over the
    same scheme, or over https when the console hears http (``serve`` speaks plain HTTP, so a
    TLS-terminating proxy in front of it is the usual way to serve it over https). ``null`` (a
    sandboxed frame, a redirect from elsewhere) is no origin of ours."""
    scheme, sep, host = origin.strip().lower().partition("://")
    own_scheme = request.url.scheme
    if not sep or scheme not in _DEFAULT_PORTS:
        return False
    if scheme != own_scheme and not (scheme == "https" and own_scheme == "http"):
        return False
    own_host = request.url.netloc.lower()
    return host.removesuffix(_DEFAULT_PORTS[scheme]) == own_host.removesuffix(
        _DEFAULT_PORTS.get(own_scheme, "")
    )


async def _sent_token(request: AnyRequest) -> str:
    sent = request.headers.get(CSRF_HEADER, "")
    if not sent and request.headers.get("content-type", "").startswith(
        "application/x-www-form-urlencoded"
    ):
        form = await request.form()
        sent = str(form.get(CSRF_FIELD, ""))
    return sent


def signed_in(request: AnyRequest) -> SignedIn:
    found: SignedIn = cast("dict[str, Any]", request.scope)[_SCOPE_KEY]
    return found


def maybe_signed_in(request: AnyRequest) -> SignedIn | None:
    found: SignedIn | None = cast("dict[str, Any]", request.scope).get(_SCOPE_KEY)
    return found


def cookie(request: AnyRequest, name: str, value: str, *, max_age: int | None) -> Cookie:
    return Cookie(
        key=name,
        value=value,
        path=PREFIX,
        httponly=True,
        samesite="lax",
        secure=request.url.scheme == "https",
        max_age=max_age,
    )


def form_token(request: AnyRequest, pre_sessions: PreSessions) -> tuple[str, Cookie | None]:
    """The token for a form shown before sign-in, and the cookie naming its pre-session when
    the browser had none the server still holds."""
    issued = pre_sessions.issue(request.cookies.get(FORM_COOKIE, ""))
    new = cookie(request, FORM_COOKIE, issued.id, max_age=None) if issued.fresh else None
    return issued.token, new


def with_cookies(response: Response[Any], cookies: list[Cookie | None]) -> Response[Any]:
    for c in cookies:
        if c is not None:
            response.set_cookie(c)
    return response

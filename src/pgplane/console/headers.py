"""What every console response says about framing and caching.

No console response may be framed by another page (clickjacking: the console in an invisible
frame over the attacker's page, a click on "Revoke" taken for a click on theirs), so everything
under ``/console`` (pages, redirects, error pages, static files, unknown paths) carries a
Content-Security-Policy with ``frame-ancestors 'none'`` and, for browsers that predate it,
``X-Frame-Options: DENY``. Everything but the static files is ``no-store``: pages hold an
account's objects or a CSRF token, and neither a shared cache nor the back button after sign-out
should show them again.

An app-wide ``before_send`` hook rather than the console router's ``after_request``: that hook
would miss what exception handlers and Litestar's own 404 and 405 answer. A coroutine function,
though it never awaits: Litestar runs a plain function given as a hook in a thread, for every
message of every response (two per request, the API's too), and those hops to the thread pool
and back cost the API more than half its throughput.
"""

from __future__ import annotations

from litestar.datastructures import MutableScopeHeaders
from litestar.enums import ScopeType
from litestar.types import Message, Scope

from pgplane.console.session import PREFIX

FRAME_ANCESTORS = "frame-ancestors 'none'"
_CSP = "Content-Security-Policy"
_STATIC = f"{PREFIX}/static/"


async def console_headers(message: Message, scope: Scope) -> None:
    """Add the console's framing and caching headers to a response under ``/console`` (and the
    bare ``/``, which redirects there)."""
    if message["type"] != "http.response.start" or scope["type"] != ScopeType.HTTP:
        return
    path = scope["path"]
    if path not in ("/", PREFIX) and not path.startswith(f"{PREFIX}/"):
        return
    headers = MutableScopeHeaders.from_message(message)
    # A policy a response already has keeps its other directives: each gets the directive.
    policies = headers.getall(_CSP, [])
    del headers[_CSP]
    for policy in policies or [""]:
        headers.add(_CSP, _with_frame_ancestors(policy))
    headers["X-Frame-Options"] = "DENY"
    if not path.startswith(_STATIC):
        headers["Cache-Control"] = "no-store"


def _with_frame_ancestors(policy: str) -> str:
    kept = [
        directive.strip()
        for directive in policy.split(";")
        if directive.strip() and directive.split()[0].lower() != "frame-ancestors"
    ]
    return "; ".join([*kept, FRAME_ANCESTORS])

"""Neon's ``endpoint=<id>;<password>``: the endpoint named in the password itself.

A client that can send neither SNI (an old TLS library, a connection by address) nor
``options`` (some drivers and GUI tools) can still name its endpoint: it gives
``endpoint=ep-…;<password>`` as its password (``project=`` for ``endpoint=``, ``$`` for ``;``,
as Neon takes it). The proxy then asks for the password in clear
(AuthenticationCleartextPassword), routes by the endpoint it names, and checks the rest as SCRAM
checks a password (:func:`pgplane.proxy.login.check_cleartext`), with the walls of the SCRAM
path in the same order: the allow-list before the password, the wrong-password throttle, and
nothing woken until the password is proven.

Only over TLS: on a plaintext connection the password would cross the network as it is, so the
proxy does not ask for it there (SCRAM never sends it). An endpoint that does not exist fails as
a wrong password does, after the same work: with the password the endpoint is part of the
secret, and another account's endpoint must not answer otherwise than a made-up one.
"""

from __future__ import annotations

import re

from pgplane.proxy import scram, wire
from pgplane.proxy.framing import MAX_AUTH_FRAME
from pgplane.proxy.login import check_cleartext
from pgplane.proxy.pipe import Side
from pgplane.proxy.seam import Computes, Route, UnknownEndpoint
from pgplane.proxy.throttle import LoginThrottle

_FORM = re.compile(rb"(?:endpoint|project)=([A-Za-z0-9-]{1,63})[;$]", re.DOTALL)


def parse(password: bytes) -> tuple[str, str] | None:
    """The endpoint and the password of ``endpoint=<id>;<password>``; None if it is not that.

    The id holds neither separator, so the first one ends it: the password may hold either.
    """
    match = _FORM.match(password)
    if match is None:
        return None
    try:
        secret = password[match.end() :].decode()
    except UnicodeDecodeError:
        return None
    endpoint = match.group(1).decode().lower().removesuffix("-pooler")
    return endpoint, secret


async def ask(client: Side) -> bytes:
    """Ask the client for its password in clear and return it (without its terminator)."""
    client.write(wire.auth_message(wire.AUTH_CLEARTEXT))
    kind, payload = await client.read_frame(limit=MAX_AUTH_FRAME)
    if kind != b"p" or not payload.endswith(b"\0") or b"\0" in payload[:-1]:
        raise wire.ProtocolViolation("expected a password message")
    return payload[:-1]


async def authenticate(
    client: Side, user: str, endpoint_id: str, password: str, *,
    computes: Computes, throttle: LoginThrottle,
) -> Route:  # fmt: skip
    """Route to ``endpoint_id`` (the allow-list first) and check ``password`` there; the
    route, or ScramError (RouteError for a refused address, a throttled one, a disabled
    endpoint)."""
    host = client.peer_address()
    try:
        route: Route | None = await computes.route(endpoint_id, user, client=host)
    except UnknownEndpoint:
        route = None
    await throttle.admit(endpoint_id, host)
    failed = scram.ScramError(
        f'password authentication failed for user "{user}"'
        f" (or endpoint {endpoint_id} does not exist)"
    )
    try:
        await check_cleartext(user, None if route is None else route.secret, password)
    except scram.ScramError:
        throttle.failed(endpoint_id, host)
        raise failed from None
    if route is None:  # the mock verifier takes no password: never reached
        raise failed
    return route

"""The two logins of a proxied connection: the client's to the proxy, the proxy's to a compute.

The client proves its role's password to the proxy with SCRAM (channel binding included): the
proxy checks it against the platform's password or the verifier synced from the compute, and a
role nobody created gets the same exchange and the same refusal as a wrong password. Only then is
anything woken. The proxy then logs in to the compute over its private unix socket, which the
compute trusts (DESIGN §6); a compute that still asks for a password (one started before its
trust rule, or reached over TCP) gets it, with key derivation capped and off the event loop.
"""

from __future__ import annotations

import asyncio
import struct

from pgplane.proxy import scram, wire
from pgplane.proxy.framing import MAX_AUTH_FRAME, frame
from pgplane.proxy.pipe import Side
from pgplane.proxy.seam import Password, Secret

# A compute's refusals while the proxy logs a client in that mean "this compute is not up now",
# not "no": it is starting, or stopping (a stop that began after the dial ends the login with
# 57P01). The client waits for the start that follows, as one that arrived a moment later would.
_NOT_UP = frozenset({wire.CANNOT_CONNECT_NOW, wire.ADMIN_SHUTDOWN, wire.CRASH_SHUTDOWN})
# What a compute may send before ReadyForQuery (parameter statuses, a cancel key, notices).
_MAX_REPLY = 1 << 20


class NotReady(Exception):
    """The compute answered "starting up" or "shutting down", or ended the login because it is
    going down: wake it and try again."""


async def _password_message(client: Side) -> bytes:
    kind, payload = await client.read_frame(limit=MAX_AUTH_FRAME)
    if kind != b"p":
        raise wire.ProtocolViolation("expected a SASL response")
    return payload


async def authenticate(
    client: Side, user: str, secret: Secret | None, cert_hash: bytes | None
) -> None:
    """SCRAM with the client, up to (not including) AuthenticationOk; ScramError if not.

    ``cert_hash`` is the TLS certificate's hash when the client is on TLS (channel binding).
    """
    if isinstance(secret, Password):
        verifier = await scram.password_verifier(secret.password)
    elif secret is not None:
        verifier = secret.verifier
    else:
        verifier = scram.mock_verifier(user)
    exchange = scram.ServerExchange(verifier, cert_hash)
    offer = b"".join(m.encode() + b"\0" for m in exchange.mechanisms()) + b"\0"
    client.write(wire.auth_message(wire.AUTH_SASL, offer))
    mechanism, first = wire.parse_sasl_initial(await _password_message(client))
    server_first = exchange.first(mechanism, first)
    client.write(wire.auth_message(wire.AUTH_SASL_CONTINUE, server_first.encode()))
    try:
        # For a role nobody created the mock verifier's keys are random: no proof matches.
        final = exchange.final((await _password_message(client)).decode())
    except scram.ScramError as exc:
        if str(exc) == "password authentication failed":
            raise scram.ScramError(f'password authentication failed for user "{user}"') from None
        raise
    except UnicodeDecodeError:
        raise scram.ScramError("malformed SCRAM message") from None
    client.write(wire.auth_message(wire.AUTH_SASL_FINAL, final.encode()))


async def check_cleartext(user: str, secret: Secret | None, password: str) -> None:
    """A password the client sent itself (AuthenticationCleartextPassword on a WebSocket, an
    ``endpoint=<id>;<password>`` password, ``/sql``), checked as SCRAM checks it; ScramError if
    not. A role nobody created fails as a wrong password does, after the same work."""
    # Always through a verifier, so a wrong password costs the same work for every role.
    if isinstance(secret, Password):
        verifier = await scram.password_verifier(secret.password)
    else:
        verifier = secret.verifier if secret is not None else scram.mock_verifier(user)
    # PBKDF2 runs once per password and salt, in a thread; a password whose keys were derived
    # already (every request of a pooled /sql client after its first) is checked here, without
    # a trip through the thread pool that would cost more than the check itself.
    ok = scram.check_password_derived(verifier, password)
    if ok is None:
        ok = await asyncio.to_thread(scram.check_password, verifier, password)
    if not ok:
        raise scram.ScramError(f'password authentication failed for user "{user}"')


async def log_in(compute: Side, startup: wire.Startup, secret: Secret) -> bytes:
    """Start the session on the compute; return its replies from AuthenticationOk to
    ReadyForQuery, or Postgres' own refusal, for the client.

    The replies are held up to ReadyForQuery: until then the backend is still starting, and a
    stop can end it (57P01); the client should wait for the next start, not be told so.
    """
    compute.write(startup.encode())
    password = secret.password if isinstance(secret, Password) else None
    exchange = scram.ClientExchange(password) if password is not None else None
    reply = b""
    logged_in = False
    while True:
        kind, payload = await compute.read_frame(limit=MAX_AUTH_FRAME)
        message = frame(kind, payload)
        if kind == b"E":
            fields = wire.error_fields(payload)
            if fields.get("C") in _NOT_UP:
                raise NotReady(fields.get("M", "compute not ready"))
            return reply + message  # the client sees Postgres' own refusal
        if logged_in or kind != b"R":
            # The session's parameters and cancel key, or a NegotiateProtocolVersion before
            # authentication: the client's to read.
            reply += message
            if len(reply) > _MAX_REPLY:
                raise scram.ScramError("the compute sent too much before the session was ready")
            if kind == b"Z":
                return reply
            continue
        (code,) = struct.unpack("!I", payload[:4])
        if code == wire.AUTH_OK:
            reply += message
            logged_in = True
        elif exchange is None or password is None:
            raise scram.ScramError(
                "the compute asked for a password the platform does not hold; retry after"
                " the compute restarts"
            )
        else:
            await _answer(compute, exchange, password, code, payload[4:])


async def _answer(
    compute: Side, exchange: scram.ClientExchange, password: str, code: int, data: bytes
) -> None:
    """Answer the compute's authentication request ``code`` as the role."""
    if code == wire.AUTH_SASL:
        compute.write(wire.sasl_initial(scram.MECHANISM, exchange.first().encode()))
    elif code == wire.AUTH_SASL_CONTINUE:
        # PBKDF2 at the compute's count, refused above the cap, never on the event loop.
        final = await asyncio.to_thread(exchange.final, data.decode())
        compute.write(wire.password_message(final.encode()))
    elif code == wire.AUTH_SASL_FINAL:
        exchange.check(data.decode())
    elif code == wire.AUTH_CLEARTEXT:
        compute.write(wire.password_message(password.encode() + b"\0"))
    else:
        raise scram.ScramError(f"the compute asked for unsupported authentication {code}")

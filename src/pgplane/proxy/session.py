"""The steps every door shares once it has a client's StartupMessage: route, authenticate, wake,
log in, pipe.

A door (Postgres over TCP or TLS, a WebSocket) hands :meth:`Sessions.serve` the client, as a
:class:`~pgplane.proxy.pipe.Side`, and a :class:`Hello`: how to read its first packet, the
endpoint its transport names (SNI, ``Host``) and how its password is asked for. From there every
door is held to the same walls: the allow-list is checked with the endpoint, before the password
is asked for; wrong passwords are throttled per endpoint and address; nothing wakes before the
password is proven; the handshake has one deadline.

A compute that answers "starting up" / "shutting down", ends the login because it is going down,
or cannot be reached at all, is woken and tried again: a client arriving while its compute
suspends waits for the start that follows.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from pgplane.core import clock
from pgplane.core.ipallow import AllowList
from pgplane.nodelink.client import Unreachable
from pgplane.proxy import endpoint_password, scram, wire
from pgplane.proxy.activity import Activity
from pgplane.proxy.connect import Connector
from pgplane.proxy.forward import Forwarder
from pgplane.proxy.framing import MAX_AUTH_FRAME, FrameError, KeySniffer
from pgplane.proxy.login import authenticate, check_cleartext
from pgplane.proxy.pipe import Closed, Side, tcp_activity
from pgplane.proxy.seam import Computes, Route, RouteError, Target, UnknownEndpoint
from pgplane.proxy.throttle import LoginThrottle

log = logging.getLogger(__name__)

# neonctl's --parent takes a branch or a time or an LSN, never both (a time or LSN branches from
# the default branch); another branch's past is the API's parent_id with parent_timestamp/_lsn.
POINT_IN_TIME_REFUSED = (
    "connecting to a branch as it was at a point in time is not offered here: create a branch"
    " at that point (neonctl branches create --parent <timestamp or LSN>, from the default"
    " branch; or the API's parent_id with parent_timestamp or parent_lsn) and connect to it"
)


@dataclass(frozen=True, slots=True)
class Startup:
    """What a door read of a client before its password: the StartupMessage and where it came
    from."""

    startup: wire.Startup
    endpoint: str | None  # named by the door's transport (SNI, Host), before options=endpoint=
    fallback: str | None = None  # named where nothing else does (a WebSocket's address=)
    # SCRAM channel binding data when the client is on the proxy's TLS; None on plaintext.
    cert_hash: bytes | None = None
    # Ask for the password in clear (a WebSocket: the layer below is TLS, or the user chose
    # ws://; the driver pipelines a cleartext password); else SCRAM.
    cleartext: bool = False


# Reads a client's first packet: its Startup, or None when there is no session to start (a
# cancel request, served already).
Hello = Callable[[], Awaitable[Startup | None]]


class Sessions:
    def __init__(
        self,
        *,
        computes: Computes,
        activity: Activity,
        proxy_host: str,
        throttle: LoginThrottle,
        handshake_timeout: float,
        forwarder: Forwarder | None = None,
    ) -> None:
        self._computes = computes
        self._connector = Connector(computes, forwarder)
        self.activity = activity  # sessions' activity, which idle suspend reads
        self.proxy_host = proxy_host
        self._throttle = throttle
        self.handshake_timeout = handshake_timeout
        # A session's cancel key: its compute, and the allow-list its login passed.
        self._cancel_keys: dict[tuple[int, bytes], tuple[Target, AllowList]] = {}

    async def serve(self, client: Side, hello: Hello, *, deadline: float | None) -> None:
        """Serve one client from its first packet to its end; the handshake (everything up to
        an authenticated login) ends by ``deadline`` (loop time) or the client is dropped."""
        compute: Side | None = None
        refusal: bytes | None = None
        try:
            async with asyncio.timeout_at(deadline):
                first = await hello()
                if first is None:
                    return
                _refuse_point_in_time(first.startup)
                option_endpoint, startup = wire.take_endpoint_option(first.startup)
                named = first.endpoint or option_endpoint or first.fallback
                user = startup.params["user"]
                if named is None:
                    endpoint_id, route = await self._by_password(client, user, first)
                else:
                    endpoint_id = named
                    # Throttled before the route, which may ask the compute of the role.
                    await self._throttle.admit(endpoint_id, client.peer_address())
                    route = await self._route(endpoint_id, user, client.peer_address())
                    await self._authenticate(client, endpoint_id, user, route, first)
            # Not under the handshake's time limit: a wake (or a reattach before it) takes as
            # long as it takes, and ends in a compute or an error the client is told.
            compute, target, reply = await self._connector.open(endpoint_id, startup, route)
            cancel_to = (target, route.allowed)
            await self.pipe(
                client, compute, cancel_to=cancel_to, endpoint_id=endpoint_id, reply=reply
            )
        except RouteError as exc:
            refusal = wire.error_response(exc.code, exc.message, severity=exc.severity)
        except scram.ScramError as exc:
            said = str(exc)
            refusal = wire.error_response(wire.INVALID_PASSWORD, said, hint=wire.hint_for(said))
        except (wire.ProtocolViolation, FrameError) as exc:
            refusal = wire.error_response(wire.PROTOCOL_VIOLATION, str(exc))
        except (Closed, ConnectionError, ssl.SSLError, TimeoutError):
            pass
        except Exception:
            log.exception("proxy connection failed")
            refusal = wire.error_response(wire.CONNECTION_FAILURE, "internal proxy error")
        finally:
            if compute is not None:
                compute.close()
            if refusal is None:
                client.close()
        if refusal is not None:
            client.write(refusal)
            await client.close_after_reply()

    async def open_with_password(
        self, endpoint_id: str, startup: wire.Startup, password: str, *, peer: str
    ) -> tuple[Side, bytes]:
        """For a door whose client hands its password over with its request (SQL over HTTP):
        the steps :meth:`serve` takes, in its order (the allow-list with the endpoint, the
        throttle, the password, and only then a wake), returning the compute's connection,
        logged in as ``startup``'s user, and the compute's replies up to ReadyForQuery, or
        Postgres' own refusal (an ErrorResponse last: a database that does not exist, say).

        RouteError (AddressNotAllowed among them) or ScramError when :meth:`serve` would refuse
        a Postgres client; the caller closes the connection it gets. Activity for idle suspend
        is the caller's to record (:attr:`activity`), while it uses the connection.
        """
        route = await self.check_password(endpoint_id, startup.params["user"], password, peer=peer)
        compute, _target, reply = await self.open(endpoint_id, startup, route)
        return compute, reply

    async def check_password(
        self, endpoint_id: str, user: str, password: str, *, peer: str
    ) -> Route:
        """The first half of :meth:`open_with_password`, for a door that checks every request
        but keeps compute connections between them (SQL over HTTP's pool): the route, the
        allow-list, the throttle and the password; nothing is woken."""
        await self._throttle.admit(endpoint_id, peer)  # before the route: it may ask the compute
        route = await self._route(endpoint_id, user, peer)
        try:
            await check_cleartext(user, route.secret, password)
        except scram.ScramError:
            self._throttle.failed(endpoint_id, peer)
            raise
        return route

    async def open(
        self, endpoint_id: str, startup: wire.Startup, route: Route
    ) -> tuple[Side, Target, bytes]:
        """The second half: a compute connection for a route whose password was proven,
        through a wake if the compute sleeps (:meth:`Connector.open`)."""
        return await self._connector.open(endpoint_id, startup, route)

    async def cancel_on(self, target: Target, pid: int, key: bytes) -> None:
        """A CancelRequest for the session ``pid`` (its ``key``) on the compute of ``target``,
        through its node when another; OSError (or Unreachable, RouteError) if not sent."""
        await self._connector.cancel(target, pid, key)

    async def _route(self, endpoint_id: str, user: str, peer: str) -> Route:
        """The endpoint's route; for one that does not exist, a route no password opens.

        An endpoint nobody has then fails as a wrong password does, after the same exchange
        and throttled the same way: another account's endpoint, where a stranger's password is
        wrong too, must not answer otherwise than a made-up one.
        """
        try:
            return await self._computes.route(endpoint_id, user, client=peer)
        except UnknownEndpoint:
            return Route(secret=None, target=None)

    async def _authenticate(
        self, client: Side, endpoint_id: str, user: str, route: Route, first: Startup
    ) -> None:
        host = client.peer_address()
        await self._throttle.admit(endpoint_id, host)
        try:
            if first.cleartext:
                client.write(wire.auth_message(wire.AUTH_CLEARTEXT))
                await check_cleartext(user, route.secret, await _cleartext_password(client))
            else:
                await authenticate(client, user, route.secret, first.cert_hash)
        except scram.ScramError:
            self._throttle.failed(endpoint_id, host)
            raise

    async def pipe(
        self,
        client: Side,
        compute: Side,
        *,
        cancel_to: tuple[Target, AllowList],
        endpoint_id: str,
        reply: bytes,
        first: bytes | None = None,
    ) -> None:
        """Pipe a logged-in session until either side ends, counted as the endpoint's activity,
        its cancel key kept; ``first`` (``reply`` unless given) is written to the client first."""
        session = self.activity.open(endpoint_id, clock.now_us())
        keys: list[tuple[int, bytes]] = []
        try:
            client.write(reply if first is None else first)

            def found(pid: int, key: bytes) -> None:
                keys.append((pid, key))
                self._cancel_keys[pid, key] = cancel_to

            # The reply holds the cancel key already (the proxy logged in up to ReadyForQuery);
            # the sniffer reads it from there.
            sniffer = KeySniffer(found)
            sniffed = sniffer(reply)
            # Activity read off the client's connection: the pipe need not count its chunks.
            session.kernel = tcp_activity(client.transport)
            compute.pipe_to(client, session, None if sniffed else sniffer)
            client.pipe_to(compute, session)
            await asyncio.wait([client.lost, compute.lost], return_when="FIRST_COMPLETED")
        finally:
            self.activity.close(session, clock.now_us())
            for k in keys:
                self._cancel_keys.pop(k, None)

    async def _by_password(self, client: Side, user: str, first: Startup) -> tuple[str, Route]:
        """A client that named no endpoint: Neon's endpoint=<id>;<password>, on the Postgres
        door over TLS only (:mod:`pgplane.proxy.endpoint_password`)."""
        unnamed = RouteError(
            wire.CONNECTION_REJECTED,
            f"endpoint not specified: connect to ep-<id>.{self.proxy_host} (TLS with SNI),"
            " pass options=endpoint=<id> as in the connection URI the API returns, or give"
            " endpoint=<id>;<password> as the password (over TLS only)",
        )
        if first.cert_hash is None or first.cleartext:
            raise unnamed  # never ask for a password in clear on a plaintext connection
        named = endpoint_password.parse(await endpoint_password.ask(client))
        if named is None:
            raise unnamed
        endpoint_id, password = named
        route = await endpoint_password.authenticate(
            client, user, endpoint_id, password, computes=self._computes, throttle=self._throttle
        )
        return endpoint_id, route

    async def cancel(self, pid: int, key: bytes, client: str) -> None:
        found = self._cancel_keys.get((pid, key))
        # As Neon's proxy, a cancel request from an address off the session's allow-list is
        # dropped; as Postgres, there is no answer either way.
        if found is None or not found[1].allows(client):
            return
        await self._send_cancel(found[0], pid, key)

    async def cancel_forwarded(self, pid: int, key: bytes) -> None:
        """A cancel request another node passed on, for a session piped here; that node checked
        the client's address against the allow-list (a wrong key finds nothing)."""
        found = self._cancel_keys.get((pid, key))
        if found is not None:
            await self._send_cancel(found[0], pid, key)

    async def _send_cancel(self, target: Target, pid: int, key: bytes) -> None:
        try:
            await self._connector.cancel(target, pid, key)
        except (OSError, Closed, Unreachable, RouteError) as exc:
            log.info("cancel request for endpoint %s not sent: %s", target.endpoint_id, exc)


async def _cleartext_password(client: Side) -> str:
    kind, payload = await client.read_frame(limit=MAX_AUTH_FRAME)
    if kind != b"p" or not payload.endswith(b"\0"):
        raise wire.ProtocolViolation("expected a password message")
    try:
        return payload[:-1].decode()
    except UnicodeDecodeError:
        raise scram.ScramError("password authentication failed") from None


def _refuse_point_in_time(startup: wire.Startup) -> None:
    if wire.asks_point_in_time(startup):
        raise RouteError(wire.FEATURE_NOT_SUPPORTED, POINT_IN_TIME_REFUSED)

"""The proxy: one listener for every endpoint; accept, route, authenticate, wake, log in, pipe.

For each client: answer SSLRequest (TLS, with the SNI name kept), read the StartupMessage, find
the endpoint (SNI ``ep-….<proxy_host>`` or ``options=endpoint=ep-…``), authenticate the role
itself (:mod:`pgplane.proxy.login`) before anything is woken, ask the platform for a running
compute (waking it if needed), log in there as the same role, then forward bytes both ways
without parsing them (:mod:`pgplane.proxy.pipe`).

Before a client is authenticated it can make the proxy do little: its bytes are bounded, its
handshake has a deadline, its wrong passwords are throttled per endpoint and address, and it
never causes a wake, a reattach or a key derivation at a cost someone else chose. A client whose
address the project's IP allow-list does not take gets no further than the route: it is refused
before it is asked for a password, and nothing counts it (no throttle, no activity).

A compute that answers "starting up" / "shutting down", ends the login because it is going down,
or cannot be reached at all, is woken and tried again: a client arriving while its compute
suspends waits for the start that follows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
import struct
from pathlib import Path
from socket import SO_PEERCRED, SOL_SOCKET

from pgplane.connlimits import ConnectionGate
from pgplane.core import clock
from pgplane.core.ipallow import AllowList
from pgplane.proxy import endpoint_password, scram, wire
from pgplane.proxy.activity import Activity
from pgplane.proxy.framing import FrameError, KeySniffer
from pgplane.proxy.login import NotReady, authenticate, log_in
from pgplane.proxy.pipe import Closed, Side
from pgplane.proxy.seam import Computes, Route, RouteError, Target
from pgplane.proxy.throttle import LoginThrottle

log = logging.getLogger(__name__)

# neonctl's --parent takes a branch or a time or an LSN, never both (a time or LSN branches from
# the default branch); another branch's past is the API's parent_id with parent_timestamp/_lsn.
POINT_IN_TIME_REFUSED = (
    "connecting to a branch as it was at a point in time is not offered here: create a branch"
    " at that point (neonctl branches create --parent <timestamp or LSN>, from the default"
    " branch; or the API's parent_id with parent_timestamp or parent_lsn) and connect to it"
)

_HANDSHAKE_TIMEOUT = 30.0
_CONNECT_ATTEMPTS = 5


class Proxy:
    def __init__(
        self,
        *,
        computes: Computes,
        activity: Activity,
        proxy_host: str,
        server_tls: ssl.SSLContext | None,
        cert_hash: bytes | None,
        throttle: LoginThrottle | None = None,
        gate: ConnectionGate | None = None,
        handshake_timeout: float = _HANDSHAKE_TIMEOUT,
    ) -> None:
        self._computes = computes
        self._gate = gate or ConnectionGate(per_address=0, total=0)
        self._handshake_timeout = handshake_timeout
        self._activity = activity
        self._proxy_host = proxy_host
        self._server_tls = server_tls
        self._cert_hash = cert_hash
        self._throttle = throttle or LoginThrottle()
        # A session's cancel key: its compute, and the allow-list its login passed.
        self._cancel_keys: dict[tuple[int, bytes], tuple[Target, AllowList]] = {}
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        if server_tls is not None and server_tls.sni_callback is None:
            server_tls.sni_callback = _remember_sni  # tls.server_context's keeps the name too

    async def start(self, host: str, port: int) -> list[tuple[str, int]]:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._accept, host, port, reuse_address=True)
        return [s.getsockname()[:2] for s in self._server.sockets]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _accept(self) -> Side:
        side = Side()
        task = asyncio.get_running_loop().create_task(self._serve(side))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return side

    async def _serve(self, client: Side) -> None:
        # Past the caps a client is told so, as Postgres tells it (53300), before a byte of it
        # is read, and closed.
        await client.made
        admission = self._gate.admit(client.peer_address() or None)
        if admission is None:
            message = self._gate.refusal_message()
            client.write(wire.error_response(wire.TOO_MANY_CONNECTIONS, message))
            client.close()
            return
        try:
            await self._serve_admitted(client)
        finally:
            admission.release()

    async def _serve_admitted(self, client: Side) -> None:
        compute: Side | None = None
        try:
            async with asyncio.timeout(self._handshake_timeout or None):
                first = await self._first_packet(client)
                if first is None:
                    return
                startup, server_name, tls = first
                _refuse_point_in_time(startup)
                endpoint_id = wire.endpoint_from_sni(server_name, self._proxy_host)
                option_endpoint, startup = wire.take_endpoint_option(startup)
                endpoint_id = endpoint_id or option_endpoint
                user = startup.params["user"]
                if endpoint_id is None:
                    endpoint_id, route = await self._by_password(client, user, tls)
                else:
                    host = client.peer_address()
                    route = await self._computes.route(endpoint_id, user, client=host)
                    await self._authenticate(client, endpoint_id, user, route, tls)
            # Not under the handshake's time limit: a wake (or a reattach before it) takes as
            # long as it takes, and ends in a compute or an error the client is told.
            compute, target, reply = await self._open_compute(endpoint_id, startup, route)
            await self._pipe(client, compute, (target, route.allowed), endpoint_id, reply)
        except RouteError as exc:
            client.write(wire.error_response(exc.code, exc.message, severity=exc.severity))
        except scram.ScramError as exc:
            client.write(wire.error_response(wire.INVALID_PASSWORD, str(exc)))
        except wire.ProtocolViolation as exc:
            client.write(wire.error_response(wire.PROTOCOL_VIOLATION, str(exc)))
        except FrameError as exc:
            client.write(wire.error_response(wire.PROTOCOL_VIOLATION, str(exc)))
        except (Closed, ConnectionError, ssl.SSLError, TimeoutError):
            pass
        except Exception:
            log.exception("proxy connection failed")
            client.write(wire.error_response(wire.CONNECTION_FAILURE, "internal proxy error"))
        finally:
            client.close()
            if compute is not None:
                compute.close()

    async def _authenticate(
        self, client: Side, endpoint_id: str, user: str, route: Route, tls: bool
    ) -> None:
        host = client.peer_address()
        self._throttle.check(endpoint_id, host)
        try:
            binding = _channel_binding(client, self._cert_hash) if tls else None
            await authenticate(client, user, route.secret, binding)
        except scram.ScramError:
            self._throttle.failed(endpoint_id, host)
            raise

    async def _pipe(
        self,
        client: Side,
        compute: Side,
        cancel_to: tuple[Target, AllowList],
        endpoint_id: str,
        reply: bytes,
    ) -> None:
        session = self._activity.open(endpoint_id, clock.now_us())
        keys: list[tuple[int, bytes]] = []
        try:
            client.write(reply)

            def found(pid: int, key: bytes) -> None:
                keys.append((pid, key))
                self._cancel_keys[pid, key] = cancel_to

            # The reply holds the cancel key already (the proxy logged in up to ReadyForQuery);
            # the sniffer reads it from there.
            sniffer = KeySniffer(found)
            compute.pipe_to(client, session, None if sniffer(reply) else sniffer)
            client.pipe_to(compute, session)
            await asyncio.wait([client.lost, compute.lost], return_when="FIRST_COMPLETED")
        finally:
            self._activity.close(session, clock.now_us())
            for k in keys:
                self._cancel_keys.pop(k, None)

    async def _by_password(self, client: Side, user: str, tls: bool) -> tuple[str, Route]:
        """A client that named no endpoint: Neon's endpoint=<id>;<password>, over TLS only."""
        unnamed = RouteError(
            wire.CONNECTION_REJECTED,
            f"endpoint not specified: connect to ep-<id>.{self._proxy_host} (TLS with SNI),"
            " pass options=endpoint=<id> as in the connection URI the API returns, or give"
            " endpoint=<id>;<password> as the password (over TLS only)",
        )
        if not tls:
            raise unnamed  # never ask for a password in clear on a plaintext connection
        named = endpoint_password.parse(await endpoint_password.ask(client))
        if named is None:
            raise unnamed
        endpoint_id, password = named
        route = await endpoint_password.authenticate(
            client, user, endpoint_id, password, computes=self._computes, throttle=self._throttle
        )
        return endpoint_id, route

    async def _first_packet(self, client: Side) -> tuple[wire.Startup, str | None, bool] | None:
        """The client's StartupMessage after any TLS negotiation; None for a cancel request."""
        tls = False
        server_name: str | None = None
        while True:
            length, code = struct.unpack("!II", await client.read_exactly(8))
            if length < 8 or length > wire.MAX_STARTUP:
                raise wire.ProtocolViolation("invalid length of startup packet")
            payload = await client.read_exactly(length - 8)
            if code == wire.SSL_REQUEST and not tls and length == 8:
                if self._server_tls is None:
                    client.write(b"N")
                    continue
                client.write(b"S")
                server_name = await self._start_tls(client)
                tls = True
                continue
            if code == wire.GSSENC_REQUEST and length == 8:
                client.write(b"N")
                continue
            if code == wire.CANCEL_REQUEST and length >= 12:
                pid = struct.unpack("!I", payload[:4])[0]
                await self._cancel(pid, payload[4:], client.peer_address())
                return None
            return wire.parse_startup(code, payload), server_name, tls

    async def _start_tls(self, client: Side) -> str | None:
        if self._server_tls is None:
            raise Closed
        loop = asyncio.get_running_loop()
        transport = await loop.start_tls(
            client.transport, client, self._server_tls, server_side=True
        )
        if transport is None:
            raise Closed
        client.transport = transport
        ssl_object = transport.get_extra_info("ssl_object")
        return getattr(ssl_object, "pgplane_sni", None)

    async def _open_compute(
        self, endpoint_id: str, startup: wire.Startup, route: Route
    ) -> tuple[Side, Target, bytes]:
        """Connect to the endpoint's compute and start the session; retry through a wake.

        Returns the compute connection and the compute's replies from AuthenticationOk to
        ReadyForQuery (or its refusal), for the client.
        """
        if route.secret is None:  # authenticate() refused it already; never wake for it
            raise scram.ScramError("password authentication failed")
        known, force = route.target, False
        last_problem = ""
        for _ in range(_CONNECT_ATTEMPTS):
            target = known or await self._computes.wake(endpoint_id, force=force)
            # The store's word is tried once; after a failed connection only a start will do.
            known, force = None, True
            try:
                compute = await self._dial(target)
            except (OSError, Closed) as exc:
                last_problem = f"compute unreachable: {exc}"
                continue
            try:
                reply = await log_in(compute, startup, route.secret)
            except NotReady as exc:
                compute.close()
                last_problem = str(exc)
                continue
            except (Closed, ConnectionError):
                compute.close()
                last_problem = "compute closed the connection"
                continue
            except BaseException:
                compute.close()
                raise
            return compute, target, reply
        raise RouteError(
            wire.CONNECTION_FAILURE, f"could not connect to endpoint {endpoint_id}: {last_problem}"
        )

    async def _dial(self, target: Target) -> Side:
        loop = asyncio.get_running_loop()
        if target.unix_socket is not None:
            transport, side = await loop.create_unix_connection(Side, str(target.unix_socket))
            if not _served_by_its_owner(transport, target.unix_socket):
                transport.close()
                raise ConnectionError("the compute's socket is not its own postmaster's")
        else:
            _, side = await loop.create_connection(Side, target.host, target.port)
        return side

    async def _cancel(self, pid: int, key: bytes, client: str) -> None:
        found = self._cancel_keys.get((pid, key))
        # As Neon's proxy, a cancel request from an address off the session's allow-list is
        # dropped; as Postgres, there is no answer either way.
        if found is None or not found[1].allows(client):
            return
        target = found[0]
        with contextlib.suppress(OSError):
            compute = await self._dial(target)
            compute.write(wire.cancel_request(pid, key))
            compute.close()


def _served_by_its_owner(transport: asyncio.BaseTransport, socket_path: Path) -> bool:
    """Whether the process listening at ``socket_path`` runs as the owner of its directory.

    The directory is the project's user's (the platform made it, in a directory of root's, so
    its owner is known); the socket in it is whatever that user put there. A tenant holding its
    compute's OS user could make it a link to another account's socket: the kernel tells who
    listens at the other end (SO_PEERCRED), and another account's postmaster is another user.
    """
    sock = transport.get_extra_info("socket")
    if sock is None:
        return False
    try:
        _pid, uid, _gid = struct.unpack("3i", sock.getsockopt(SOL_SOCKET, SO_PEERCRED, 12))
        owner: int = os.stat(socket_path.parent).st_uid
    except OSError:
        return False
    return bool(uid == owner)


def _remember_sni(ssl_object: object, server_name: str | None, _ctx: ssl.SSLContext) -> None:
    # The server side of an SSLObject does not keep the name; routing needs it after the
    # handshake. SSLObject instances take attributes.
    with contextlib.suppress(AttributeError):
        ssl_object.pgplane_sni = server_name  # type: ignore[attr-defined]


def _channel_binding(client: Side, default: bytes | None) -> bytes | None:
    # The hash of the certificate this client was shown: one made for its name, when the
    # context's SNI callback (pgplane.tls) chose one, else the proxy's.
    ssl_object = client.transport.get_extra_info("ssl_object")
    made: bytes | None = getattr(ssl_object, "pgplane_cert_hash", None)
    return made or default


def _refuse_point_in_time(startup: wire.Startup) -> None:
    if wire.asks_point_in_time(startup):
        raise RouteError(wire.FEATURE_NOT_SUPPORTED, POINT_IN_TIME_REFUSED)

"""The proxy: one listener for every endpoint, routing on the startup, then a byte pipe.

For each client: answer SSLRequest (TLS, with the SNI name kept), read the StartupMessage, find
the endpoint (SNI ``ep-….<proxy_host>`` or ``options=endpoint=ep-…``), authenticate the role with
SCRAM (channel binding included, see :mod:`pgplane.proxy.scram`) before anything is woken, ask
the platform for a running compute (waking it if needed), log in there as the same role, then
forward bytes both ways without parsing them. A role the platform does not know (created with
SQL) is authenticated by Postgres itself, through the pipe, without channel binding.

A compute that answers "starting up" / "shutting down", ends the login because it is going down,
or cannot be reached at all, is woken and tried again: a client arriving while its compute
suspends waits for the start that follows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, cast

from pgplane.connlimits import ConnectionGate
from pgplane.core import clock
from pgplane.proxy import scram, wire
from pgplane.proxy.activity import Activity, Session

log = logging.getLogger(__name__)

_HANDSHAKE_TIMEOUT = 30.0
_CONNECT_ATTEMPTS = 5
_HIGH_WATER = 256 * 1024
# A compute's refusals while the proxy logs a client in that mean "this compute is not up now",
# not "no": it is starting, or stopping (a stop that began after the dial ends the login with
# 57P01). The client waits for the start that follows, as one that arrived a moment later would.
_NOT_UP = frozenset({wire.CANNOT_CONNECT_NOW, wire.ADMIN_SHUTDOWN, wire.CRASH_SHUTDOWN})


@dataclass(frozen=True, slots=True)
class Target:
    """Where an endpoint's running compute accepts clients."""

    endpoint_id: str
    host: str
    port: int
    unix_socket: Path | None = None  # the socket file, for clients that did not ask for TLS


@dataclass(frozen=True, slots=True)
class Route:
    """What one store read tells the proxy about a connection to an endpoint."""

    password: str | None  # the role's, for SCRAM in the proxy; None: Postgres authenticates
    target: Target | None  # the compute, when the store says it runs; None: wake it


class RouteError(Exception):
    """The endpoint cannot be served; reaches the client as an ErrorResponse."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Computes(Protocol):
    """What the proxy asks of the platform."""

    async def route(self, endpoint_id: str, role: str) -> Route:
        """The role's password and the running compute, if any; RouteError for an unknown or
        disabled endpoint."""
        ...

    async def wake(self, endpoint_id: str, *, force: bool) -> Target:
        """Start the endpoint's compute (or join the start under way) and return it running.

        Without ``force`` a compute the store says runs is returned as it is; with it (the
        compute was found unreachable) a start runs regardless.
        """
        ...


class _Closed(Exception):
    pass


class _NotReady(Exception):
    """The compute answered "starting up" or "shutting down", or ended the login because it is
    going down: wake it and try again."""


async def _password_message(client: _Side) -> bytes:
    header = await client.read_exactly(5)
    (length,) = struct.unpack("!I", header[1:])
    if header[:1] != b"p" or not 4 <= length <= 1 << 16:
        raise wire.ProtocolViolation("expected a SASL response")
    return await client.read_exactly(length - 4)


class _Side(asyncio.Protocol):
    """One connection (client or compute): buffered reads while handshaking, then a pipe."""

    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._waiter: asyncio.Future[None] | None = None
        self._eof = False
        self._peer: asyncio.Transport | None = None
        self._session: Session | None = None
        self._sniff: Callable[[bytes], bool] | None = None
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # Set once the transport is there: a task started with the protocol may run first.
        self.made: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    @property
    def transport(self) -> asyncio.Transport:
        if self._transport is None:
            raise _Closed
        return self._transport

    @transport.setter
    def transport(self, transport: asyncio.Transport) -> None:
        self._transport = transport

    # asyncio.Protocol --------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Stream connections (TCP, unix, TLS) always give a full Transport.
        self._transport = cast(asyncio.Transport, transport)
        if not self.made.done():
            self.made.set_result(None)

    def data_received(self, data: bytes) -> None:
        peer = self._peer
        if peer is not None:
            peer.write(data)
            if self._session is not None:
                self._session.ticks += 1
            if self._sniff is not None and self._sniff(data):
                self._sniff = None
            return
        self._buffer += data
        self._wake()

    def eof_received(self) -> bool | None:
        self._eof = True
        self._wake()
        if self._peer is not None:
            self._peer.close()
        return None  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self._eof = True
        self._wake()
        if self._peer is not None:
            self._peer.close()
        if not self.lost.done():
            self.lost.set_result(None)

    def pause_writing(self) -> None:
        # Our transport's buffer is full: stop reading from whoever fills it.
        if self._peer is not None:
            self._peer.pause_reading()

    def resume_writing(self) -> None:
        if self._peer is not None:
            self._peer.resume_reading()

    # handshake ---------------------------------------------------------------------------
    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def read_exactly(self, n: int) -> bytes:
        while len(self._buffer) < n:
            if self._eof:
                raise _Closed
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        data = bytes(self._buffer[:n])
        del self._buffer[:n]
        return data

    async def read_message(self) -> tuple[bytes, bytes]:
        """One backend message: its type byte and payload."""
        header = await self.read_exactly(5)
        (length,) = struct.unpack("!I", header[1:])
        if length < 4 or length > 1 << 24:
            raise _Closed
        return header[:1], await self.read_exactly(length - 4)

    def write(self, data: bytes) -> None:
        if self._transport is not None:
            self._transport.write(data)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def pipe_to(
        self,
        peer: _Side,
        session: Session,
        sniff: Callable[[bytes], bool] | None = None,
    ) -> None:
        """From now on, forward everything this side receives to ``peer``."""
        self._peer = peer.transport
        self._session = session
        self._sniff = sniff
        self.transport.set_write_buffer_limits(high=_HIGH_WATER)
        if self._buffer:
            pending, self._buffer = bytes(self._buffer), bytearray()
            self.data_received(pending)
        if self._eof:
            peer.close()


class _KeySniffer:
    """Reads message frames of the backend's first replies until its BackendKeyData."""

    def __init__(self, found: Callable[[int, bytes], None]) -> None:
        self._buffer = b""
        self._found = found

    def __call__(self, data: bytes) -> bool:
        self._buffer += data
        while len(self._buffer) >= 5:
            kind = self._buffer[:1]
            (length,) = struct.unpack("!I", self._buffer[1:5])
            if kind == b"K":
                if len(self._buffer) < 1 + length:
                    return False
                (pid,) = struct.unpack("!I", self._buffer[5:9])
                self._found(pid, self._buffer[9 : 1 + length])
                return True
            if kind in (b"Z", b"E") or length > 1 << 20:
                return True  # ready (or failed) without a key: nothing to cancel
            if len(self._buffer) < 1 + length:
                return False
            self._buffer = self._buffer[1 + length :]
        return False


class Proxy:
    def __init__(
        self,
        *,
        computes: Computes,
        activity: Activity,
        proxy_host: str,
        server_tls: ssl.SSLContext | None,
        cert_hash: bytes | None,
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
        self._cancel_keys: dict[tuple[int, bytes], Target] = {}
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        if server_tls is not None:
            server_tls.sni_callback = _remember_sni

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

    def _accept(self) -> _Side:
        side = _Side()
        task = asyncio.get_running_loop().create_task(self._serve(side))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return side

    async def _serve(self, client: _Side) -> None:
        # Past the caps a client is told so, as Postgres tells it (53300), before a byte of it
        # is read, and closed.
        await client.made
        peer = client.transport.get_extra_info("peername")
        admission = self._gate.admit(peer[0] if isinstance(peer, tuple) else None)
        if admission is None:
            message = self._gate.refusal_message()
            client.write(wire.error_response(wire.TOO_MANY_CONNECTIONS, message))
            client.close()
            return
        try:
            await self._serve_admitted(client)
        finally:
            admission.release()

    async def _serve_admitted(self, client: _Side) -> None:
        compute: _Side | None = None
        try:
            async with asyncio.timeout(self._handshake_timeout or None):
                first = await self._first_packet(client)
                if first is None:
                    return
                startup, server_name, tls = first
                endpoint_id = wire.endpoint_from_sni(server_name, self._proxy_host)
                option_endpoint, startup = wire.take_endpoint_option(startup)
                endpoint_id = self._require_endpoint(endpoint_id or option_endpoint)
                user = startup.params["user"]
                route = await self._computes.route(endpoint_id, user)
                if route.password is not None:
                    await self._authenticate(client, user, route.password, tls)
            # Not under the handshake's time limit: a wake (or a reattach before it) takes as
            # long as it takes, and ends in a compute or an error the client is told.
            compute, target, reply = await self._open_compute(endpoint_id, startup, route)
            session = self._activity.open(endpoint_id, clock.now_us())
            keys: list[tuple[int, bytes]] = []
            try:
                client.write(reply)

                def found(pid: int, key: bytes) -> None:
                    keys.append((pid, key))
                    self._cancel_keys[pid, key] = target

                # The reply may hold the cancel key already (the proxy logged in up to
                # ReadyForQuery); if not, it follows through the pipe.
                sniffer = _KeySniffer(found)
                compute.pipe_to(client, session, None if sniffer(reply) else sniffer)
                client.pipe_to(compute, session)
                await asyncio.wait([client.lost, compute.lost], return_when="FIRST_COMPLETED")
            finally:
                self._activity.close(session, clock.now_us())
                for k in keys:
                    self._cancel_keys.pop(k, None)
        except RouteError as exc:
            client.write(wire.error_response(exc.code, exc.message))
        except scram.ScramError as exc:
            client.write(wire.error_response(wire.INVALID_PASSWORD, str(exc)))
        except wire.ProtocolViolation as exc:
            client.write(wire.error_response(wire.PROTOCOL_VIOLATION, str(exc)))
        except (_Closed, ConnectionError, ssl.SSLError, TimeoutError):
            pass
        except Exception:
            log.exception("proxy connection failed")
            client.write(wire.error_response(wire.CONNECTION_FAILURE, "internal proxy error"))
        finally:
            client.close()
            if compute is not None:
                compute.close()

    def _require_endpoint(self, endpoint_id: str | None) -> str:
        if endpoint_id is None:
            raise RouteError(
                wire.CONNECTION_REJECTED,
                f"endpoint not specified: connect to ep-<id>.{self._proxy_host} (TLS with SNI)"
                " or pass options=endpoint=<id>, as in the connection URI the API returns",
            )
        return endpoint_id

    async def _first_packet(self, client: _Side) -> tuple[wire.Startup, str | None, bool] | None:
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
                await self._cancel(struct.unpack("!I", payload[:4])[0], payload[4:])
                return None
            return wire.parse_startup(code, payload), server_name, tls

    async def _start_tls(self, client: _Side) -> str | None:
        if self._server_tls is None:
            raise _Closed
        loop = asyncio.get_running_loop()
        transport = await loop.start_tls(
            client.transport, client, self._server_tls, server_side=True
        )
        if transport is None:
            raise _Closed
        client.transport = transport
        ssl_object = transport.get_extra_info("ssl_object")
        return getattr(ssl_object, "pgplane_sni", None)

    async def _authenticate(self, client: _Side, user: str, password: str, tls: bool) -> None:
        """SCRAM with the client, up to (not including) AuthenticationOk; ScramError if not."""
        exchange = scram.ServerExchange(password, self._cert_hash if tls else None)
        offer = b"".join(m.encode() + b"\0" for m in exchange.mechanisms()) + b"\0"
        client.write(wire.auth_message(wire.AUTH_SASL, offer))
        mechanism, first = wire.parse_sasl_initial(await _password_message(client))
        server_first = exchange.first(mechanism, first)
        client.write(wire.auth_message(wire.AUTH_SASL_CONTINUE, server_first.encode()))
        try:
            final = exchange.final((await _password_message(client)).decode())
        except scram.ScramError as exc:
            if str(exc) == "password authentication failed":
                raise scram.ScramError(
                    f'password authentication failed for user "{user}"'
                ) from None
            raise
        client.write(wire.auth_message(wire.AUTH_SASL_FINAL, final.encode()))

    async def _open_compute(
        self, endpoint_id: str, startup: wire.Startup, route: Route
    ) -> tuple[_Side, Target, bytes]:
        """Connect to the endpoint's compute and start the session; retry through a wake.

        Returns the compute connection and what to send the client next: with a password, the
        compute's replies from AuthenticationOk to ReadyForQuery (the proxy logged in); without,
        its authentication request.
        """
        known, force = route.target, False
        last_problem = ""
        for _ in range(_CONNECT_ATTEMPTS):
            target = known or await self._computes.wake(endpoint_id, force=force)
            # The store's word is tried once; after a failed connection only a start will do.
            known, force = None, True
            try:
                compute = await self._dial(target)
            except (OSError, _Closed) as exc:
                last_problem = f"compute unreachable: {exc}"
                continue
            try:
                compute.write(startup.encode())
                reply = await self._login(compute, route.password)
            except _NotReady as exc:
                compute.close()
                last_problem = str(exc)
                continue
            except (_Closed, ConnectionError):
                compute.close()
                last_problem = "compute closed the connection"
                continue
            return compute, target, reply
        raise RouteError(
            wire.CONNECTION_FAILURE, f"could not connect to endpoint {endpoint_id}: {last_problem}"
        )

    async def _login(self, compute: _Side, password: str | None) -> bytes:
        """Read the compute's replies to the startup; log in with ``password`` when given.

        Logged in, the replies are held up to ReadyForQuery: until then the backend is still
        starting, and a stop can end it (57P01); the client should wait for the next start, not
        be told so.
        """
        exchange = scram.ClientExchange(password) if password is not None else None
        reply = b""
        logged_in = False
        while True:
            kind, payload = await compute.read_message()
            message = kind + struct.pack("!I", len(payload) + 4) + payload
            if kind == b"E":
                fields = wire.error_fields(payload)
                if fields.get("C") in _NOT_UP:
                    raise _NotReady(fields.get("M", "compute not ready"))
                return reply + message  # the client sees Postgres' own refusal
            if logged_in or kind != b"R":
                # The session's parameters and cancel key, or a NegotiateProtocolVersion before
                # authentication: the client's to read.
                reply += message
                if kind == b"Z":
                    return reply
                continue
            if exchange is None or password is None:
                return reply + message  # Postgres authenticates the client itself
            (code,) = struct.unpack("!I", payload[:4])
            if code == wire.AUTH_OK:
                reply += message
                logged_in = True
            elif code == wire.AUTH_SASL:
                first = exchange.first().encode()
                compute.write(wire.sasl_initial(scram.MECHANISM, first))
            elif code == wire.AUTH_SASL_CONTINUE:
                compute.write(wire.password_message(exchange.final(payload[4:].decode()).encode()))
            elif code == wire.AUTH_SASL_FINAL:
                exchange.check(payload[4:].decode())
            elif code == wire.AUTH_CLEARTEXT:
                compute.write(wire.password_message(password.encode() + b"\0"))
            else:
                raise scram.ScramError(f"the compute asked for unsupported authentication {code}")

    async def _dial(self, target: Target) -> _Side:
        loop = asyncio.get_running_loop()
        if target.unix_socket is not None:
            _, side = await loop.create_unix_connection(_Side, str(target.unix_socket))
        else:
            _, side = await loop.create_connection(_Side, target.host, target.port)
        return side

    async def _cancel(self, pid: int, key: bytes) -> None:
        target = self._cancel_keys.get((pid, key))
        if target is None:
            return  # as Postgres: no answer either way
        with contextlib.suppress(OSError):
            compute = await self._dial(target)
            compute.write(wire.cancel_request(pid, key))
            compute.close()


def _remember_sni(ssl_object: object, server_name: str | None, _ctx: ssl.SSLContext) -> None:
    # The server side of an SSLObject does not keep the name; routing needs it after the
    # handshake. SSLObject instances take attributes.
    with contextlib.suppress(AttributeError):
        ssl_object.pgplane_sni = server_name  # type: ignore[attr-defined]

"""The proxy: one listener for every endpoint and every door.

Each accepted connection is first counted against the connection caps (past them it is told so,
as Postgres tells it, 53300, before a byte of it is read, and closed). Then what the client sends
first picks its door (:mod:`pgplane.proxy.doors.sniff`), read without taking it off the socket:

- a Postgres first packet: the Postgres door (SSLRequest answered with TLS, the SNI name kept);
- a TLS ClientHello: the proxy's TLS, then ALPN ``postgresql`` (PostgreSQL 17's direct TLS) is
  the Postgres door, ``http/1.1`` or none is HTTP;
- an HTTP request line: HTTP, plain.

HTTP serves ``GET /v2`` as a WebSocket carrying the Postgres protocol, ``/sql`` through the
:class:`~pgplane.proxy.doors.router.SqlHandler` plugged in, and a JSON 404 for anything else.
Every door then goes through the same steps (:mod:`pgplane.proxy.session`): the endpoint found
(SNI, ``Host``, ``options=endpoint=``), the IP allow-list checked before the password is asked
for, the password proven (throttled when wrong) before anything wakes, all within one handshake
deadline from the moment the connection was accepted. A compute on another node of the platform
is reached through that node (:mod:`pgplane.proxy.forward`), once this node's walls are passed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl

from pgplane.connlimits import ConnectionGate, Refusal
from pgplane.proxy import wire
from pgplane.proxy.activity import Activity
from pgplane.proxy.doors import sniff, websocket
from pgplane.proxy.doors.http import (
    BodyBudget,
    HttpLimits,
    HttpReply,
    HttpRequest,
    Upgrade,
    raw_reply,
    serve_http,
)
from pgplane.proxy.doors.postgres import PostgresHello, remember_sni, server_name
from pgplane.proxy.doors.router import Router, SqlHandler
from pgplane.proxy.forward import Forwarder
from pgplane.proxy.listener import Listener
from pgplane.proxy.pipe import Side
from pgplane.proxy.seam import Computes
from pgplane.proxy.session import POINT_IN_TIME_REFUSED, Sessions
from pgplane.proxy.throttle import LoginThrottle

__all__ = ["ALPN", "POINT_IN_TIME_REFUSED", "Proxy"]

# The doors a client starting with TLS may ask for: every TLS context the proxy serves with
# (pgplane.tls makes one per name, too) offers these.
ALPN = (sniff.ALPN_POSTGRES, sniff.ALPN_HTTP)

log = logging.getLogger(__name__)

_HANDSHAKE_TIMEOUT = 30.0
_REFUSAL_GRACE = 0.5  # seconds a refused client has to show which door it came for
_REFUSALS_AT_ONCE = 64


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
        sql: SqlHandler | None = None,
        http_limits: HttpLimits | None = None,
        forwarder: Forwarder | None = None,
    ) -> None:
        self._gate = gate or ConnectionGate(per_address=0, total=0)
        self._handshake_timeout = handshake_timeout
        self._proxy_host = proxy_host
        self._server_tls = server_tls
        self._cert_hash = cert_hash
        self._sessions = Sessions(
            computes=computes,
            activity=activity,
            proxy_host=proxy_host,
            throttle=throttle or LoginThrottle(),
            handshake_timeout=handshake_timeout,
            forwarder=forwarder,
        )
        self._sql = sql
        self._http_limits = http_limits or HttpLimits(request_seconds=handshake_timeout)
        self._body_budget = BodyBudget()
        self._listener = Listener(self._serve)
        self._refusing = 0  # refused clients given a moment to show their door
        if server_tls is not None:
            if server_tls.sni_callback is None:  # pgplane.tls's keeps the name, and more
                server_tls.sni_callback = remember_sni
            # Offered to a client that starts with TLS: which door it wants. A client that names
            # neither (or after an SSLRequest, where the door is chosen already) is not refused.
            server_tls.set_alpn_protocols(list(ALPN))

    @property
    def sessions(self) -> Sessions:
        """The steps every door shares, for a handler plugged in (``/sql``) to log in with."""
        return self._sessions

    def plug_sql(self, sql: SqlHandler) -> None:
        """Serve ``/sql`` with ``sql`` from now on."""
        self._sql = sql

    async def start(self, host: str, port: int) -> list[tuple[str, int]]:
        return await self._listener.start(host, port)

    def adopt(self, sockets: list[socket.socket]) -> list[tuple[str, int]]:
        """Accept on ``sockets``, bound already (``pgplane.listening``); their addresses."""
        return self._listener.adopt(sockets)

    async def close(self) -> None:
        await self._listener.close()

    async def _serve(self, sock: socket.socket, address: object) -> None:
        host = address[0] if isinstance(address, tuple) and address else ""
        admission = self._gate.admit(str(host) or None)
        if admission is None:
            await self._refuse(sock)
            return
        try:
            await self._open_door(sock)
        finally:
            admission.release()

    async def _refuse(self, sock: socket.socket) -> None:
        """Tell a client past the caps so in its door's words, and close it.

        The caps protect descriptors, so a refused client is given little: a moment to show
        its door (a Postgres client sends its first packet at once), and only while few others
        are being refused; otherwise, or when it says nothing, it is told as Postgres tells it
        (53300). An HTTP client gets the JSON error (429 for its address' share, 503 for the
        proxy's), a TLS client only the close: answering it would take a TLS handshake.
        """
        try:
            await self._tell_refused(sock)
        finally:
            sock.close()

    async def _tell_refused(self, sock: socket.socket) -> None:
        message = self._gate.refusal_message()  # read now: others may be refused meanwhile
        status = 429 if self._gate.last_refusal is Refusal.PER_ADDRESS else 503
        first = b""
        if self._refusing < _REFUSALS_AT_ONCE:
            self._refusing += 1
            try:
                with contextlib.suppress(OSError, TimeoutError):
                    async with asyncio.timeout(_REFUSAL_GRACE):
                        first = await sniff.peek(sock)
            finally:
                self._refusing -= 1
        door = sniff.classify(first)
        answer = wire.error_response(wire.TOO_MANY_CONNECTIONS, message)
        if door is sniff.Door.HTTP:
            answer = raw_reply(HttpReply.error(status, message, headers=[("Retry-After", "1")]))
        elif door is sniff.Door.TLS:
            answer = b""
        with contextlib.suppress(OSError):
            # What it sent is read first: closed unread, the kernel would reset the connection,
            # and the client could lose the answer.
            if first:
                sock.recv(65536)
            sock.send(answer)

    async def _open_door(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._handshake_timeout if self._handshake_timeout else None
        made: list[Side] = []

        def side() -> Side:
            # The loop's answer names a TLS layer's protocol, not this one (uvloop): kept here.
            made.append(Side())
            return made[-1]

        try:
            async with asyncio.timeout_at(deadline):
                door = sniff.classify(await sniff.peek(sock))
                tls = self._server_tls if door is sniff.Door.TLS else None
                await loop.connect_accepted_socket(side, sock, ssl=tls)
        except (OSError, TimeoutError, ssl.SSLError):
            sock.close()
            return
        except BaseException:  # cancelled (the proxy closes): the socket is still ours
            sock.close()
            raise
        client = made[0]
        try:
            await self._enter(client, door, tls is not None, deadline)
        except Exception:
            log.exception("proxy connection failed")
            client.close()

    async def _enter(
        self, client: Side, door: sniff.Door, tls: bool, deadline: float | None
    ) -> None:
        if door is sniff.Door.POSTGRES:
            await self._postgres(client, deadline)
            return
        name = server_name(client.transport) if tls else None
        alpn = _alpn(client.transport) if tls else None
        if alpn == sniff.ALPN_POSTGRES:
            await self._postgres(client, deadline, tls=True, name=name)
            return
        router = Router(websocket=lambda r: self._websocket(client, r), sql=self._sql)
        await serve_http(
            client,
            router,
            limits=self._http_limits,
            budget=self._body_budget,
            tls=tls,
            server_name=name,
            head_check=router.check_head,
        )

    async def _postgres(
        self, client: Side, deadline: float | None, *, tls: bool = False, name: str | None = None
    ) -> None:
        hello = PostgresHello(
            client,
            proxy_host=self._proxy_host,
            server_tls=self._server_tls,
            cert_hash=self._cert_hash,
            cancel=self._sessions.cancel,
            server_name=name,
            tls=tls,
        )
        await self._sessions.serve(client, hello, deadline=deadline)

    async def _websocket(self, client: Side, request: HttpRequest) -> HttpReply | Upgrade:
        accepted = websocket.handshake(request)
        if isinstance(accepted, HttpReply):
            return accepted
        ws, response = accepted
        host_endpoint, address_endpoint = websocket.endpoints(request, self._proxy_host)

        async def run(leftover: bytes) -> None:
            side = websocket.WebSocketSide.take_over(client, ws, response, leftover)
            hello = PostgresHello(
                side,
                proxy_host=self._proxy_host,
                server_tls=None,  # no SSLRequest inside: TLS is the WebSocket's
                cert_hash=None,
                cancel=self._sessions.cancel,
                cleartext=True,
                endpoint=host_endpoint,
                fallback=address_endpoint,
            )
            loop = asyncio.get_running_loop()
            timeout = self._handshake_timeout
            await self._sessions.serve(
                side, hello, deadline=loop.time() + timeout if timeout else None
            )

        return Upgrade(run)


def _alpn(transport: asyncio.BaseTransport) -> str | None:
    ssl_object = transport.get_extra_info("ssl_object")
    return ssl_object.selected_alpn_protocol() if ssl_object is not None else None

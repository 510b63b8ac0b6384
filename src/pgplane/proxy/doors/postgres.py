"""The Postgres door: a client's first packet, after any TLS negotiation it asks for.

SSLRequest is answered ``S`` and TLS started on the connection (the SNI name kept for routing);
GSSENCRequest is declined; a CancelRequest is served at once. A client that came in on direct
TLS (ALPN ``postgresql``) sends its StartupMessage straight away.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import struct
from collections.abc import Awaitable, Callable

from pgplane.proxy import wire
from pgplane.proxy.pipe import Closed, Side
from pgplane.proxy.session import Startup

Cancel = Callable[[int, bytes, str], Awaitable[None]]


class PostgresHello:
    """Reads one client's first packet for :meth:`pgplane.proxy.session.Sessions.serve`."""

    def __init__(
        self,
        client: Side,
        *,
        proxy_host: str,
        server_tls: ssl.SSLContext | None,
        cert_hash: bytes | None,
        cancel: Cancel,
        server_name: str | None = None,
        tls: bool = False,
        cleartext: bool = False,
        endpoint: str | None = None,
        fallback: str | None = None,
    ) -> None:
        self._client = client
        self._proxy_host = proxy_host
        self._server_tls = server_tls
        self._cert_hash = cert_hash
        self._cancel = cancel
        self._server_name = server_name
        self._tls = tls
        self._cleartext = cleartext
        self._endpoint = endpoint
        self._fallback = fallback

    async def __call__(self) -> Startup | None:
        """The client's StartupMessage after any TLS negotiation; None for a cancel request."""
        client = self._client
        while True:
            length, code = struct.unpack("!II", await client.read_exactly(8))
            if length < 8 or length > wire.MAX_STARTUP:
                raise wire.ProtocolViolation("invalid length of startup packet")
            payload = await client.read_exactly(length - 8)
            if code == wire.SSL_REQUEST and not self._tls and length == 8:
                if self._server_tls is None:
                    client.write(b"N")
                    continue
                client.write(b"S")
                self._server_name = await self._start_tls()
                self._tls = True
                continue
            if code == wire.GSSENC_REQUEST and length == 8:
                client.write(b"N")
                continue
            if code == wire.CANCEL_REQUEST and length >= 12:
                pid = struct.unpack("!I", payload[:4])[0]
                await self._cancel(pid, payload[4:], client.peer_address())
                return None
            return Startup(
                startup=wire.parse_startup(code, payload),
                endpoint=self._endpoint
                or wire.endpoint_from_sni(self._server_name, self._proxy_host),
                fallback=self._fallback,
                cert_hash=channel_binding(client, self._cert_hash) if self._tls else None,
                cleartext=self._cleartext,
            )

    async def _start_tls(self) -> str | None:
        if self._server_tls is None:
            raise Closed
        client = self._client
        loop = asyncio.get_running_loop()
        transport = await loop.start_tls(
            client.transport, client, self._server_tls, server_side=True
        )
        if transport is None:
            raise Closed
        client.transport = transport
        return server_name(transport)


def server_name(transport: asyncio.BaseTransport) -> str | None:
    """The SNI name a TLS client sent (see :func:`remember_sni`)."""
    ssl_object = transport.get_extra_info("ssl_object")
    return getattr(ssl_object, "pgplane_sni", None)


def remember_sni(ssl_object: object, server_name: str | None, _ctx: ssl.SSLContext) -> None:
    # The server side of an SSLObject does not keep the name; routing needs it after the
    # handshake. SSLObject instances take attributes.
    with contextlib.suppress(AttributeError):
        ssl_object.pgplane_sni = server_name  # type: ignore[attr-defined]


def channel_binding(client: Side, default: bytes | None) -> bytes | None:
    """The hash of the certificate this client was shown: one made for its name, when the
    context's SNI callback (:mod:`pgplane.tls`) chose one, else the proxy's."""
    ssl_object = client.transport.get_extra_info("ssl_object")
    made: bytes | None = getattr(ssl_object, "pgplane_cert_hash", None)
    return made or default
